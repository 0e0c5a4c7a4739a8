"""Per-expert and per-family lines of the run report, so that every expert and every kernel
family shows what it earned.

- Per expert: requests, declines (by reason), proposals skipped as duplicates, candidates
  published, evaluated, left unjudged, correct ones, best fitness. Requests, declines and
  duplicates come from the islands' brains (``ExpertUsage``); the rest from the run's messages.
  The counts add up: ``published == candidates + unjudged``.
- Per family (a template family, ``template:<family>`` from the proposal's strategy, or the expert
  for other experts): the first correct candidate's and the best candidate's fraction of
  speed-of-light, with their speedups.
- The time from the run's start to 90% of its final best fitness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from actors.evolution.brain import IslandBrain
from actors.evolution.headroom import family_of
from schemas import Candidate, EvalResult, EvalStatus


class ExpertReport(BaseModel):
    """What one expert was asked and what it delivered, over every island."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expert: str
    requests: int = 0
    """Requests the islands sent it."""
    declines: int = 0
    """Requests it answered with no candidate (refused, no code, unreachable)."""
    declined_by: dict[str, int] = {}
    """Declines per reason."""
    duplicates: int = 0
    """Proposals the islands did not publish: they had the same kernel already."""
    published: int = 0
    """Its candidates on the run's stream."""
    candidates: int = 0
    """Its candidates that were evaluated."""
    unjudged: int = 0
    """Published but with no verdict: cancelled at the run's end, dead-lettered, or still in flight."""
    correct: int = 0
    """Of those, the ones with a correct verdict."""
    best_fitness: float | None = None
    """Its best clean candidate's fitness (speedup over eager); ``None`` without one."""
    islands: tuple[str, ...] = ()
    """Islands that asked it."""


@dataclass
class _Tally:
    requests: int = 0
    declines: int = 0
    declined_by: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    published: int = 0
    candidates: int = 0
    correct: int = 0
    best_fitness: float | None = None
    islands: set[str] = field(default_factory=set)


def expert_reports(
    experts: Iterable[str],
    brains: Iterable[IslandBrain],
    cands: Mapping[str, Candidate],
    results: Mapping[str, EvalResult],
) -> tuple[ExpertReport, ...]:
    """One line per expert of the run (and per other author of an evaluated candidate)."""
    tallies: dict[str, _Tally] = {name: _Tally() for name in experts}
    for brain in brains:
        for name, usage in brain.credit.usage.items():
            tally = tallies.setdefault(name, _Tally())
            tally.requests += usage.requests
            tally.declines += usage.declines
            tally.declined_by.update(usage.declined_by)
            tally.duplicates += usage.duplicates
            if usage.requests:
                tally.islands.add(brain.island)
    for published in cands.values():
        tallies.setdefault(published.expert, _Tally()).published += 1
    for cid, result in results.items():
        cand = cands.get(cid)
        if cand is None:
            continue
        tally = tallies.setdefault(cand.expert, _Tally())
        tally.candidates += 1
        tally.correct += result.status is EvalStatus.CORRECT
        fitness = result.fitness
        if fitness is not None and (tally.best_fitness is None or fitness > tally.best_fitness):
            tally.best_fitness = fitness
    return tuple(
        ExpertReport(
            expert=name,
            requests=t.requests,
            declines=t.declines,
            declined_by=dict(sorted(t.declined_by.items())),
            duplicates=t.duplicates,
            published=t.published,
            candidates=t.candidates,
            unjudged=t.published - t.candidates,
            correct=t.correct,
            best_fitness=t.best_fitness,
            islands=tuple(sorted(t.islands)),
        )
        for name, t in sorted(tallies.items())
    )


class FamilyReport(BaseModel):
    """How close to speed-of-light one kernel family started and ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str
    """``template:<family>`` for the template expert's kernels, else the expert's name."""
    candidates: int
    correct: int
    first_sol_fraction: float | None = None
    """The family's first correct candidate's fraction of the speed-of-light bound."""
    first_speedup_vs_eager: float | None = None
    best_sol_fraction: float | None = None
    """The best fraction of speed-of-light among the family's clean candidates."""
    best_speedup_vs_eager: float | None = None


def family_reports(cands: Mapping[str, Candidate], results: Mapping[str, EvalResult]) -> tuple[FamilyReport, ...]:
    """One line per family, in name order."""
    by_family: dict[str, list[EvalResult]] = {}
    for cid, result in results.items():
        if cid in cands:
            by_family.setdefault(family_of(cands[cid]), []).append(result)
    out = []
    for name, rows in sorted(by_family.items()):
        correct = sorted((r for r in rows if r.status is EvalStatus.CORRECT), key=lambda r: r.created_at)
        first = correct[0] if correct else None
        timed = [(r.sol.fraction, r) for r in rows if r.clean and r.sol is not None and r.sol.fraction is not None]
        best = max(timed, key=lambda fr: fr[0])[1] if timed else None
        out.append(
            FamilyReport(
                family=name,
                candidates=len(rows),
                correct=len(correct),
                first_sol_fraction=first.sol.fraction if first is not None and first.sol is not None else None,
                first_speedup_vs_eager=first.speedup_vs_eager if first is not None else None,
                best_sol_fraction=best.sol.fraction if best is not None and best.sol is not None else None,
                best_speedup_vs_eager=best.speedup_vs_eager if best is not None else None,
            )
        )
    return tuple(out)


def to_fraction_of_best_s(results: Iterable[EvalResult], t0: float, fraction: float = 0.9) -> float | None:
    """Seconds from ``t0`` to the first clean result within ``fraction`` of the final best fitness."""
    clean = sorted((r for r in results if r.fitness is not None), key=lambda r: r.created_at)
    if not clean:
        return None
    final = max(r.fitness or 0.0 for r in clean)
    return next(r.created_at - t0 for r in clean if (r.fitness or 0.0) >= fraction * final)
