import torch
import torch.nn as nn


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, : -self.chomp_size].contiguous()


class TemporalBlock(nn.Module):
    def __init__(self, n_in, n_out, kernel_size, dilation):
        super().__init__()
        padding = (kernel_size - 1) * dilation
        self.net = nn.Sequential(
            nn.Conv1d(n_in, n_out, kernel_size, padding=padding, dilation=dilation),
            Chomp1d(padding),
            nn.ReLU(),
            nn.Conv1d(n_out, n_out, kernel_size, padding=padding, dilation=dilation),
            Chomp1d(padding),
            nn.ReLU(),
        )
        self.downsample = nn.Conv1d(n_in, n_out, 1) if n_in != n_out else None
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.net(x)
        res = x if self.downsample is None else self.downsample(x)
        return self.relu(out + res)


class Model(nn.Module):
    def __init__(self, n_inputs=4, channels=(16, 16, 32), kernel_size=3):
        super().__init__()
        layers = []
        for i, c in enumerate(channels):
            layers.append(TemporalBlock(n_inputs if i == 0 else channels[i - 1], c, kernel_size, 2**i))
        self.network = nn.Sequential(*layers)
        self.linear = nn.Linear(channels[-1], 5)

    def forward(self, x):
        y = self.network(x)
        return self.linear(y[:, :, -1])


def get_inputs():
    return [torch.randn(3, 4, 40)]


def get_init_inputs():
    return []
