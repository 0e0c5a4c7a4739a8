# Honest: two kernels through a persistent scratch buffer (x + y kept between calls as an intermediate, reused every call), with a fresh output tensor each call: workspace reuse that no output aliases (the counterpart of hostile_persistent_workspace).
import torch
import torch.nn as nn
import triton
import triton.language as tl

_scratch = {}


@triton.jit
def add_kernel(x_ptr, y_ptr, tmp_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(tmp_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def relu_kernel(tmp_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(tmp_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        n = x.numel()
        key = (x.device, x.dtype, n)
        if key not in _scratch:
            _scratch[key] = torch.empty(n, device=x.device, dtype=x.dtype)
        tmp = _scratch[key]
        out = torch.empty_like(x)
        grid = (triton.cdiv(n, 1024),)
        add_kernel[grid](x, y, tmp, n, BLOCK=1024)
        relu_kernel[grid](tmp, out, n, BLOCK=1024)
        return out
