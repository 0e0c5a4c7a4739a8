"""The run report: what a run did and why, as JSON and PNG plots in the run directory.

``build_report`` reads the run's decoded wire messages (``Candidate``, ``EvalResult``,
``Diagnosis``, ``Feedback``, ``Migration``, ``IslandStatus``, ``RunEnd``, ``ExperienceOutcome``;
others are ignored) and each island's final ``IslandBrain`` and gathers: the best kernel with
its lineage (ids, experts, strategies, the diagnosis each step answered, fitness along the way),
fitness over time per island, each island's archive as a heatmap grid, the credit per diagnosis
and expert, how diagnoses routed requests to experts and what that earned, the migrations, the
experiences shown to experts with their outcomes, and counts per status and category.
``write_report`` writes ``report.json``, ``fitness.png``, ``archive.png`` and ``credit.png``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from actors.commands.outcome import beats, verdict_of
from actors.evolution.amdahl import breakdown
from actors.evolution.brain import IslandBrain
from actors.evolution.errors import StateError
from actors.report.experts import (
    expert_reports,
    family_reports,
    to_fraction_of_best_s,
)
from actors.report.model import (
    ArchiveMap,
    BestKernel,
    CreditEntry,
    ExperienceUse,
    FirstVerdict,
    FitnessSample,
    IslandReport,
    LineageStep,
    MigrationEvent,
    RoutingEntry,
    RunReport,
)
from actors.report.plots import plot_credit, plot_fitness, plot_heatmaps
from actors.runtime.gpu_usage import gpu_usage
from schemas import (
    Candidate,
    DeviceChoice,
    DeviceKind,
    Diagnosis,
    EvalResult,
    EvalStatus,
    ExperienceOutcome,
    Feedback,
    IslandStatus,
    Message,
    Migration,
    RunEnd,
    RunSpec,
)


def isolation_gaps(results: Iterable[EvalResult]) -> dict[str, str]:
    """The sandbox layers some verdict names as skipped (not by config), with the first reason."""
    from gpu_runner.confine.policy import LAYERS

    gaps: dict[str, str] = {}
    for result in results:
        for check in result.checks:
            detail = check.detail or ""
            if check.name in LAYERS and detail.startswith("skipped") and not detail.endswith("disabled by config"):
                gaps.setdefault(check.name, detail.removeprefix("skipped: "))
    return dict(sorted(gaps.items()))


def isolation_warning(report_path: Path) -> str | None:
    """The warning a run's summary ends with when candidates ran with sandbox layers missing."""
    try:
        gaps = RunReport.model_validate_json(report_path.read_text()).isolation_gaps
    except (OSError, ValueError):
        return None
    if not gaps:
        return None
    said = "; ".join(f"{k}: {v}" for k, v in gaps.items())
    return f"warning: candidates ran without these sandbox layers (isolation best-effort): {said}"


def _improved(child: EvalResult | None, parent: EvalResult | None) -> bool:
    if child is None or child.fitness is None:
        return False
    return parent is None or parent.fitness is None or child.fitness > parent.fitness


