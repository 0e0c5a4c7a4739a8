# Honest: relu(x + y) in two kernels: the sum in one launch of a template-named kernel (_kf_pw0), the relu in two launches of another, each over half the elements (what the per-kernel timer must tell apart).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kf_pw0(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def relu_half(src_ptr, out_ptr, start, stop, BLOCK: tl.constexpr):
    offs = start + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < stop
    tl.store(out_ptr + offs, tl.maximum(tl.load(src_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        total = torch.empty_like(x)
        out = torch.empty_like(x)
        n = x.numel()
        _kf_pw0[(triton.cdiv(n, 1024),)](x, y, total, n, BLOCK=1024)
        half = n // 2
        for start, stop in ((0, half), (half, n)):
            relu_half[(triton.cdiv(stop - start, 1024),)](total, out, start, stop, BLOCK=1024)
        return out
