import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in=8, hidden=16, steps=5):
        super().__init__()
        self.cell = nn.LSTMCell(n_in, hidden)
        self.fc = nn.Linear(hidden, 3)
        self.steps = steps
        self.hidden = hidden

    def forward(self, x):
        h = torch.zeros(x.size(0), self.hidden, device=x.device, dtype=x.dtype)
        c = torch.zeros(x.size(0), self.hidden, device=x.device, dtype=x.dtype)
        for t in range(self.steps):
            h, c = self.cell(x[:, t], (h, c))
        return self.fc(h)


def get_inputs():
    return [torch.randn(4, 5, 8)]


def get_init_inputs():
    return []
