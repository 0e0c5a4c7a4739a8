# Honest: a helper function, a module-level guarded import, and an identical copy of the
# reference's inputs (harmless: the evaluator always takes inputs from the reference).
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

try:
    import numpy as np  # optional, unused on the forward path
except ImportError:
    np = None


@triton.jit
def _fused(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(s > 0, s, 0.0), mask=mask)


def fused_add_relu(x, y):
    x = x.contiguous()
    y = y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    block = 2 ** int(math.log2(512))
    _fused[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return fused_add_relu(x, y)


N = 8192


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
