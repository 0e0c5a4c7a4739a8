import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)


class Model(nn.Module):
    """A reference that is itself one Triton kernel: the A/A test's baseline."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        if x.is_meta:  # measured on meta tensors (sizes, held-out shapes): its output's shape alone
            return out
        n = x.numel()
        add_relu_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out


N = 1 << 24


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
