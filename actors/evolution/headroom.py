"""Budget where the headroom is: how much a parent is worth refining, from its gap to
speed-of-light and the gain its kernel family's mutations have measurably earned.

- **Gap**: ``1 - sol_fraction`` of an elite (1 when the bound is unknown). An elite within
  ``near_sol`` of the run's target fraction is *done*: the island stops refining it, and when every
  elite is done it starts structurally different plans (fresh requests) instead.
- **Expected gain** per (family, routing key): the mean relative gain of children over their
  parents (``child / parent - 1``, 0 for a child that was slower or failed), shrunk towards an
  optimistic prior (``prior_gain`` with weight ``prior_n``) so that an untried pair gets tried.
- **Weight** of an elite as a parent: gap × expected gain of its family under its diagnosis. The
  island's parent selection draws in proportion to it (``selection.py``).

The family of a candidate is ``template:<family>`` for a template kernel (from its strategy) and the
expert's name otherwise. Pure policy, no I/O; the state serialises with the island's brain.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.credit import routing_key
from schemas import Candidate, Elite


def family_of(cand: Candidate) -> str:
    """A candidate's kernel family (``template:softmax`` from ``template:softmax/mutate.x``)."""
    strategy = cand.proposal.strategy or ""
    return strategy.split("/", 1)[0] if strategy.startswith("template:") else cand.expert


class GainStats(BaseModel):
    """Measured gains of one (family, routing key)."""

    model_config = ConfigDict(extra="forbid")

    n: int = 0
    """Children measured."""
    gain: float = 0.0
    """Sum of their relative gains over their parents (each at least 0)."""


class Headroom(BaseModel):
    """Gap to speed-of-light and measured gain per mutation; see the module docstring."""

    model_config = ConfigDict(extra="forbid")

    near_sol: float = Field(default=0.03, ge=0, le=1)
    """An elite this close to the target fraction of speed-of-light is done."""
    prior_gain: float = Field(default=0.1, ge=0)
    """Expected relative gain of a mutation before any is measured."""
    prior_n: float = Field(default=2.0, gt=0)
    """Weight of that prior, in children."""
    stats: dict[str, GainStats] = Field(default_factory=dict)
    """``family|key`` → measured gains."""

    @staticmethod
    def _key(family: str, key: str) -> str:
        return f"{family}|{key}"

    def observe(self, family: str, key: str, parent_fitness: float | None, child_fitness: float | None) -> None:
        """Record one child of a parent with a known fitness (others say nothing about mutations)."""
        if parent_fitness is None or parent_fitness <= 0:
            return
        gain = 0.0 if child_fitness is None else max(0.0, child_fitness / parent_fitness - 1.0)
        stats = self.stats.setdefault(self._key(family, key), GainStats())
        stats.n += 1
        stats.gain += gain

    def expected_gain(self, family: str, key: str) -> float:
        """Posterior mean relative gain of refining a ``family`` parent diagnosed ``key``."""
        stats = self.stats.get(self._key(family, key), GainStats())
        return (self.prior_gain * self.prior_n + stats.gain) / (self.prior_n + stats.n)

    def done(self, elite: Elite, target: float) -> bool:
        """Whether an elite is within ``near_sol`` of the target fraction of speed-of-light."""
        return elite.sol_fraction is not None and elite.sol_fraction >= min(1.0, target) - self.near_sol

    def weight(self, elite: Elite) -> float:
        """Gap to speed-of-light × expected gain: what refining this elite is worth."""
        gap = 1.0 if elite.sol_fraction is None else max(0.0, 1.0 - elite.sol_fraction)
        key = routing_key(elite.diagnosis) if elite.diagnosis is not None else "refine"
        return gap * self.expected_gain(family_of(elite.candidate), key)
