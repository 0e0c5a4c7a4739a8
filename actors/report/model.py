"""The run report's types: what ``report.json`` holds (built by ``actors.report.build``)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from actors.commands.outcome import RunVerdict
from actors.evolution.amdahl import TimeBreakdown
from actors.report.experts import ExpertReport, FamilyReport
from actors.runtime.gpu_usage import GpuUsage
from schemas import (
    Decline,
    DeclineReason,
    DiagnosisCategory,
    KernelLanguage,
    MigrationReason,
    ShapeCheck,
    StopReason,
    TorchOpsPolicy,
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LineageStep(_Frozen):
    """One ancestor of the best kernel (oldest first), or the kernel itself (last)."""

    candidate_id: str
    island: str | None = None
    expert: str | None = None
    strategy: str | None = None
    generation: int | None = None
    answered: DiagnosisCategory | None = None
    """The parent's diagnosis this step answered."""
    status: str | None = None
    fitness: float | None = None
    description: str | None = None


class BestKernel(_Frozen):
    """The fittest clean candidate of the run."""

    candidate_id: str
    island: str
    expert: str
    fitness: float
    speedup_vs_eager: float | None = None
    speedup_vs_compiled: float | None = None
    compiled_derived: str | None = None
    """How ``speedup_vs_compiled`` was derived when the best's own process did not time
    ``torch.compile`` (the task's measured compiled/eager ratio); ``None``: timed beside it."""
    median_ms: float | None = None
    sol_fraction: float | None = None
    language: KernelLanguage
    source: str
    lineage: tuple[LineageStep, ...]
    torch_ops: tuple[str, ...] = ()
    """Operations the kernel leaves to PyTorch (the reference's own; run policy ``reference``)."""
    precision: str | None = None
    """The standard its outputs were judged at: ``reference`` (precision parity) or ``exact``."""
    err_vs_fp64: float | None = None
    """Its relative L2 error against float64 (the worst trial's)."""
    ref_err_vs_fp64: float | None = None
    """The reference's own in IEEE float32."""
    ref_default_err_vs_fp64: float | None = None
    """The reference's at PyTorch's defaults, where they differ from IEEE float32 (TF32 convolutions)."""
    held_out: tuple[ShapeCheck, ...] = ()
    """It at the evaluator's held-out shapes: correct, or raised (a specialised kernel); never wrong."""
    held_out_note: str | None = None
    """How those shapes were drawn from the task, or why there were none."""
    time_breakdown: TimeBreakdown | None = None
    """Where its time and the reference's go, family by family (Amdahl's law); ``None``: neither
    the reference's ops nor its kernels were timed."""


class FitnessSample(_Frozen):
    """The island after one feedback (or accepted migrant)."""

    t: float
    """Seconds since the run started."""
    candidate_id: str
    status: str
    fitness: float | None = None
    best: float | None = None
    migrant: bool = False
    expert: str = ""
    """Expert that produced the candidate (``user`` for a seed candidate)."""


class ArchiveMap(_Frozen):
    """An island's archive projected on the two descriptors it spreads over most (best fitness
    per cell, over the other descriptors)."""

    x: str
    y: str
    x_labels: tuple[str, ...]
    y_labels: tuple[str, ...]
    grid: tuple[tuple[float | None, ...], ...]
    elites: int
    coverage: float


class IslandReport(_Frozen):
    """One island's course."""

    island: str
    evaluated: int
    best_fitness: float | None = None
    stopped: StopReason | None = None
    declines: int = 0
    """Requests its experts declined (answered with no candidate)."""
    last_decline: Decline | None = None
    """The island's most recent decline: why no candidate came."""
    fitness: tuple[FitnessSample, ...] = ()
    archive: ArchiveMap | None = None


class CreditEntry(_Frozen):
    """Credit one island learned for a (diagnosis, expert) pair."""

    island: str
    key: str
    expert: str
    role: str
    pulls: int
    mean_reward: float | None = None
    posterior_mean: float


class RoutingEntry(_Frozen):
    """Requests answered under one diagnosis by one expert, and what they earned."""

    answered: str
    """The parent's diagnosis category (``start`` for fresh candidates)."""
    expert: str
    candidates: int
    clean: int
    improved: int
    """Children fitter than their parent (or clean, for a failed or absent parent)."""


class MigrationEvent(_Frozen):
    migration_id: str
    source: str
    dest: str
    reason: MigrationReason
    candidate_ids: tuple[str, ...]
    t: float


class ExperienceUse(_Frozen):
    """One experience shown to experts, with the outcomes of the candidates it informed."""

    experience_id: str
    candidates: tuple[str, ...]
    improved: int
    not_improved: int
    mean_delta: float | None = None


class FirstVerdict(_Frozen):
    """Where a run's first seconds went: its first verdict, from the run's start (seconds since
    it). The evaluator's stages are the verdict's own (``EvalResult.stages``); ``waiting_s`` is
    what its total leaves (a spare, the GPU, a compile at the held-out shapes), ``queued_s`` the
    time from the candidate's publication to the evaluator's receipt of it."""

    candidate_id: str
    status: str
    first_proposal_s: float | None = None
    """The experts' first candidate of the run (the task's analysis and the first render)."""
    proposed_s: float | None = None
    """This candidate's publication."""
    queued_s: float | None = None
    gate_s: float | None = None
    compile_s: float | None = None
    compile_cache_hit: bool = False
    line_s: float | None = None
    """Waiting for better-ranked candidates compiling beside it."""
    run_s: float | None = None
    waiting_s: float | None = None
    verdict_s: float

    def sentence(self) -> str:
        """One line: ``first verdict at 30.5 s: proposed at 12.3 s, gate 0.9 s, compile 9.8 s, ...``."""
        parts = [f"proposed at {self.proposed_s:.1f} s" if self.proposed_s is not None else ""]
        first = self.first_proposal_s
        if first is not None and self.proposed_s is not None and self.proposed_s - first >= 0.1:
            parts[0] += f" (the first proposal at {first:.1f} s)"
        for label, value in (
            ("queued", self.queued_s),
            ("gate", self.gate_s),
            ("compile" + (" (cache hit)" if self.compile_cache_hit else ""), self.compile_s),
            ("compile line", self.line_s),
            ("waiting for a spare or the GPU", self.waiting_s),
            ("run", self.run_s),
        ):
            if value is not None and value >= 0.05:
                parts.append(f"{label} {value:.1f} s")
        return f"first verdict ({self.status}) at {self.verdict_s:.1f} s: " + ", ".join(p for p in parts if p)


