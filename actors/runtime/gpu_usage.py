"""Per-GPU throughput and busy fraction, from a run's results or from live evaluator statistics.

From results (``report.json``, the run's progress line): every ``EvalResult`` names its evaluator
and, when that evaluator is pinned to one GPU, the GPU (``device.gpu_index``) and the seconds the
GPU was held for that candidate alone (``stages.gpu_s``). Results are grouped per (host, GPU), or
per evaluator when it is not pinned. All groups share one window, from the first candidate's
receipt to the last verdict of the run (or the window given), so their rates compare: candidates
per second is verdicts / window, the busy fraction is GPU-held seconds / window.

From live statistics (``kfoundry status``): each evaluator publishes ``gpu``, ``gpu_name``,
``evaluated``, ``gpu_busy_s`` and ``serving_s`` (seconds since it began taking candidates) in its
``$SRV.STATS`` reply; rates are over its own serving time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from schemas import EvalResult


class GpuUsage(BaseModel):
    """What one GPU (or one evaluator not pinned to a GPU) did over a window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    """Host of the evaluator(s)."""
    gpu: int | None
    """GPU index on that host; ``None``: an evaluator not pinned to one GPU (the CPU, or unknown)."""
    name: str
    """Device name."""
    evaluators: tuple[str, ...]
    """Evaluator actors that used it (one, unless one was restarted)."""
    evaluated: int
    """Verdicts published."""
    busy_s: float
    """Seconds the device was held for candidates alone (sum of ``stages.gpu_s``)."""
    window_s: float
    """Seconds the rates are over."""
    candidates_per_s: float | None
    """``evaluated / window_s`` (``None`` for an empty window)."""
    busy_fraction: float | None
    """``busy_s / window_s`` (``None`` for an empty window)."""
    held_s_mean: float | None = None
    """Mean seconds the device was held per candidate that held it (``stages.gpu_s``)."""
    measured_s_mean: float | None = None
    """Mean seconds of that spent in the measurement itself (``stages.measure_s``: the trial
    forwards and the timing); the rest is the fixed cost of a candidate's process on the device
    (its import, kernels loaded, the profile, the kill)."""
    compile_s_mean: float | None = None
    """Mean seconds of a candidate's compile stage where it compiled (not a cache hit)."""


def _key(r: EvalResult, placed: Mapping[str, tuple[str, int | None, str]]) -> tuple[str, int | None, str]:
    if r.device is not None and r.device.gpu_index is not None:
        return (r.device.host, r.device.gpu_index, r.device.name)
    return placed.get(r.evaluator) or (
        r.device.host if r.device is not None else "?",
        None,
        r.device.name if r.device is not None else "?",
    )


def gpu_usage(results: Iterable[EvalResult], window: tuple[float, float] | None = None) -> tuple[GpuUsage, ...]:
    """Per-GPU usage of ``results`` over ``window`` (wall-clock start, end), by default from the
    first candidate's receipt to the last verdict. Sorted by host, then GPU."""
    rs = list(results)
    if not rs:
        return ()
    if window is None:
        start = min(r.created_at - (r.stages.total_s or 0.0) for r in rs)
        window = (start, max(r.created_at for r in rs))
    span = max(0.0, window[1] - window[0])
    # Evaluators whose results name their GPU: their other results (a gate rejection has no device) go there too.
    placed: dict[str, tuple[str, int | None, str]] = {}
    for r in rs:
        if r.device is not None and r.device.gpu_index is not None and r.evaluator:
            placed.setdefault(r.evaluator, (r.device.host, r.device.gpu_index, r.device.name))
    groups: dict[tuple[str, int | None, str], list[EvalResult]] = {}
    for r in rs:
        key = _key(r, placed)
        if key[1] is None:  # unpinned: one group per evaluator
            key = (key[0], None, f"{key[2]}\0{r.evaluator}")
        groups.setdefault(key, []).append(r)
    out = []
    for (host, gpu, name), members in groups.items():
        busy = sum(r.stages.gpu_s or 0.0 for r in members)
        held = [r.stages.gpu_s for r in members if r.stages.gpu_s]
        measured = [r.stages.measure_s for r in members if r.stages.gpu_s and r.stages.measure_s]
        compiled = [r.stages.compile_s for r in members if r.stages.compile_s and not r.stages.compile_cache_hit]
        out.append(
            GpuUsage(
                host=host,
                gpu=gpu,
                name=name.split("\0")[0],
                evaluators=tuple(sorted({r.evaluator for r in members if r.evaluator})),
                evaluated=len(members),
                busy_s=round(busy, 4),
                window_s=round(span, 4),
                candidates_per_s=len(members) / span if span > 0 else None,
                busy_fraction=busy / span if span > 0 else None,
                held_s_mean=round(sum(held) / len(held), 4) if held else None,
                measured_s_mean=round(sum(measured) / len(measured), 4) if measured else None,
                compile_s_mean=round(sum(compiled) / len(compiled), 4) if compiled else None,
            )
        )
    return tuple(sorted(out, key=lambda u: (u.host, u.gpu is None, u.gpu or 0, u.evaluators)))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def usage_table(usages: Sequence[GpuUsage]) -> list[str]:
    """Lines of a table of ``usages`` (for ``report.md`` and the console)."""
    lines = [
        f"{'HOST':<14} {'GPU':>3} {'NAME':<24} {'DONE':>6} {'CAND/S':>8} {'BUSY':>5} {'HELD/C':>7} "
        f"{'MEAS/C':>7}  EVALUATOR"
    ]
    for u in usages:
        gpu = "-" if u.gpu is None else str(u.gpu)
        lines.append(
            f"{u.host[:14]:<14} {gpu:>3} {u.name[:24]:<24} {u.evaluated:>6} {_rate(u.candidates_per_s):>8} "
            f"{_pct(u.busy_fraction):>5} {_secs(u.held_s_mean):>7} {_secs(u.measured_s_mean):>7}  "
            f"{','.join(u.evaluators)}"
        )
    return lines


def progress_part(usages: Sequence[GpuUsage]) -> str:
    """A short per-GPU part of the progress line (empty unless several GPUs work)."""
    pinned = [u for u in usages if u.gpu is not None]
    if len(pinned) < 2:
        return ""
    return "GPUs " + " ".join(f"{u.gpu}:{_rate(u.candidates_per_s)}/s {_pct(u.busy_fraction)}" for u in pinned)


def live_rows(stats_by_actor: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[GpuUsage]:
    """Usage per evaluator from live statistics: ``(actor_id, host, stats)`` with the evaluator's
    ``extra`` counters in ``stats["extra"]`` (see the module docstring)."""
    out = []
    for actor_id, host, stats in stats_by_actor:
        extra = stats.get("extra") or {}
        if "gpu_busy_s" not in extra:
            continue  # not an evaluator, or one from before these counters
        serving = extra.get("serving_s")
        evaluated = int(extra.get("evaluated") or 0)
        busy = float(extra.get("gpu_busy_s") or 0.0)
        span = float(serving) if isinstance(serving, int | float) else 0.0
        gpu = extra.get("gpu")
        out.append(
            GpuUsage(
                host=host,
                gpu=int(gpu) if isinstance(gpu, int) else None,
                name=str(extra.get("gpu_name") or "-"),
                evaluators=(actor_id,),
                evaluated=evaluated,
                busy_s=busy,
                window_s=span,
                candidates_per_s=evaluated / span if span > 0 else None,
                busy_fraction=busy / span if span > 0 else None,
            )
        )
    return sorted(out, key=lambda u: (u.host, u.gpu is None, u.gpu or 0, u.evaluators))
