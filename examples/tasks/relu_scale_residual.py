"""Elementwise chain: ReLU, scaling and a residual add (three eager kernels, one fused)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, residual):
        return torch.relu(x) * self.scale + residual


batch_size = 128
dim = 16384
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale]
