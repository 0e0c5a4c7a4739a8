import torch
import torch.nn as nn

# The TF32 reference's model with the flag at PyTorch's own default (off): IEEE float32 matmuls.
torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's own default


def _tf32(x):
    if x.dtype != torch.float32 or not torch.backends.cuda.matmul.allow_tf32:
        return x
    return ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


class Model(nn.Module):
    """a @ b, at TF32 where the flag says so."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _tf32(a) @ _tf32(b)


M = K = N = 128


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