def build_report(
    spec: RunSpec | None,
    messages: Iterable[Message],
    brains: Mapping[str, IslandBrain | str] | Iterable[IslandBrain] = (),
) -> RunReport:
    """Gather the run report from the run's messages and the islands' final brains.

    ``brains`` maps island → ``IslandBrain`` or its ``to_json`` text (as kept in the archive KV
    bucket; restoring text needs ``spec``), or is a plain iterable of brains.
    """
    by_island: dict[str, IslandBrain] = {}
    for name, brain in brains.items() if isinstance(brains, Mapping) else ((b.island, b) for b in brains):
        if isinstance(brain, str):
            if spec is None:
                raise StateError(f"the saved brain of island {name!r} needs the run spec to be restored")
            brain = IslandBrain.from_json(brain, spec)
        by_island[name] = brain
    cands: dict[str, Candidate] = {}
    results: dict[str, EvalResult] = {}
    diags: dict[str, Diagnosis] = {}
    statuses: dict[str, IslandStatus] = {}
    migrations: list[Migration] = []
    outcomes: list[ExperienceOutcome] = []
    end: RunEnd | None = None
    for msg in messages:
        if isinstance(msg, Feedback):
            if msg.candidate is not None:  # version 1 feedback carried it (the stream has it anyway)
                cands[msg.candidate_id] = msg.candidate
            diags[msg.candidate_id] = msg.diagnosis
            results[msg.candidate_id] = msg.result
        elif isinstance(msg, Candidate):
            cands[msg.candidate_id] = msg
        elif isinstance(msg, EvalResult):
            results[msg.candidate_id] = msg
        elif isinstance(msg, Diagnosis):
            diags[msg.candidate_id] = msg
        elif isinstance(msg, IslandStatus):
            statuses[msg.island] = msg
        elif isinstance(msg, Migration):
            migrations.append(msg)
        elif isinstance(msg, ExperienceOutcome):
            outcomes.append(msg)
        elif isinstance(msg, RunEnd):
            end = msg
    times = [r.created_at for r in results.values()] + [c.created_at for c in cands.values()]
    t0 = spec.created_at if spec is not None else min(times, default=0.0)
    run_id = spec.run_id if spec else end.run_id if end else next(iter(results.values())).run_id if results else ""
    islands = sorted(set(by_island) | {c.island for c in cands.values()} | set(statuses))
    best = _best(cands, results)
    return RunReport(
        run_id=run_id,
        task_id=spec.task.task_id if spec else None,
        task_name=spec.task.name if spec else None,
        started_at=t0,
        ended_at=end.at if end else max(times, default=None),
        end_reason=end.reason if end else None,
        ablations=spec.ablations.active() if spec else (),
        evaluated=len(results),
        first_correct_s=min(
            (r.created_at - t0 for r in results.values() if r.status is EvalStatus.CORRECT), default=None
        ),
        first_verdict=first_verdict(cands, results, t0),
        status_counts=dict(sorted(Counter(r.status.value for r in results.values()).items())),
        category_counts=dict(sorted(Counter(d.category.value for d in diags.values()).items())),
        best=best,
        verdict=verdict_of(best.speedup_vs_eager if best else None, _device(spec, results, best)),
        beats_eager=beats(best.speedup_vs_eager) if best else None,
        beats_compiled=beats(best.speedup_vs_compiled) if best else None,
        islands=tuple(_island(i, by_island.get(i), statuses.get(i), results, t0) for i in islands),
        to_90pct_best_s=to_fraction_of_best_s(results.values(), t0),
        families=family_reports(cands, results),
        experts=expert_reports((e.name for e in spec.experts) if spec else (), by_island.values(), cands, results),
        credit=tuple(
            CreditEntry(island=i, **row.model_dump(exclude={"prior_mean"}))
            for i in sorted(by_island)
            for row in by_island[i].credit_table()
        ),
        routing=_routing(cands, results),
        migrations=tuple(
            MigrationEvent(
                migration_id=m.migration_id,
                source=m.source_island,
                dest=m.dest_island,
                reason=m.reason,
                candidate_ids=tuple(e.candidate.candidate_id for e in m.elites),
                t=m.created_at - t0,
            )
            for m in sorted(migrations, key=lambda m: m.created_at)
        ),
        experiences=_experiences(cands, results, outcomes),
        isolation_gaps=isolation_gaps(results.values()),
        gpus=gpu_usage(results.values()),
    )


def first_verdict(cands: Mapping[str, Candidate], results: Mapping[str, EvalResult], t0: float) -> FirstVerdict | None:
    """Where the run's first seconds went, up to its first verdict (``None`` without one)."""
    if not results:
        return None
    first = min(results.values(), key=lambda r: r.created_at)
    cand = cands.get(first.candidate_id)
    st = first.stages
    received = first.created_at - st.total_s if st.total_s is not None else None
    parts = [st.gate_s, st.compile_s, st.line_s, st.run_s]
    waiting = st.total_s - sum(x for x in parts if x is not None) if st.total_s is not None else None
    return FirstVerdict(
        candidate_id=first.candidate_id,
        status=first.status.value,
        first_proposal_s=min((c.created_at - t0 for c in cands.values()), default=None),
        proposed_s=cand.created_at - t0 if cand is not None else None,
        queued_s=max(0.0, received - cand.created_at) if received is not None and cand is not None else None,
        gate_s=st.gate_s,
        compile_s=st.compile_s,
        compile_cache_hit=st.compile_cache_hit,
        line_s=st.line_s,
        run_s=st.run_s,
        waiting_s=max(0.0, waiting) if waiting is not None else None,
        verdict_s=first.created_at - t0,
    )


def _device(spec: RunSpec | None, results: Mapping[str, EvalResult], best: BestKernel | None) -> DeviceChoice:
    """The device the run timed on: its spec's, else the best result's."""
    if spec is not None and spec.device is not DeviceChoice.AUTO:
        return spec.device
    info = results[best.candidate_id].device if best is not None and best.candidate_id in results else None
    return DeviceChoice.CPU if info is not None and info.kind is DeviceKind.CPU else DeviceChoice.CUDA


