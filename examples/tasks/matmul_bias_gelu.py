"""Square matmul with a bias and a tanh-GELU epilogue."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n) * 0.1)

    def forward(self, a, b):
        return F.gelu(torch.matmul(a, b) + self.bias, approximate="tanh")


N = 2048


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return [N]
