"""The attention cases of ``bench.attention_bench``: KernelBench-format references and their float64 truth.

KernelBench's attention shapes as published (numbers only, no KernelBench file is copied): level 1
problem 97 (``F.scaled_dot_product_attention(Q, K, V)``, (32, 32, 512, 1024) float32 ``torch.rand``)
and level 3 problem 43's MinGPT causal attention core (batch 128, n_embd 768, 8 heads of 96, 512
tokens, float32, written as MinGPT writes it); and a sweep of ``scaled_dot_product_attention`` over
head dims, sequence lengths, dtypes and causal or not (``torch.randn``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = ("float32", "bfloat16", "float16")
TRUTH_CHUNK_BYTES = 2 << 30
"""Float64 scores per chunk of the truth's math path."""

SDPA_REF = '''"""{title}"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal={causal})


batch_size = {b}
num_heads = {h}
seq_len = {s}
head_dim = {d}


def get_inputs():
    shape = (batch_size, num_heads, seq_len, head_dim)
    return [torch.{rand}(shape, dtype=torch.{dtype}) for _ in range(3)]


def get_init_inputs():
    return []
'''

MINGPT_REF = '''"""{title}"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, max_seqlen):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.size(2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return att @ v


batch_size = {b}
n_head = {h}
seq_len = {s}
head_dim = {d}
max_seqlen = {m}


def get_inputs():
    shape = (batch_size, n_head, seq_len, head_dim)
    return [torch.randn(shape, dtype=torch.float32) for _ in range(3)]


def get_init_inputs():
    return [max_seqlen]
'''


@dataclass(frozen=True)
class Case:
    """One attention problem: its reference source and what the table says of it."""

    name: str
    b: int
    h: int
    s: int
    d: int
    dtype: str
    causal: bool
    source: str
    explicit: bool = False
    """The reference writes the score matrix out (matmul, mask, softmax, matmul)."""

    @property
    def flops(self) -> float:
        return 4.0 * self.b * self.h * self.s * self.s * self.d / (2 if self.causal else 1)

    def scores_gb(self) -> float:
        """Memory of the score matrix, with the softmax's copy and the mask's (a path that writes it)."""
        return 3 * self.b * self.h * self.s * self.s * cast(torch.dtype, getattr(torch, self.dtype)).itemsize / 1e9

    def slug(self) -> str:
        return f"{self.name.split()[0].lower()}_{self.b}x{self.h}x{self.s}x{self.d}_{self.dtype}" + (
            "_causal" if self.causal else ""
        )


def sdpa_case(name: str, b: int, h: int, s: int, d: int, dtype: str, causal: bool, rand: str = "randn") -> Case:
    title = f"{name}: scaled_dot_product_attention on ({b}, {h}, {s}, {d}) {dtype}" + (", causal" if causal else "")
    source = SDPA_REF.format(title=title, b=b, h=h, s=s, d=d, dtype=dtype, causal=causal, rand=rand)
    return Case(name, b, h, s, d, dtype, causal, source)


def kernelbench_cases(quick: bool) -> list[Case]:
    """Level 1 problem 97 and level 3 problem 43's attention core, at their published sizes (tiny with ``quick``)."""
    b, h, s, d = (2, 2, 32, 64) if quick else (32, 32, 512, 1024)
    l1 = sdpa_case("L1-97 ScaledDotProductAttention", b, h, s, d, "float32", False, rand="rand")
    b, h, s, d, m = (2, 2, 32, 24, 64) if quick else (128, 8, 512, 96, 1024)
    title = f"L3-43 MinGPT causal attention core: ({b}, {h}, {s}, {d}) float32, explicit"
    source = MINGPT_REF.format(title=title, b=b, h=h, s=s, d=d, m=m)
    return [l1, Case("L3-43 MinGPT-core", b, h, s, d, "float32", True, source, explicit=True)]


def sweep_cases(
    dims: list[int], seqs: list[int], dtypes: list[str], causal: list[bool], tokens: int, hidden: int, quick: bool
) -> list[Case]:
    """Every combination; batch ``tokens // S`` and ``hidden // D`` heads (1 and 2 with ``quick``)."""
    return [
        sdpa_case("sweep", 1 if quick else max(1, tokens // s), 2 if quick else max(1, hidden // d), s, d, dt, c)
        for dt in dtypes
        for d in dims
        for s in seqs
        for c in causal
    ]


def truth_of(inputs: list[torch.Tensor], causal: bool) -> torch.Tensor:
    """The attention of ``inputs`` in float64 by the math path, in chunks of batch-heads (the CPU
    holds the result when the GPU cannot)."""
    q, k, v = inputs
    n = math.prod(q.shape[:-2])
    flat = [x.reshape(n, *x.shape[-2:]) for x in inputs]
    per = max(1, TRUTH_CHUNK_BYTES // (q.shape[-2] * k.shape[-2] * 8 * 3))
    try:
        out = torch.empty(n, q.shape[-2], v.shape[-1], dtype=torch.float64, device=q.device)
    except torch.cuda.OutOfMemoryError:
        out = torch.empty(n, q.shape[-2], v.shape[-1], dtype=torch.float64)
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        for i in range(0, n, per):
            a, b, c = (x[i : i + per].to(out.device, torch.float64) for x in flat)
            out[i : i + per] = F.scaled_dot_product_attention(a, b, c, is_causal=causal)
    return out.reshape(*q.shape[:-1], v.shape[-1])


def errors(out: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """Relative L2 and max absolute error of ``out`` against ``truth`` (conv_bench's measures), chunk by chunk."""
    o, t = out.reshape(-1, out.shape[-1]), truth.reshape(-1, truth.shape[-1])
    per = max(1, (32 << 20) // max(1, o.shape[-1]))
    diff2 = norm2 = top = 0.0
    for i in range(0, o.shape[0], per):
        a, b = o[i : i + per].to(t.device, torch.float64), t[i : i + per]
        d = a - b
        diff2 += float((d * d).sum())
        norm2 += float((b * b).sum())
        top = max(top, float(d.abs().max()))
    return (math.sqrt(diff2 / norm2) if norm2 else math.sqrt(diff2)), top
