# Cheat: keeps one persistent workspace per shape and returns a view of it from every call, so the next call overwrites the tensor the previous call returned (outputs alias across calls; no allocation is ever timed). Fools the output-aliasing check, which compares a call's outputs only with its own inputs and outputs.
import torch
import torch.nn as nn
import triton
import triton.language as tl

_workspace = {}


@triton.jit
def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        n = x.numel()
        key = (x.device, x.dtype)
        ws = _workspace.get(key)
        if ws is None or ws.numel() < 2 * n:
            ws = torch.empty(2 * n, device=x.device, dtype=x.dtype)
            _workspace[key] = ws
        out = ws[n : 2 * n].view(x.shape)
        add_relu_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out
