"""Precision of a median and the verdict's noise allowance, shared by the worker and the parent.

Only the standard library: the worker and the parent both import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

DEFAULT_TOLERANCES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        # (atol, rtol) per output dtype; float32 follows KernelBench's current 1e-4 (torchbench).
        "float64": (1e-7, 1e-7),
        "float32": (1e-4, 1e-4),
        "float16": (1e-2, 1e-2),
        "bfloat16": (2e-2, 2e-2),
    }
)
"""The evaluator's default tolerances (``RunnerConfig.tolerances``); also the referee's bar for a
forward that differs from itself."""

Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""

NOISE_FACTOR = 4.0
"""An element outside the tolerance around the reference is still right when it is within the
tolerance around the float64 truth plus this many times the reference's own largest error: sums
that cancel to near zero (a GEMM summed over its rows) leave every float32 result, the eager one
included, ~1e-3 away from the truth there, and which float32 order is closer is chance."""


def median_rel_stderr(samples: Sequence[float]) -> float:
    """Relative standard error of the median, without assuming a distribution.

    The 95% confidence interval of a median runs between the order statistics of ranks
    ``n/2 -+ 1.96 sqrt(n)/2`` (the binomial's normal approximation); half its width over 1.96
    is the median's standard error, here divided by the median. A few slow outliers (a
    preempted launch, another process's copy) leave it unchanged, where they can keep the
    mean's standard error above a target for thousands of calls. ``inf`` below 8 samples (the
    interval then reaches past the extremes) or for a median of zero.
    """
    n = len(samples)
    if n < 8:
        return math.inf
    ordered = sorted(samples)
    half = Z95 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half))
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    if mid <= 0:
        return math.inf
    return (ordered[hi] - ordered[lo]) / 2 / Z95 / mid
