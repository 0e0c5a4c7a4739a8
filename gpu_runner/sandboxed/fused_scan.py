"""The judge's comparison of one large output in a single pass over the GPU's memory (Triton).

:func:`gpu_runner.sandboxed.judging._scan_chunk` compares a chunk in some thirty PyTorch operations
on float64 temporaries; on an H200 that took 0.31 s for every 8 GB output (4 per candidate of an
elementwise task at KernelBench's largest size, 1.2 s of GPU time each). Here one kernel reads the
candidate's output, the reference's and the float64 residual once and leaves a row of partial
results per program (counts, maxima, sums of squares in float64, the first index outside the
tolerance); a reduction over those rows gives the same :class:`gpu_runner.compare._Scan` numbers.

Only outputs where everything is finite are scanned this way (the common case, and the one the
host's ``_fast_chunk`` takes too): the kernel counts elements where the candidate, the reference or
the residual is NaN or infinite, and when there are any the caller scans the output again with the
PyTorch path, which locates them (:func:`scan` returns ``None``). The arithmetic per element is the
PyTorch path's, in float64; only the order of the sums differs.

This is trusted code that runs in the judge (a process no candidate ever ran in); Triton compiles
it there at the first large output of a process (once per output dtype and residual or not).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Elements per program step (with :data:`WARPS` warps: four per thread, ten float64 accumulators
each; 2048 with four warps ran at 318 GB/s on an H200, its registers spilled)."""
STEPS = 16
"""Steps per program: a program scans ``BLOCK * STEPS`` elements and writes one row of partials."""
WARPS = 8
FIELDS = 10
"""Partials per program: non-finite, outside, first outside, max_abs, max_rel, sq_err, sq_ref_err,
sq_exact, ref_err_max, truth_excess."""
_NO_INDEX = float(2**62)


@triton.jit  # type: ignore[untyped-decorator]
def _scan_kernel(  # type: ignore[no-untyped-def]
    c_ptr,
    r_ptr,
    d_ptr,
    part_ptr,
    n,
    offset,
    atol,
    rtol,
    HAS_D: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (BLOCK * STEPS)
    lanes = tl.arange(0, BLOCK)
    inf = float("inf")
    nonfinite = tl.zeros((BLOCK,), dtype=tl.float64)
    outside_n = tl.zeros((BLOCK,), dtype=tl.float64)
    first = tl.full((BLOCK,), 2**62, dtype=tl.int64)
    max_abs = tl.zeros((BLOCK,), dtype=tl.float64)
    max_rel = tl.zeros((BLOCK,), dtype=tl.float64)
    sq_err = tl.zeros((BLOCK,), dtype=tl.float64)
    sq_ref = tl.zeros((BLOCK,), dtype=tl.float64)
    sq_exact = tl.zeros((BLOCK,), dtype=tl.float64)
    ref_err = tl.zeros((BLOCK,), dtype=tl.float64)
    excess = tl.full((BLOCK,), -inf, dtype=tl.float64)
    for step in range(STEPS):
        idx = base + step * BLOCK + lanes
        mask = idx < n
        c = tl.load(c_ptr + idx, mask=mask, other=0.0).to(tl.float64)
        r = tl.load(r_ptr + idx, mask=mask, other=0.0).to(tl.float64)
        finite = (tl.abs(c) < inf) & (tl.abs(r) < inf)  # False for NaN and infinities
        diff = tl.abs(c - r)
        r_abs = tl.abs(r)
        out = diff > r_abs * rtol + atol
        if HAS_D:
            d = tl.load(d_ptr + idx, mask=mask, other=0.0).to(tl.float64)
            finite = finite & (tl.abs(d) < inf)
            exact = r + d
            err = c - exact
            sq_err += tl.where(mask, err * err, 0.0)
            sq_ref += tl.where(mask, d * d, 0.0)
            sq_exact += tl.where(mask, exact * exact, 0.0)
            ref_err = tl.maximum(ref_err, tl.where(mask, tl.abs(d), 0.0))
            miss = tl.abs(err) - (atol + rtol * tl.abs(exact))
            excess = tl.maximum(excess, tl.where(mask & out, miss, -inf))
        nonfinite += tl.where(mask & (finite == 0), 1.0, 0.0)
        hit = mask & out
        outside_n += tl.where(hit, 1.0, 0.0)
        first = tl.minimum(first, tl.where(hit, idx + offset, 2**62))
        max_abs = tl.maximum(max_abs, tl.where(mask, diff, 0.0))
        max_rel = tl.maximum(max_rel, tl.where(mask, diff / tl.maximum(r_abs, atol), 0.0))
    row = part_ptr + pid * 10
    tl.store(row + 0, tl.sum(nonfinite, axis=0))
    tl.store(row + 1, tl.sum(outside_n, axis=0))
    tl.store(row + 2, tl.min(first, axis=0).to(tl.float64))
    tl.store(row + 3, tl.max(max_abs, axis=0))
    tl.store(row + 4, tl.max(max_rel, axis=0))
    tl.store(row + 5, tl.sum(sq_err, axis=0))
    tl.store(row + 6, tl.sum(sq_ref, axis=0))
    tl.store(row + 7, tl.sum(sq_exact, axis=0))
    tl.store(row + 8, tl.max(ref_err, axis=0))
    tl.store(row + 9, tl.max(excess, axis=0))


def programs(numel: int) -> int:
    """Programs (rows of partials) a scan of ``numel`` elements launches."""
    return max(1, math.ceil(numel / (BLOCK * STEPS)))


def launch(
    part: torch.Tensor, c: torch.Tensor, r: torch.Tensor, d: torch.Tensor | None, offset: int, atol: float, rtol: float
) -> None:
    """Scan the flat, contiguous ``c`` against ``r`` (and the residual ``d``) into ``part``
    (``[programs(c.numel()), FIELDS]`` float64); indexes are reported plus ``offset``."""
    n = c.numel()
    _scan_kernel[(programs(n),)](
        c, r, d if d is not None else r, part, n, offset, float(atol), float(rtol),
        HAS_D=d is not None, BLOCK=BLOCK, STEPS=STEPS, num_warps=WARPS,
    )  # fmt: skip


def reduce(parts: list[torch.Tensor], size: int) -> dict[str, Any] | None:
    """The scan's numbers from every launch's partials, as the judge reports them; ``None`` where
    anything was not finite (the caller scans again where that is located)."""
    p = torch.cat(parts) if len(parts) > 1 else parts[0]
    top = p.max(dim=0).values.tolist()
    sums = p.sum(dim=0).tolist()
    if sums[0]:
        return None
    first = float(p[:, 2].min())
    outside = int(sums[1])
    return {
        "size": size,
        "nan_bad": 0,
        "nan_first": None,
        "outside": outside,
        "outside_first": int(first) if outside and first < _NO_INDEX else None,
        "max_abs": float(top[3]),
        "max_rel": float(top[4]),
        "sq_err": float(sums[5]),
        "sq_ref_err": float(sums[6]),
        "sq_exact": float(sums[7]),
        "truth_excess": float(top[9]),
        "ref_err_max": float(top[8]),
    }
