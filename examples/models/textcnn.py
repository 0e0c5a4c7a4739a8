import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, vocab=1000, dim=32, filters=16, sizes=(3, 4, 5), classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.convs = nn.ModuleList([nn.Conv1d(dim, filters, k) for k in sizes])
        self.fc = nn.Linear(filters * len(sizes), classes)

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)
        pooled = [F.relu(conv(x)).max(dim=2).values for conv in self.convs]
        return self.fc(torch.cat(pooled, dim=1))


def get_inputs():
    return [torch.randint(0, 1000, (8, 50))]


def get_init_inputs():
    return []
