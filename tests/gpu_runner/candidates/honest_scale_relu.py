# relu(2x) into a fresh output; the input is left as it was.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * 2.0
    tl.store(o_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        k[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
