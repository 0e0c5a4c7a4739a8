# Honest: relu(x + y) in 16 launches of one small kernel, each over a sixteenth of the elements (host-bound on a GPU: what the timing's cross-check must accept from a candidate whose Python launches cost more than its kernels).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_relu_part(x_ptr, y_ptr, out_ptr, start, stop, BLOCK: tl.constexpr):
    offs = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < stop
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        step = triton.cdiv(n, 16)
        for start in range(0, n, step):
            stop = min(n, start + step)
            add_relu_part[(triton.cdiv(stop - start, 1024),)](x, y, out, start, stop, BLOCK=1024)
        return out
