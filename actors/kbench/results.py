"""The bench's results: one typed row per problem, the totals over them, and the Markdown table.

Totals, over the N problems of the bench (every problem attempted counts, whatever its status):

- ``share_correct``: problems with a correct candidate / N.
- ``fast_p`` (KernelBench's definition): problems with a correct candidate whose best speedup over
  the baseline is strictly greater than p, / N. A problem whose baseline could not be timed (no
  torch.compile build, say) is not fast against it.
- ``geomean_correct``: geometric mean of the best speedups over the problems with a correct
  candidate (and a timed baseline) only; ``None`` when there are none.
- ``geomean_all``: geometric mean over all N problems, a problem without a correct candidate (or
  without a timed baseline) counting as 1.0: the user keeps the reference, so nothing is gained
  or lost.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from actors.report.model import BestKernel


class ProblemStatus(StrEnum):
    """How one problem ended."""

    CORRECT = "correct"
    """At least one candidate was judged correct: the best one is reported."""
    NO_CORRECT = "no_correct"
    """Candidates were evaluated, none correct."""
    DECLINED = "declined"
    """No evaluation: the experts declined the task, or the evaluator refused it (too large)."""
    TASK_ERROR = "task_error"
    """``kfoundry run`` failed on the task (bad reference, crash, killed)."""


class Baseline(StrEnum):
    """What a speedup is measured against."""

    EAGER = "eager"
    COMPILED = "compiled"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProblemResult(_Frozen):
    """One problem's outcome, as ``bench.json`` stores it."""

    level: int
    number: int
    name: str
    """The problem file's stem."""
    status: ProblemStatus
    detail: str | None = None
    """Why it was declined, or the task error's message."""
    speedup_vs_eager: float | None = None
    """Best correct candidate: eager median / its median."""
    speedup_vs_compiled: float | None = None
    """The same candidate against torch.compile of the reference."""
    compiled_derived: bool = False
    """``speedup_vs_compiled`` was derived from the task's measured compiled/eager ratio, not
    timed beside the best (the report's ``best.compiled_derived``)."""
    sol_fraction: float | None = None
    """The same candidate: speed-of-light bound / its median."""
    precision: str | None = None
    """The standard its outputs were judged at (``reference``: precision parity; ``exact``)."""
    err_vs_fp64: float | None = None
    """Its relative L2 error against float64."""
    ref_default_err_vs_fp64: float | None = None
    """The reference's at PyTorch's defaults, where they are not IEEE float32 (TF32 convolutions)."""
    held_out: str | None = None
    """The best at the evaluator's held-out shapes, counted by outcome (``3 correct``, ``1 correct,
    2 raised``), or why none were checked."""
    held_out_all_correct: bool | None = None
    """Whether the best was correct at every held-out shape (``None``: none checked, or no best)."""
    evaluated: int | None = None
    """Candidates evaluated; ``None`` when no report was written."""
    first_correct_s: float | None = None
    """Seconds from the run's start to its first correct candidate."""
    first_verdict: str | None = None
    """Where the run's first seconds went (``report.json``'s ``first_verdict``, as one line)."""
    peak_host_bytes: int | None = None
    """Peak resident memory of the run's process tree (sum of RSS, so shared pages count once per process)."""
    peak_gpu_bytes: int | None = None
    """Peak GPU memory of the run's processes (per-process accounting of the driver); ``None``
    when not measurable (CPU runs, no nvidia-smi, or the driver names none of the processes)."""
    peak_gpu_device_bytes: int | None = None
    """Peak rise of the whole GPU's used memory over its level before the run started."""
    wall_s: float
    """Seconds the ``kfoundry run`` subprocess took."""
    exit_code: int | None = None
    """Its exit status (negative: killed by that signal)."""
    end_reason: str | None = None
    """Why the run ended (``report.json``'s ``end_reason``)."""
    status_counts: dict[str, int] = {}
    """Verdicts of the run's candidates."""
    run_dir: str
    """Where the run's results are (relative to the bench's output folder)."""
    gpus: tuple[str, ...] = ()
    """The UUIDs of the GPUs the run was given (``--parallel``); empty: every GPU the bench saw."""

    def speedup(self, baseline: Baseline) -> float | None:
        """The best correct candidate's speedup over ``baseline``; ``None`` without one."""
        if self.status is not ProblemStatus.CORRECT:
            return None
        return self.speedup_vs_eager if baseline is Baseline.EAGER else self.speedup_vs_compiled


