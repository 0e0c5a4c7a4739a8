"""Parent selection: seeded, exploitative by tournament, exploratory with curiosity."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from actors.evolution.errors import EmptyArchive, PolicyConfigError
from actors.evolution.selection import ParentSelector, Pick
from schemas import Elite
from tests.evolution import factories as f


def _elites(n: int = 6) -> list[Elite]:
    out = []
    for k in range(n):
        c = f.candidate(params={"BLOCK_SIZE": 64 << k})
        r = f.correct(c, median_ms=1.0 / (k + 1))
        assert r.fitness is not None
        assert r.timing is not None
        out.append(Elite(candidate=c, fitness=r.fitness, median_ms=r.timing.median_ms, cell=(k,), island="i0"))
    return out


def _ids(selector: ParentSelector, elites: list[Elite], seed: int, n: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [selector.select(elites, rng)[0].candidate.candidate_id for _ in range(n)]


def test_same_seed_same_parents_and_different_seeds_differ() -> None:
    elites, selector = _elites(), ParentSelector(exploit=0.5)
    assert _ids(selector, elites, 3) == _ids(selector, elites, 3)
    assert _ids(selector, elites, 3) != _ids(selector, elites, 4)


def test_full_tournament_always_exploits_the_fittest() -> None:
    elites = _elites()
    picks = [
        ParentSelector(exploit=1.0, tournament=len(elites)).select(elites, np.random.default_rng(s)) for s in range(20)
    ]
    assert {p.candidate.candidate_id for p, _ in picks} == {max(elites, key=lambda e: e.fitness).candidate.candidate_id}
    assert {how for _, how in picks} == {Pick.EXPLOIT}


def test_exploitation_favours_fit_elites_and_exploration_spreads_over_cells() -> None:
    elites = _elites()
    fittest = max(elites, key=lambda e: e.fitness).candidate.candidate_id
    exploit = Counter(_ids(ParentSelector(exploit=1.0, tournament=3), elites, 0, 600))
    explore = Counter(_ids(ParentSelector(exploit=0.0), elites, 0, 600))
    assert exploit[fittest] > 2 * explore[fittest]
    assert len(explore) == len(elites)
    assert min(explore.values()) > 600 / len(elites) / 2


def test_curiosity_draws_rarely_visited_elites_more_often() -> None:
    elites = _elites(4)
    visits = {elites[0].candidate.candidate_id: 50}
    rng = np.random.default_rng(1)
    selector = ParentSelector(exploit=0.0, curiosity=1.0)
    counts = Counter(selector.select(elites, rng, visits=visits)[0].candidate.candidate_id for _ in range(400))
    assert counts[elites[0].candidate.candidate_id] < min(counts[e.candidate.candidate_id] for e in elites[1:]) / 5


def test_empty_archive_and_bad_settings_are_refused() -> None:
    with pytest.raises(EmptyArchive):
        ParentSelector().select([], np.random.default_rng(0))
    with pytest.raises(PolicyConfigError, match="exploit"):
        ParentSelector(exploit=1.5)
    with pytest.raises(PolicyConfigError, match="tournament"):
        ParentSelector(tournament=0)
