"""Trusted arithmetic of the verdict, in the parent: output comparison, timing statistics, speed of light.

Inputs are numpy arrays decoded from the wire and raw timing samples; nothing here trusts a
number the worker computed about itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import Correctness, SpeedOfLight, TimerKind, TimingStats

Array = npt.NDArray[Any]


@dataclass
class TrialCheck:
    """How one trial's outputs compared."""

    ok: bool
    category: str | None = None
    detail: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    err64: float | None = None
    ref_err64: float | None = None
    mismatch_fraction: float | None = None
    first_bad: tuple[int, ...] | None = None


def _rel_l2(a: Array, b: Array) -> float:
    num = float(np.linalg.norm((a - b).ravel()))
    den = float(np.linalg.norm(b.ravel()))
    return num / den if den > 0 else num


def compare_trial(*args: Any) -> TrialCheck:
    """Compare one trial (see :func:`_compare_trial`); garbage outputs may hold any bit pattern."""
    with np.errstate(all="ignore"):
        return _compare_trial(*args)


def _compare_trial(
    cand: list[Array],
    cand_dtypes: list[str],
    ref: list[Array],
    ref_dtypes: list[str],
    ref64: list[Array] | None,
    tolerances: dict[str, tuple[float, float]],
    floors: dict[str, float],
    factor: float,
) -> TrialCheck:
    """Compare one trial: count, shape, dtype, NaN/Inf, element-wise tolerance, precision vs float64."""
    if len(cand) != len(ref):
        return TrialCheck(False, "incorrect.shape", f"{len(cand)} outputs, the reference returns {len(ref)}")
    worst = TrialCheck(True)
    for i, (c, r, cd, rd) in enumerate(zip(cand, ref, cand_dtypes, ref_dtypes, strict=True)):
        if c.shape != r.shape:
            return TrialCheck(False, "incorrect.shape", f"output {i}: shape {list(c.shape)}, expected {list(r.shape)}")
        if cd != rd:
            return TrialCheck(False, "incorrect.precision", f"output {i}: dtype {cd}, expected {rd}")
        if rd not in tolerances:
            if not np.array_equal(c, r):
                bad = np.argwhere(c != r)
                first = tuple(int(x) for x in bad[0]) if len(bad) else None
                return TrialCheck(
                    False,
                    "incorrect.other",
                    f"output {i} ({rd}) differs",
                    first_bad=first,
                    mismatch_fraction=float((c != r).mean()),
                )
            continue
        atol, rtol = tolerances[rd]
        c64, r64n = c.astype(np.float64), r.astype(np.float64)
        c_fin, r_fin = np.isfinite(c64), np.isfinite(r64n)
        if not np.array_equal(c_fin, r_fin) or not np.array_equal(np.isnan(c64), np.isnan(r64n)):
            bad = np.argwhere(c_fin != r_fin)
            first = tuple(int(x) for x in bad[0]) if len(bad) else None
            frac = float((c_fin != r_fin).mean())
            return TrialCheck(
                False,
                "incorrect.nan_inf",
                f"output {i}: NaN/Inf where the reference has none ({frac:.1%} of elements)",
                first_bad=first,
                mismatch_fraction=frac,
            )
        diff = np.where(r_fin, np.abs(c64 - r64n), 0.0)
        bound = atol + rtol * np.abs(np.where(r_fin, r64n, 0.0))
        outside = diff > bound
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(np.where(r_fin, r64n, 0.0)), atol)).max()) if diff.size else 0.0
        worst.max_abs, worst.max_rel = max(worst.max_abs, max_abs), max(worst.max_rel, max_rel)
        if ref64 is not None:
            exact = ref64[i].astype(np.float64)
            fin = np.isfinite(exact) & r_fin
            err = _rel_l2(np.where(fin, c64, 0.0), np.where(fin, exact, 0.0))
            ref_err = _rel_l2(np.where(fin, r64n, 0.0), np.where(fin, exact, 0.0))
            worst.err64 = max(worst.err64 or 0.0, err)
            worst.ref_err64 = max(worst.ref_err64 or 0.0, ref_err)
            bar = max(factor * ref_err, floors.get(rd, 0.0))
            if err > bar:
                return TrialCheck(
                    False,
                    "incorrect.precision",
                    f"output {i}: relative L2 error {err:.2e} against "
                    f"float64, the eager reference has {ref_err:.2e} (bar {bar:.2e}): lower "
                    "precision than the reference (TF32/bf16?)",
                    max_abs=max_abs,
                    max_rel=max_rel,
                    err64=err,
                    ref_err64=ref_err,
                    mismatch_fraction=float(outside.mean()),
                )
        if outside.any():
            first = tuple(int(x) for x in np.argwhere(outside)[0])
            frac = float(outside.mean())
            category = "incorrect.boundary" if frac < 0.05 else "incorrect.other"
            return TrialCheck(
                False,
                category,
                f"output {i}: {frac:.2%} of elements outside atol={atol:g} rtol={rtol:g} (max abs error {max_abs:.3g})",
                max_abs=max_abs,
                max_rel=max_rel,
                err64=worst.err64,
                ref_err64=worst.ref_err64,
                mismatch_fraction=frac,
                first_bad=first,
            )
    return worst