class RunReport(_Frozen):
    """Everything ``write_report`` writes (``report.json``)."""

    run_id: str
    task_id: str | None = None
    task_name: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: StopReason | None = None
    ablations: tuple[str, ...] = ()
    """Mechanisms this run turned off (``--no-experience``, ``--uniform-experts``, ...)."""
    evaluated: int
    first_correct_s: float | None = None
    """Seconds from the run's start to its first ``correct`` verdict; ``None`` without one."""
    first_verdict: FirstVerdict | None = None
    """Where the first seconds went, up to the first verdict of any status; ``None`` without one."""
    to_90pct_best_s: float | None = None
    """Seconds from the run's start to its first clean candidate within 90% of the final best."""
    status_counts: dict[str, int]
    category_counts: dict[str, int]
    best: BestKernel | None = None
    verdict: RunVerdict = RunVerdict.NO_CORRECT_CANDIDATE
    """The best kernel against the reference (``not_faster_than_eager``: ``best_model.py`` is marked)."""
    beats_eager: bool | None = None
    """Whether the best is faster than eager PyTorch; ``None`` without a correct candidate."""
    beats_compiled: bool | None = None
    """Whether the best is faster than ``torch.compile``; ``None`` when that was not measured."""
    islands: tuple[IslandReport, ...] = ()
    experts: tuple[ExpertReport, ...] = ()
    """Per expert: requests, declines by reason, candidates, correct ones, best fitness."""
    families: tuple[FamilyReport, ...] = ()
    """Per kernel family: the first correct and the best candidate's fraction of speed-of-light."""
    credit: tuple[CreditEntry, ...] = ()
    routing: tuple[RoutingEntry, ...] = ()
    migrations: tuple[MigrationEvent, ...] = ()
    experiences: tuple[ExperienceUse, ...] = ()
    gpus: tuple[GpuUsage, ...] = ()
    """Per GPU (or unpinned evaluator): verdicts, candidates per second and busy fraction over the
    run's evaluation window (``actors.runtime.gpu_usage``)."""
    plots: dict[str, str] = {}
    isolation_gaps: dict[str, str] = {}
    """Sandbox layers that did not hold for the run's candidates (layer -> why), from the verdicts;
    empty when every layer held or was switched off by config (``--isolation best-effort`` runs)."""


def declines_sentence(islands: Sequence[IslandReport], torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID) -> str | None:
    """``the experts declined N request(s): REASON: DETAIL`` (the decline of the island that had
    the most) with a suggestion where one helps; None when no expert declined. ``--torch-ops
    reference`` is suggested only for an op the expert does not cover (the decline names it) in a
    run under another policy (``torch_ops``): it helps with nothing else (an input's dtype, the
    form of the outputs), where an LLM expert is suggested alone."""
    declined = [i for i in islands if i.last_decline is not None and i.declines]
    if not declined:
        return None
    total = sum(i.declines for i in declined)
    last = max(declined, key=lambda i: i.declines).last_decline
    assert last is not None
    text = f"the experts declined {total} request(s): {last.reason}" + (f": {last.detail}" if last.detail else "")
    llm = "an LLM expert: kfoundry expert set NAME --kind llm ..., then --experts template,NAME"
    if last.reason == DeclineReason.UNSUPPORTED and last.op is not None and torch_ops is not TorchOpsPolicy.REFERENCE:
        text += f" (try --torch-ops reference, which leaves the reference's own ops to PyTorch, or {llm})"
    elif last.reason == DeclineReason.UNSUPPORTED:
        text += f" (try {llm})"
    return text


def unanswered_sentence(experts: Sequence[ExpertReport]) -> str | None:
    """``no expert answered in time: N request(s) to NAME unanswered when the run ended`` with a
    suggestion, where requests got no reply and no expert published a candidate (a run whose budget
    ended before the template expert's first answer said only "0 evaluated"); else None."""
    if any(e.published for e in experts):
        return None
    waiting = [(e.expert, e.declined_by.get("unavailable", 0)) for e in experts]
    said = ", ".join(f"{n} request(s) to {name}" for name, n in sorted(waiting) if n)
    if not said:
        return None
    return (
        f"no expert answered in time: {said} unanswered when the run ended (an expert reads the task before "
        "its first answer, seconds on a busy machine: give the run more --seconds)"
    )


def checking_sentence(seconds: float, bound_s: float) -> str:
    """``the evaluator was still checking the task when the run ended`` (how long so far, and the
    bound after which a reference that never returns is refused): the run's budget ended first."""
    return (
        f"the evaluator was still checking the task when the run ended (its reference's first load and run: "
        f"{seconds:.0f} s so far; one that never returns is refused after {bound_s:g} s)"
    )
