"""Quickstart task (KernelBench format): a small Linear followed by GELU.

Small enough to evolve on a laptop CPU under the Triton interpreter; the template expert covers
it with one fused matmul+GELU kernel.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


batch_size = 64
in_features = 256
out_features = 256


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
