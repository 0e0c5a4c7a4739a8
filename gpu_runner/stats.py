"""Precision of a median, shared by the timing loop (worker) and the scoring (parent).

Only the standard library: the worker and the parent both import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""


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
