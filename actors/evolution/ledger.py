"""The island's bookkeeping without I/O: candidates awaiting feedback, overdue ones, the retrieval
cache, and the experience records a feedback yields.

The island brain owns one ``InFlightLedger`` and one ``RetrievalCache``; the island actor tells
them what it published and received (with the monotonic clock) and publishes what
:func:`experience_of` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import Experience, ExperienceHit, ExperienceOutcome, Feedback, TaskSignature

EXCERPT_CHARS = 4000
"""Characters of a candidate's source kept in its experience record."""

RESTARTED = "(from before a restart)"
"""Stands for a candidate in flight before a restart, whose id this process never saw."""


@dataclass
class InFlightLedger:
    """Published candidates awaiting feedback, and requests being planned."""

    outstanding: dict[str, float] = field(default_factory=dict)
    """Candidate id → when it was published (monotonic seconds)."""
    planning: int = 0
    """Candidates asked of experts and not yet published or given up."""
    last_feedback: float = 0.0
    """When the last feedback arrived (monotonic seconds; 0: none yet, the ledger's start counts)."""

    def published(self, candidate_id: str, at: float) -> None:
        self.outstanding[candidate_id] = at

    def answered(self, candidate_id: str, at: float) -> None:
        self.outstanding.pop(candidate_id, None)
        self.last_feedback = at

    def overdue(self, now: float, horizon_s: float, in_flight: int, restart_s: float | None = None) -> list[str]:
        """Candidates whose feedback is overdue (dead-lettered, or published before a restart and
        lost), forgotten here: otherwise they would hold slots of K for ever. ``in_flight`` is the
        brain's count; what it counts beyond the ledger came from before a restart, and is given
        up once feedback has been silent for ``restart_s`` (``horizon_s`` by default): the restored
        count may include candidates whose feedback the previous process had already taken."""
        lost = [cid for cid, at in self.outstanding.items() if now - at > horizon_s]
        for cid in lost:
            del self.outstanding[cid]
        untracked = in_flight - len(lost) - len(self.outstanding) - self.planning
        limit = horizon_s if restart_s is None else min(horizon_s, restart_s)
        if now - self.last_feedback > limit and untracked > 0:
            lost.extend([RESTARTED] * untracked)
        return lost


@dataclass
class RetrievalCache:
    """Experiences retrieved per diagnosis category, kept for ``ttl_s``: the library changes
    slowly next to the rate at which a fast island asks."""

    ttl_s: float = 5.0
    _hits: dict[str, tuple[float, tuple[ExperienceHit, ...]]] = field(default_factory=dict)

    def get(self, key: str, now: float) -> tuple[ExperienceHit, ...] | None:
        cached = self._hits.get(key)
        if cached is None or now - cached[0] >= self.ttl_s:
            return None
        return cached[1]

    def put(self, key: str, hits: tuple[ExperienceHit, ...], now: float) -> None:
        self._hits[key] = (now, hits)


def experience_of(
    fb: Feedback, signature: TaskSignature, parent_fitness: float | None
) -> tuple[Experience, ExperienceOutcome | None]:
    """The experience record of one evaluated candidate, and the outcome of the experiences it
    was made with (``None`` when it was made with none)."""
    cand, result = fb.judged(), fb.result
    child = result.fitness
    record = Experience(
        experience_id=f"exp-{cand.candidate_id}",
        run_id=cand.run_id,
        task_id=cand.task_id,
        signature=signature,
        candidate_id=cand.candidate_id,
        parent_id=cand.parent_id,
        diagnosis=cand.diagnosis.category if cand.diagnosis else None,
        expert=cand.expert,
        strategy=cand.proposal.strategy,
        status=result.status,
        parent_fitness=parent_fitness,
        child_fitness=child,
        description=(cand.proposal.description or cand.proposal.strategy or "candidate")[:500]
        + f" -> {result.status.value}: {fb.diagnosis.summary}"[:300],
        params=dict(cand.proposal.params),
        source_excerpt=cand.proposal.source[:EXCERPT_CHARS],
    )
    if not cand.experience_ids:
        return record, None
    improved = child is not None and (parent_fitness is None or child > parent_fitness)
    delta = None if child is None and parent_fitness is None else (child or 0.0) - (parent_fitness or 0.0)
    outcome = ExperienceOutcome(
        outcome_id=f"out-{cand.candidate_id}",
        experience_ids=cand.experience_ids,
        candidate_id=cand.candidate_id,
        improved=improved,
        delta=delta,
    )
    return record, outcome
