"""Reading profiler counters: Nsight Compute's CSV into ``HardwareCounters``, and what bounds a kernel.

``ncu --csv --print-units base --metrics M1,M2,...`` writes one row per (kernel launch, metric)
under the header ``"ID","Process ID","Process Name","Host Name","Kernel Name",...,"Metric Name",
"Metric Unit","Metric Value"`` (the columns between vary by version; they are found by name).
Lines before the header (``==PROF==`` progress, the program's own output) are skipped, values may
carry thousands separators, and ``n/a`` is "not measured". Percentages are averaged over the
launches weighted by each launch's duration (``gpu__time_duration.sum``); stall reasons are summed
the same way and reported as shares of all stalls.

:func:`bound_of` reads the counters the way a performance engineer does: DRAM or SM throughput
near their peaks mean memory- or compute-bound; both low mean the warps are waiting
(latency-bound: too few in flight, long scoreboard, barriers), whatever the speed-of-light model says.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from enum import StrEnum

from schemas import HardwareCounters, StallShare

DURATION = "gpu__time_duration.sum"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
_STALL_PREFIX = "smsp__average_warps_issue_stalled_"
_STALL_SUFFIX = "_per_issue_active.ratio"
STALL_REASONS = (
    "long_scoreboard",
    "short_scoreboard",
    "barrier",
    "membar",
    "mio_throttle",
    "lg_throttle",
    "math_pipe_throttle",
    "wait",
    "not_selected",
    "no_instruction",
    "dispatch_stall",
    "tex_throttle",
    "branch_resolving",
    "drain",
)
"""Stall reasons asked for (Nsight Compute's warp-state names)."""
METRICS = (DURATION, DRAM, SM, OCCUPANCY, *(f"{_STALL_PREFIX}{r}{_STALL_SUFFIX}" for r in STALL_REASONS))
"""The metrics to pass to ``ncu --metrics``."""
_TIME_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}
TOP_STALLS = 4


class CountersUnreadable(ValueError):
    """The profiler's output has no metric table this parser understands."""


class Bound(StrEnum):
    """What limits a kernel, read from its counters."""

    MEMORY = "memory"
    COMPUTE = "compute"
    LATENCY = "latency"


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str, tool: str = "ncu") -> HardwareCounters:
    """The counters of every launch in ``text`` (``ncu --csv`` output), duration-weighted."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Metric Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        raise CountersUnreadable('no metric table (no header with "Metric Name" and "Metric Value")')
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    per_launch: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        launch, name, value = row.get("ID"), row.get("Metric Name"), _number(row.get("Metric Value") or "")
        if launch is None or name is None or value is None:
            continue
        if name == DURATION:
            value *= _TIME_UNITS.get((row.get("Metric Unit") or "nsecond").strip(), 1e-6)
        per_launch[launch][name] = value
    if not per_launch:
        raise CountersUnreadable("the metric table has no rows with values")
    weights = {k: m.get(DURATION, 0.0) for k, m in per_launch.items()}
    if sum(weights.values()) <= 0:
        weights = dict.fromkeys(per_launch, 1.0)

    def mean(metric: str) -> float | None:
        have = [(weights[k], m[metric]) for k, m in per_launch.items() if metric in m]
        total = sum(w for w, _ in have)
        return sum(w * v for w, v in have) / total if have and total > 0 else None

    stalls: dict[str, float] = {}
    for reason in STALL_REASONS:
        key = f"{_STALL_PREFIX}{reason}{_STALL_SUFFIX}"
        stalls[reason] = sum(weights[k] * m.get(key, 0.0) for k, m in per_launch.items())
    total = sum(stalls.values())
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS] if total > 0 else []
    duration = sum(m.get(DURATION, 0.0) for m in per_launch.values())
    return HardwareCounters(
        tool=tool,
        kernels=len(per_launch),
        duration_ms=duration if duration > 0 else None,
        dram_throughput_pct=mean(DRAM),
        sm_throughput_pct=mean(SM),
        achieved_occupancy_pct=mean(OCCUPANCY),
        stalls=tuple(StallShare(reason=r, share=min(1.0, v / total)) for r, v in top if v > 0),
    )


def bound_of(counters: HardwareCounters, busy_pct: float = 60.0) -> Bound | None:
    """Memory- or compute-bound when DRAM or SM throughput reaches ``busy_pct`` of its peak (the
    larger decides), latency-bound when neither does; ``None`` without either measurement."""
    dram, sm = counters.dram_throughput_pct, counters.sm_throughput_pct
    if dram is None and sm is None:
        return None
    dram, sm = dram or 0.0, sm or 0.0
    if max(dram, sm) >= busy_pct:
        return Bound.MEMORY if dram >= sm else Bound.COMPUTE
    return Bound.LATENCY


def describe(counters: HardwareCounters) -> tuple[str, ...]:
    """The counters as evidence lines a person (or an LLM) can read."""
    out: list[str] = []

    def pct(x: float | None) -> str:
        return "not measured" if x is None else f"{x:.0f}%"

    out.append(
        f"{counters.tool} over {counters.kernels} launch(es): DRAM throughput {pct(counters.dram_throughput_pct)} "
        f"of peak, SM throughput {pct(counters.sm_throughput_pct)}, achieved occupancy "
        f"{pct(counters.achieved_occupancy_pct)}"
    )
    if counters.stalls:
        out.append("top warp stalls: " + ", ".join(f"{s.reason} {s.share:.0%}" for s in counters.stalls))
    return tuple(out)
