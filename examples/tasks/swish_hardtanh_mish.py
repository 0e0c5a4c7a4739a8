"""Activation chain: Swish, Hardtanh, Mish and LeakyReLU in sequence."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mish = nn.Mish()

    def forward(self, x):
        x = x * torch.sigmoid(x)
        x = F.hardtanh(x, min_val=-0.5, max_val=2.0)
        x = self.mish(x)
        return F.leaky_relu(x, negative_slope=0.1)


batch_size = 128
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
