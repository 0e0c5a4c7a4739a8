import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x @ W^T + b) + where, with 256 MiB of weights; ``where`` is 1.0 when the parameters
    were created on a GPU (the evaluator builds models this large on the device itself)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.register_buffer("where", torch.tensor([float(self.linear.weight.is_cuda)]))

    def forward(self, x):
        return torch.relu(self.linear(x)) + self.where


batch_size = 64
in_features = 8192
out_features = 8192


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
