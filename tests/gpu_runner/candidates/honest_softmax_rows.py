# Honest: row softmax in one Triton program per row with the max pass: exp(x - max(x)) / sum, stable for inputs of any scale (the counterpart of hostile_softmax_no_max).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows_kernel(x_ptr, out_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(x), 0.0)
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        M, N = x.shape
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        softmax_rows_kernel[(M,)](x, out, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
        return out