class Totals(_Frozen):
    """The totals a KernelBench reader expects (definitions in the module docstring)."""

    problems: int
    correct: int
    share_correct: float | None
    fast_p: dict[str, dict[str, float | None]]
    """Baseline → ``p`` (as text, e.g. ``"1.5"``) → share of problems correct and faster than p."""
    geomean_correct: dict[str, float | None]
    """Baseline → geometric-mean speedup over the problems with a correct candidate."""
    geomean_all: dict[str, float | None]
    """Baseline → geometric-mean speedup over all problems, no correct candidate counting as 1.0."""
    by_status: dict[str, int]


class BenchFile(_Frozen):
    """``bench.json``: what was asked, the finished problems, and their totals."""

    version: int = 1
    kernelbench_dir: str
    level: int
    problems_spec: str
    device: str = "auto"
    seconds: float | None = None
    """Each run's wall-clock budget (``None``: ``kfoundry run``'s default)."""
    run_args: tuple[str, ...] = ()
    """More arguments every ``kfoundry run`` got."""
    parallel: int = 1
    """Runs at a time (``--parallel``) of the bench's last start; each on GPUs of its own."""
    results: tuple[ProblemResult, ...] = Field(default=())
    totals: Totals | None = None


FAST_P = (1.0, 1.5)


def fast_p(speedups: Sequence[float | None], p: float) -> float | None:
    """Share of problems (``None`` = no correct candidate) whose speedup is strictly above ``p``."""
    if not speedups:
        return None
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups)


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; ``None`` for none."""
    if not values:
        return None
    if any(v <= 0 or not math.isfinite(v) for v in values):
        raise ValueError(f"geometric mean of non-positive or non-finite values: {list(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def totals(results: Sequence[ProblemResult]) -> Totals:
    """The totals over ``results`` (one per problem)."""
    n = len(results)
    correct = sum(1 for r in results if r.status is ProblemStatus.CORRECT)
    fast: dict[str, dict[str, float | None]] = {}
    g_correct: dict[str, float | None] = {}
    g_all: dict[str, float | None] = {}
    for base in Baseline:
        speedups = [r.speedup(base) for r in results]
        fast[base.value] = {f"{p:g}": fast_p(speedups, p) for p in FAST_P}
        measured = [s for s in speedups if s is not None]
        g_correct[base.value] = geomean(measured)
        g_all[base.value] = geomean([s if s is not None else 1.0 for s in speedups])
    counts: dict[str, int] = {s.value: 0 for s in ProblemStatus}
    for r in results:
        counts[r.status.value] += 1
    return Totals(
        problems=n,
        correct=correct,
        share_correct=correct / n if n else None,
        fast_p=fast,
        geomean_correct=g_correct,
        geomean_all=g_all,
        by_status=counts,
    )


def held_out_summary(best: BestKernel) -> str:
    """The best at the held-out shapes, counted by outcome, or why none were checked."""
    if not best.held_out:
        return f"none: {best.held_out_note}" if best.held_out_note else "none"
    counts = Counter(s.outcome for s in best.held_out)
    text = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    speedups = [x for s in best.held_out if (x := s.speedup_vs_eager) is not None]
    if speedups:
        text += f" ({', '.join(f'{x:.2f}x' for x in speedups)} eager there)"
    return text


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _gib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**30:.2f}"


def _status(r: ProblemResult) -> str:
    text = {
        ProblemStatus.CORRECT: "best correct",
        ProblemStatus.NO_CORRECT: "no correct candidate",
        ProblemStatus.DECLINED: "declined",
        ProblemStatus.TASK_ERROR: "task error",
    }[r.status]
    if r.detail and r.status in (ProblemStatus.DECLINED, ProblemStatus.TASK_ERROR):
        text += ": " + " ".join(r.detail.split())[:160].replace("|", "\\|")
    return text


def _precision(r: ProblemResult) -> str:
    """The best's precision standard and errors, for the table."""
    if r.precision is None:
        return "–"
    errs = f"{_num(r.err_vs_fp64, '.1e')} / {_num(r.ref_default_err_vs_fp64, '.1e')}"
    return f"{r.precision} ({errs})" if r.err_vs_fp64 is not None else r.precision


