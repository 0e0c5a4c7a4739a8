"""Migration policy: which elites move from which island to which, and when.

- ``ring`` (default): every ``interval_s`` each island sends its ``count`` best elites to the next
  island (islands in sorted order, the last sends to the first);
- ``random``: the destination is a seeded random other island;
- stagnation: as soon as an island reports that it stagnates (and ``on_stagnation`` is set), the
  island with the fittest elite sends it its best.

The planner learns elites from ``EliteAnnouncement`` messages and stagnation from
``IslandStatus``; it never resends an elite to an island that already got it. Migrants travel as
they are (``Elite`` with candidate, lineage, measured result and diagnosis), so lineage survives
migration. Pure: the migrator actor publishes what it returns.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.errors import PolicyConfigError
from schemas import Elite, EliteAnnouncement, IslandStatus, Migration, MigrationPolicy, MigrationReason


def ring_next(islands: Sequence[str], source: str) -> str:
    """The island after ``source`` in sorted order, wrapping around."""
    order = sorted(islands)
    return order[(order.index(source) + 1) % len(order)]


def choose_migrants(
    elites: Sequence[Elite], count: int, *, exclude: set[str] | frozenset[str] = frozenset()
) -> tuple[Elite, ...]:
    """The ``count`` fittest elites whose candidates are not in ``exclude``."""
    fresh = [e for e in elites if e.candidate.candidate_id not in exclude]
    fresh.sort(key=lambda e: (-e.fitness, e.found_at, e.candidate.candidate_id))
    return tuple(fresh[:count])


class PlannerState(BaseModel):
    """The serialised planner."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    """Run it plans for."""
    islands: tuple[str, ...]
    """Islands of the run."""
    policy: MigrationPolicy
    """Topology, interval, count, stagnation trigger."""
    keep: int = Field(ge=1)
    """Elites remembered per island."""
    elites: dict[str, list[Elite]] = Field(default_factory=dict)
    """Best known elites per island."""
    sent: dict[str, list[str]] = Field(default_factory=dict)
    """Candidate ids already sent per destination."""
    stagnating: dict[str, bool] = Field(default_factory=dict)
    """Last reported stagnation per island."""
    last_at: float | None = None
    """When the last scheduled migration round ran."""
    seq: int = 0
    """Migrations planned so far (part of their ids)."""
    rng: dict[str, Any]
    """State of the planner's generator."""


class MigrationPlanner:
    """Plans migrations between the islands of one run; see the module docstring."""

    def __init__(
        self, run_id: str, islands: Sequence[str], policy: MigrationPolicy, seed: int, *, keep: int = 8
    ) -> None:
        if len(set(islands)) != len(islands) or not islands:
            raise PolicyConfigError("islands", list(islands), "need at least one island, each named once")
        if keep < policy.count:
            raise PolicyConfigError("keep", keep, f"must be >= migration count {policy.count}")
        if policy.topology is MigrationReason.STAGNATION:
            raise PolicyConfigError("topology", policy.topology, "use ring or random; stagnation is on_stagnation")
        self.run_id = run_id
        self.islands = tuple(sorted(islands))
        self.policy = policy
        self.keep = keep
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
        self.elites: dict[str, list[Elite]] = {i: [] for i in self.islands}
        self.sent: dict[str, set[str]] = {i: set() for i in self.islands}
        self.stagnating: dict[str, bool] = dict.fromkeys(self.islands, False)
        self.last_at: float | None = None
        self.seq = 0

    def on_elite(self, announcement: EliteAnnouncement) -> None:
        """Remember a new elite of its island (the best ``keep`` are kept)."""
        elite = announcement.elite
        if elite.island not in self.elites:
            return
        known = [e for e in self.elites[elite.island] if e.candidate.candidate_id != elite.candidate.candidate_id]
        known.append(elite)
        self.elites[elite.island] = list(choose_migrants(known, self.keep))

    def on_status(self, status: IslandStatus) -> list[Migration]:
        """Track stagnation; a newly stagnant island receives the best elite of the others."""
        island = status.island
        if island not in self.stagnating:
            return []
        rising = status.stagnating and not self.stagnating[island]
        self.stagnating[island] = status.stagnating
        if not (rising and self.policy.on_stagnation) or len(self.islands) < 2:
            return []
        donors = [
            (best[0].fitness, other)
            for other in self.islands
            if other != island and (best := choose_migrants(self.elites[other], 1, exclude=self.sent[island]))
        ]
        if not donors:
            return []
        source = max(donors)[1]
        migration = self._migrate(source, island, MigrationReason.STAGNATION)
        return [migration] if migration is not None else []

    def destination(self, source: str, present: Collection[str] | None = None) -> str | None:
        """Where ``source`` sends its migrants by the configured topology, among the islands
        ``present`` (default: all of the run's); ``None`` when no other island is present."""
        islands = [i for i in self.islands if present is None or i in present or i == source]
        if len(islands) < 2:
            return None
        if self.policy.topology is MigrationReason.RING:
            return ring_next(islands, source)
        others = [i for i in islands if i != source]
        return others[int(self.rng.integers(len(others)))]

    def due(self, now: float, present: Collection[str] | None = None) -> list[Migration]:
        """The scheduled migrations at ``now`` (none before ``interval_s`` has passed), between
        the islands ``present`` (those that announced themselves; default: all of the run's)."""
        if self.last_at is None:
            self.last_at = now
            return []
        if now - self.last_at < self.policy.interval_s or len(self.islands) < 2:
            return []
        self.last_at = now
        out: list[Migration] = []
        for source in self.islands:
            if not self.elites[source]:
                continue
            dest = self.destination(source, present)
            if dest is None:
                continue
            migration = self._migrate(source, dest, self.policy.topology)
            if migration is not None:
                out.append(migration)
        return out

    def _migrate(self, source: str, dest: str, reason: MigrationReason) -> Migration | None:
        migrants = choose_migrants(self.elites[source], self.policy.count, exclude=self.sent[dest])
        if not migrants:
            return None
        self.sent[dest].update(e.candidate.candidate_id for e in migrants)
        self.seq += 1
        return Migration(
            migration_id=f"{self.run_id}-m{self.seq}-{source}-{dest}",
            run_id=self.run_id,
            source_island=source,
            dest_island=dest,
            reason=reason,
            elites=migrants,
        )

    def state(self) -> PlannerState:
        """The planner as a serialisable value."""
        return PlannerState(
            run_id=self.run_id,
            islands=self.islands,
            policy=self.policy,
            keep=self.keep,
            elites={k: list(v) for k, v in self.elites.items()},
            sent={k: sorted(v) for k, v in self.sent.items()},
            stagnating=dict(self.stagnating),
            last_at=self.last_at,
            seq=self.seq,
            rng=dict(self.rng.bit_generator.state),
        )

    @classmethod
    def from_state(cls, state: PlannerState) -> MigrationPlanner:
        """Rebuild a planner that continues where ``state`` was taken."""
        planner = cls(state.run_id, state.islands, state.policy, 0, keep=state.keep)
        planner.rng.bit_generator.state = state.rng
        planner.elites = {k: list(v) for k, v in state.elites.items()}
        planner.sent = {k: set(v) for k, v in state.sent.items()}
        planner.stagnating = dict(state.stagnating)
        planner.last_at, planner.seq = state.last_at, state.seq
        return planner

    def to_json(self) -> str:
        """JSON text of the planner."""
        return self.state().model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> MigrationPlanner:
        """Rebuild a planner from :meth:`to_json` text."""
        return cls.from_state(PlannerState.model_validate_json(text))
