import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x @ W^T + b) with 256 MiB of weights and a constructor that reads them on the host
    (``.numpy()`` fails on a GPU tensor): the evaluator builds it on the CPU, as a small model."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.largest = float(abs(self.linear.weight.detach().numpy()).max())

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = 64
in_features = 8192
out_features = 8192


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