def compiled_ratio(results: Iterable[EvalResult]) -> tuple[float, int] | None:
    """torch.compile's speedup over eager (eager median / compiled median) as the run's verdicts
    timed beside both measured it: their median, and how many (None where none did)."""
    ratios = sorted(
        r.baselines.eager.median_ms / r.baselines.compiled.median_ms
        for r in results
        if r.baselines is not None
        and r.baselines.eager is not None
        and r.baselines.compiled is not None
        and r.baselines.compiled.median_ms > 0
    )
    return (statistics.median(ratios), len(ratios)) if ratios else None


def _vs_compiled_of(result: EvalResult, results: Iterable[EvalResult]) -> tuple[float | None, str | None]:
    """``result``'s speedup over torch.compile, and how it was derived where it was not timed
    beside it (None: timed beside it, or not known): a verdict reached before the baseline was
    ready (it is built beside the referee) gets the run's measured ratio (:func:`compiled_ratio`)."""
    if result.speedup_vs_compiled is not None:
        derived = (result.baselines.compiled_error if result.baselines else None) if result.compiled_derived else None
        return result.speedup_vs_compiled, derived
    ratio = compiled_ratio(results)
    if result.speedup_vs_eager is None or ratio is None:
        return None, None
    b = result.baselines
    why = b.compiled_error if b is not None and b.compiled_error else "not timed beside it"
    derived = (
        f"{result.speedup_vs_eager:.3g}x eager over torch.compile's own speedup over eager, {ratio[0]:.3g}x "
        f"(median of the {ratio[1]} verdicts timed beside both); the best itself: {why}"
    )
    return result.speedup_vs_eager / ratio[0], derived


def _best(cands: Mapping[str, Candidate], results: Mapping[str, EvalResult]) -> BestKernel | None:
    clean = [r for r in results.values() if r.fitness is not None and r.candidate_id in cands]
    if not clean:
        return None
    top = max(clean, key=lambda r: (r.fitness or 0.0, -r.created_at))
    cand = cands[top.candidate_id]
    steps = []
    for cid in (*cand.lineage, cand.candidate_id):
        c, r = cands.get(cid), results.get(cid)
        steps.append(
            LineageStep(
                candidate_id=cid,
                island=c.island if c else None,
                expert=c.expert if c else None,
                strategy=c.proposal.strategy if c else None,
                generation=c.generation if c else None,
                answered=c.diagnosis.category if c and c.diagnosis else None,
                status=r.status.value if r else None,
                fitness=r.fitness if r else None,
                description=c.proposal.description if c else None,
            )
        )
    assert top.fitness is not None
    vs_compiled, derived = _vs_compiled_of(top, results.values())
    return BestKernel(
        candidate_id=cand.candidate_id,
        island=cand.island,
        expert=cand.expert,
        fitness=top.fitness,
        speedup_vs_eager=top.speedup_vs_eager,
        speedup_vs_compiled=vs_compiled,
        compiled_derived=derived,
        median_ms=top.timing.median_ms if top.timing else None,
        sol_fraction=top.sol.fraction if top.sol else None,
        language=cand.proposal.language,
        source=cand.proposal.source,
        lineage=tuple(steps),
        torch_ops=top.torch_ops,
        precision=top.correctness.precision.value if top.correctness else None,
        err_vs_fp64=top.correctness.err_vs_fp64 if top.correctness else None,
        ref_err_vs_fp64=top.correctness.ref_err_vs_fp64 if top.correctness else None,
        ref_default_err_vs_fp64=top.correctness.ref_default_err_vs_fp64 if top.correctness else None,
        held_out=top.correctness.held_out if top.correctness else (),
        held_out_note=top.correctness.held_out_note if top.correctness else None,
        time_breakdown=breakdown(top),
    )


