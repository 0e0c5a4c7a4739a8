import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab=100, emb=32, hidden=48, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.fc(out[:, -1, :])


batch_size = 4
seq_len = 12


def get_inputs():
    return [torch.randint(0, 100, (batch_size, seq_len))]


def get_init_inputs():
    return [100, 32, 48, 5]
