"""Activation chain with exponentials: ELU, SELU, Softplus, Hardswish, Hardsigmoid, clamp."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.elu = nn.ELU(alpha=alpha)

    def forward(self, x):
        x = self.elu(x) + torch.selu(x)
        x = F.softplus(x) - F.hardswish(x)
        return torch.clamp(F.hardsigmoid(x) * 2.0, min=0.1, max=1.5)


batch_size = 128
dim = 16384
alpha = 0.8


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [alpha]
