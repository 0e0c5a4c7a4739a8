# Keeps the reference's own nn.Linear in PyTorch and applies the ReLU in its own Triton kernel:
# honest under --torch-ops reference, a torch-compute rejection under forbid.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        h = self.linear(x)
        out = torch.empty_like(h)
        n = h.numel()
        relu_kernel[(triton.cdiv(n, 256),)](h, out, n, BLOCK=256)
        return out
