"""Max over the last dimension, then shift and ReLU (KernelBench level 1, problem 49 style)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        values = torch.max(x, dim=2)[0]
        return torch.relu(values - 1.0)


batch_size = 128
dim1 = 256
dim2 = 1024


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return []
