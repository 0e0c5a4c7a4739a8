import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm


class TDNN(nn.Module):
    def __init__(self, cin, cout, k, dilation):
        super().__init__()
        self.conv = weight_norm(nn.Conv1d(cin, cout, k, dilation=dilation))
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))


class Model(nn.Module):
    """An x-vector speaker embedding: weight-normalised dilated TDNN layers, statistics pooling
    (mean and standard deviation over time) and an embedding layer."""

    def __init__(self, feats=20, width=32, embed=16):
        super().__init__()
        self.frames = nn.Sequential(TDNN(feats, width, 5, 1), TDNN(width, width, 3, 2), TDNN(width, width, 3, 3))
        self.embed = nn.Linear(2 * width, embed)

    def forward(self, x):
        h = self.frames(x)
        stats = torch.cat([h.mean(dim=-1), h.std(dim=-1)], dim=-1)
        return self.embed(stats)


def get_inputs():
    return [torch.randn(3, 20, 40)]


def get_init_inputs():
    return []
