"""Per-expert lines of the run report: requests, declines (by reason), candidates, correct ones
and the best fitness each expert reached, so that every expert shows what it earned.

Requests and declines come from the islands' brains (each counts what it asked and how the
expert answered, ``ExpertUsage``); candidates, verdicts and fitness come from the run's messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from actors.evolution.island import IslandBrain
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
    candidates: int = 0
    """Its candidates that were evaluated."""
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
            if usage.requests:
                tally.islands.add(brain.island)
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
            candidates=t.candidates,
            correct=t.correct,
            best_fitness=t.best_fitness,
            islands=tuple(sorted(t.islands)),
        )
        for name, t in sorted(tallies.items())
    )
