"""Parent selection: exploitation (a tournament among elites) mixed with exploration.

Exploration draws an elite uniformly over cells, down-weighting elites that have been chosen
often already (``curiosity``), so every niche of the archive keeps being tried. An optional worth
per elite (its headroom, ``headroom.py``) weights both draws. Every draw comes
from the caller's seeded ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from actors.evolution.errors import EmptyArchive, PolicyConfigError
from schemas import Elite


class Pick(StrEnum):
    """How a parent was chosen."""

    EXPLOIT = "exploit"
    EXPLORE = "explore"


@dataclass(frozen=True)
class ParentSelector:
    """Chooses a parent among elites; see the module docstring."""

    exploit: float = 0.7
    """Probability of a tournament (exploitation) rather than an exploratory draw."""
    tournament: int = 3
    """Elites drawn into a tournament; the fittest wins."""
    curiosity: float = 0.5
    """Exploration weight of an elite is (1 + times chosen) ** -curiosity."""

    def __post_init__(self) -> None:
        if not 0 <= self.exploit <= 1:
            raise PolicyConfigError("exploit", self.exploit, "must be in [0, 1]")
        if self.tournament < 1:
            raise PolicyConfigError("tournament", self.tournament, "must be >= 1")
        if self.curiosity < 0:
            raise PolicyConfigError("curiosity", self.curiosity, "must be >= 0")

    def select(
        self,
        elites: Sequence[Elite],
        rng: np.random.Generator,
        *,
        visits: Mapping[str, int] | None = None,
        exploit: float | None = None,
        worth: Sequence[float] | None = None,
    ) -> tuple[Elite, Pick]:
        """A parent and how it was picked; ``exploit`` overrides the configured probability.
        ``worth`` (one non-negative value per elite, e.g. its headroom) weights both the
        tournament's draw and the exploratory draw; all zero counts as uniform."""
        if not elites:
            raise EmptyArchive("no elite to select a parent from")
        value = np.ones(len(elites)) if worth is None else np.clip(np.asarray(worth, dtype=float), 0.0, None)
        if len(value) != len(elites):
            raise PolicyConfigError("worth", len(value), f"needs one value per elite ({len(elites)})")
        if not value.sum() > 0:
            value = np.ones(len(elites))
        p = self.exploit if exploit is None else exploit
        if rng.random() < p:
            k = min(self.tournament, int(np.count_nonzero(value)))
            drawn = rng.choice(len(elites), size=k, replace=False, p=value / value.sum())
            winner = max((elites[int(i)] for i in drawn), key=lambda e: (e.fitness, -e.found_at))
            return winner, Pick.EXPLOIT
        seen = visits or {}
        weights = value * np.array([(1.0 + seen.get(e.candidate.candidate_id, 0)) ** -self.curiosity for e in elites])
        index = int(rng.choice(len(elites), p=weights / weights.sum()))
        return elites[index], Pick.EXPLORE