def markdown(bench: BenchFile) -> str:
    """The bench as a Markdown table with its totals beneath."""
    lines = [
        f"# kfoundry bench: KernelBench level {bench.level}, problems {bench.problems_spec}",
        "",
    ]
    if bench.parallel > 1:
        own = "GPUs of its own (none shared) and " if any(r.gpus for r in bench.results) else ""
        where = f"{own}a share of the host's cores and memory"
        lines += [f"Problems ran {bench.parallel} at a time, each run on {where}.", ""]
    if bench.seconds is not None:
        budget = f"Each run's budget: {bench.seconds:g} s of wall time; `wall (s)` is its process's, start to exit."
        lines += [budget, ""]
    lines += [
        "| problem | status | vs eager | vs compile | % SOL | evaluated | first correct (s) | wall (s) "
        "| peak GPU (GiB) | peak host (GiB) | precision (error vs float64: best / reference at defaults) "
        "| held-out shapes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in bench.results:
        sol = r.sol_fraction * 100 if r.sol_fraction is not None else None
        gpu = _gib(r.peak_gpu_bytes)
        if r.peak_gpu_bytes is None and r.peak_gpu_device_bytes is not None:
            gpu = f"{_gib(r.peak_gpu_device_bytes)} (whole GPU)"
        lines.append(
            f"| {r.name} | {_status(r)} | {_num(r.speedup_vs_eager, '.3g', 'x')} "
            f"| {_num(r.speedup_vs_compiled, '.3g', 'x')}{'*' if r.compiled_derived else ''} | {_num(sol, '.1f')} "
            f"| {_num(r.evaluated, 'd')} | {_num(r.first_correct_s, '.0f')} | {r.wall_s:.0f} | {gpu} "
            f"| {_gib(r.peak_host_bytes)} "
            f"| {_precision(r)} | {(r.held_out or '–').replace('|', '/')[:80]} |"
        )
    if any(r.compiled_derived for r in bench.results):
        lines += [
            "",
            "\\* derived: the best's own process did not time torch.compile; eager times the task's "
            "compiled/eager ratio as other evaluations of the run measured it side by side",
        ]
    firsts = [r for r in bench.results if r.first_verdict]
    if firsts:
        lines += ["", "Where the first seconds went (seconds from each run's start):", ""]
        lines += [f"- {r.name}: {r.first_verdict}" for r in firsts]
    t = bench.totals or totals(bench.results)
    lines += ["", f"**Totals over {t.problems} problems**", ""]
    lines.append(f"- correct: {t.correct}/{t.problems} ({_num(_pct(t.share_correct), '.0f', '%')})")
    checked = [r for r in bench.results if r.held_out_all_correct is not None]
    if checked:
        generic = sum(1 for r in checked if r.held_out_all_correct)
        lines.append(f"- bests correct at every held-out shape: {generic} of {len(checked)} checked")
    lines.append("- " + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in t.by_status.items()))
    for base, label in ((Baseline.EAGER, "eager"), (Baseline.COMPILED, "torch.compile")):
        fp = ", ".join(f"fast_{p} {_num(_pct(v), '.0f', '%')}" for p, v in t.fast_p[base.value].items())
        lines.append(
            f"- vs {label}: {fp}; geomean over correct {_num(t.geomean_correct[base.value], '.3g', 'x')}, "
            f"over all (no correct = 1.0x) {_num(t.geomean_all[base.value], '.3g', 'x')}"
        )
    over = sorted(r.wall_s - bench.seconds for r in bench.results) if bench.seconds is not None else []
    if over:
        median = over[len(over) // 2] if len(over) % 2 else (over[len(over) // 2 - 1] + over[len(over) // 2]) / 2
        lines.append(f"- wall time past the budget: median {median:+.1f} s, most {over[-1]:+.1f} s")
    return "\n".join(lines) + "\n"


def _pct(share: float | None) -> float | None:
    return None if share is None else share * 100
