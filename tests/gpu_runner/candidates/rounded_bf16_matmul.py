import torch
import torch.nn as nn
import triton
import triton.language as tl

# A matmul whose operands are rounded to bf16 first (round to nearest), accumulated in float32.


@triton.jit
def mm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    HALF: tl.constexpr,
    MASK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + rn[None, :], mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        a = ((a.to(tl.int32, bitcast=True) + HALF) & MASK).to(tl.float32, bitcast=True)
        b = ((b.to(tl.int32, bitcast=True) + HALF) & MASK).to(tl.float32, bitcast=True)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), device=a.device, dtype=torch.float32)
        grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
        mm_kernel[grid](a, b, c, m, n, k, HALF=0x8000, MASK=-0x10000, BM=64, BN=64, BK=32)
        return c