def _island(
    island: str, brain: IslandBrain | None, status: IslandStatus | None, results: Mapping[str, EvalResult], t0: float
) -> IslandReport:
    archive: ArchiveMap | None = None
    if brain is not None:
        samples = tuple(
            FitnessSample(t=p.at - t0, **p.model_dump(exclude={"at", "key"})) for p in brain.fitness_history
        )
        axes = brain.archive.descriptors.descriptors
        x, y = brain.archive.spread_axes()
        ax_x, ax_y = axes[x], axes[y] if y != x else None
        archive = ArchiveMap(
            x=ax_x.kind.value,
            y=ax_y.kind.value if ax_y else "",
            x_labels=ax_x.labels(),
            y_labels=ax_y.labels() if ax_y else ("",),
            grid=tuple(tuple(row) for row in brain.archive.grid(x, y)),
            elites=len(brain.archive),
            coverage=brain.archive.coverage(),
        )
    else:  # no brain: rebuild the course from the island's results
        best: float | None = None
        points = []
        for r in sorted((r for r in results.values() if r.island == island), key=lambda r: r.created_at):
            best = r.fitness if r.fitness is not None and (best is None or r.fitness > best) else best
            points.append(
                FitnessSample(
                    t=r.created_at - t0,
                    candidate_id=r.candidate_id,
                    status=r.status.value,
                    fitness=r.fitness,
                    best=best,
                )
            )
        samples = tuple(points)
    bests = [s.best for s in samples if s.best is not None]
    return IslandReport(
        island=island,
        evaluated=sum(1 for s in samples if not s.migrant),
        best_fitness=max(bests) if bests else (status.best_fitness if status else None),
        stopped=status.stopped if status else None,
        declines=status.declines if status else 0,
        last_decline=status.last_decline if status else None,
        fitness=samples,
        archive=archive,
    )


def _routing(cands: Mapping[str, Candidate], results: Mapping[str, EvalResult]) -> tuple[RoutingEntry, ...]:
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for cid, c in cands.items():
        if cid not in results:
            continue
        answered = c.diagnosis.category.value if c.diagnosis else "start"
        row = table[(answered, c.expert)]
        child, parent = results[cid], results.get(c.parent_id) if c.parent_id else None
        row[0] += 1
        row[1] += child.clean
        row[2] += _improved(child, parent)
    return tuple(
        RoutingEntry(answered=a, expert=e, candidates=n, clean=k, improved=i)
        for (a, e), (n, k, i) in sorted(table.items())
    )


def _experiences(
    cands: Mapping[str, Candidate], results: Mapping[str, EvalResult], outcomes: Iterable[ExperienceOutcome]
) -> tuple[ExperienceUse, ...]:
    told = {o.candidate_id: o for o in outcomes}
    used: dict[str, list[tuple[str, bool, float | None]]] = defaultdict(list)
    for cid, c in cands.items():
        if not c.experience_ids:
            continue
        if cid in told:
            improved, delta = told[cid].improved, told[cid].delta
        else:
            parent = results.get(c.parent_id) if c.parent_id else None
            child = results.get(cid)
            improved = _improved(child, parent)
            delta = (child.fitness or 0.0) - (parent.fitness or 0.0) if child and parent else None
        for eid in c.experience_ids:
            used[eid].append((cid, improved, delta))
    out = []
    for eid in sorted(used):
        rows = used[eid]
        deltas = [d for _, _, d in rows if d is not None]
        out.append(
            ExperienceUse(
                experience_id=eid,
                candidates=tuple(cid for cid, _, _ in rows),
                improved=sum(1 for _, ok, _ in rows if ok),
                not_improved=sum(1 for _, ok, _ in rows if not ok),
                mean_delta=sum(deltas) / len(deltas) if deltas else None,
            )
        )
    return tuple(out)


def write_report(report: RunReport, run_dir: Path) -> tuple[Path, ...]:
    """Write ``report.json`` and the PNG plots into ``run_dir``; returns the paths written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    best = {i.island: [(s.t, s.best) for s in i.fitness] for i in report.islands}
    each = {i.island: [(s.t, s.fitness) for s in i.fitness if not s.migrant] for i in report.islands}
    paths = [plot_fitness(best, each, run_dir / "fitness.png")]
    maps = {i.island: i.archive for i in report.islands if i.archive is not None}
    if maps:
        first = next(iter(maps.values()))
        grids = {k: v.grid for k, v in maps.items()}
        paths.append(plot_heatmaps(grids, first.x_labels, first.y_labels, (first.x, first.y), run_dir / "archive.png"))
    if report.credit:
        keys = sorted({c.key for c in report.credit})
        experts = sorted({c.expert for c in report.credit})
        pulls = [[0] * len(experts) for _ in keys]
        reward = [[0.0] * len(experts) for _ in keys]
        for c in report.credit:
            r, e = keys.index(c.key), experts.index(c.expert)
            pulls[r][e] += c.pulls
            reward[r][e] += (c.mean_reward or 0.0) * c.pulls
        mean = [
            [reward[r][e] / pulls[r][e] if pulls[r][e] else None for e in range(len(experts))] for r in range(len(keys))
        ]
        paths.append(plot_credit(keys, experts, mean, pulls, run_dir / "credit.png"))
    final = report.model_copy(update={"plots": {p.stem: p.name for p in paths}})
    out = run_dir / "report.json"
    out.write_text(final.model_dump_json(indent=2))
    return (out, *paths)
