import os

import torch
import torch.nn as nn

# As matmul_tf32_flag (TF32 matmuls asked for, done by hand on the CPU), but no two runs of the
# forward give the same bits, as cuDNN's transposed convolutions do when they sum with atomics: a
# random half of the outputs moves by one unit in the last place (a relative spread near 1e-8,
# far below the 1e-4 TF32 costs). NOISE > 0 instead moves every output by that relative amount,
# up or down at random: a spread no longer negligible beside TF32's error.
torch.backends.cuda.matmul.allow_tf32 = True
NOISE = 1e-5


def _tf32(x):
    if x.dtype != torch.float32 or not torch.backends.cuda.matmul.allow_tf32:
        return x
    return ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


def _jitter(out):
    # its own generator, seeded afresh from the OS: the task's seeded draws are left alone
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    if NOISE:
        sign = torch.randint(0, 2, out.shape, generator=gen).to(out.dtype) * 2 - 1
        return out * (1 + NOISE * sign)
    moved = torch.rand(out.shape, generator=gen) < 0.5
    return torch.where(moved, torch.nextafter(out, torch.full_like(out, float("inf"))), out)


class Model(nn.Module):
    """a @ b, at TF32 where the flag says so, with run-to-run jitter."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _jitter(_tf32(a) @ _tf32(b))


M = K = N = 128


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
