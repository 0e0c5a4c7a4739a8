import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the rows of a (batch_size, dim) input: both sizes are free (only get_inputs reads them)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 100


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