def correctness(trials: list[TrialCheck], expected: int, tolerance: tuple[float, float]) -> Correctness:
    """Aggregate trial checks into the schema's :class:`Correctness`."""
    passed = sum(t.ok for t in trials)
    first_bad = next((t for t in trials if not t.ok), None)
    err64 = [t.err64 for t in trials if t.err64 is not None]
    ref64 = [t.ref_err64 for t in trials if t.ref_err64 is not None]
    detail = first_bad.detail if first_bad else (None if len(trials) == expected else "not every trial ran")
    return Correctness(
        trials=len(trials),
        passed_trials=passed,
        atol=tolerance[0],
        rtol=tolerance[1],
        max_abs_err=max((t.max_abs for t in trials), default=None),
        max_rel_err=max((t.max_rel for t in trials), default=None),
        err_vs_fp64=max(err64) if err64 else None,
        ref_err_vs_fp64=max(ref64) if ref64 else None,
        mismatch_fraction=first_bad.mismatch_fraction if first_bad else None,
        first_bad_index=first_bad.first_bad if first_bad else None,
        detail=detail,
    )


def timing_stats(samples: list[float], timer: TimerKind, wall: list[float] | None = None) -> TimingStats | None:
    """Statistics of raw per-call times (ms)."""
    values = np.asarray([s for s in samples if np.isfinite(s) and s >= 0], dtype=np.float64)
    if values.size == 0:
        return None
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return TimingStats(
        median_ms=float(np.median(values)),
        mean_ms=mean,
        std_ms=std,
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        p10_ms=float(np.percentile(values, 10)),
        p90_ms=float(np.percentile(values, 90)),
        reps=int(values.size),
        rel_stderr=std / np.sqrt(values.size) / mean if mean > 0 else float("inf"),
        timer=timer,
        wall_ms=float(np.median(wall)) if wall else None,
    )


def speed_of_light(
    info: dict[str, Any],
    peaks: dict[str, Any],
    cfg_tflops: float | None,
    cfg_gbps: float | None,
    median_ms: float | None,
) -> SpeedOfLight | None:
    """The bound from the reference's FLOPs and bytes and the device's ceilings."""
    flops, nbytes = info.get("flops"), info.get("bytes_moved")
    sixteen = info.get("out_dtype") in ("float16", "bfloat16")
    tflops = cfg_tflops or peaks.get("tflops_16" if sixteen else "tflops_fp32")
    gbps = cfg_gbps or peaks.get("gbps")
    if nbytes is None or not gbps or not tflops:
        return None
    flops = int(flops or 0)
    compute_ms = flops / (float(tflops) * 1e12) * 1e3
    memory_ms = int(nbytes) / (float(gbps) * 1e9) * 1e3
    bound = max(compute_ms, memory_ms)
    return SpeedOfLight(
        flops=flops,
        bytes_moved=int(nbytes),
        peak_tflops=float(tflops),
        peak_gbps=float(gbps),
        bound_ms=bound,
        limiter="compute" if compute_ms > memory_ms else "memory",
        fraction=bound / median_ms if median_ms else None,
    )
