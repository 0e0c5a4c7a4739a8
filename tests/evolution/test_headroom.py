"""Budget where the headroom is: parents are drawn by gap to speed-of-light times measured gain,
elites near speed-of-light are no longer refined, and the measured gains survive a restart."""

from __future__ import annotations

from collections import Counter

import pytest

from actors.evolution.brain import IslandBrain, IslandConfig, ParentSource
from actors.evolution.credit import ExpertProfile
from actors.evolution.headroom import Headroom, family_of
from schemas import Candidate, DiagnosisCategory, Role
from tests.evolution import factories as f

EXPERTS = (ExpertProfile(name="template", role=Role.TEMPLATE),)


def _cand(block: int, strategy: str = "template:gelu/default") -> Candidate:
    cand = f.candidate(params={"BLOCK_SIZE": block, "num_warps": 4})
    return cand.model_copy(update={"proposal": cand.proposal.model_copy(update={"strategy": strategy})})


def _brain(elites: list[tuple[int, float, float, str]], **config: object) -> tuple[IslandBrain, dict[int, str]]:
    """A brain whose archive holds one elite per (block, median ms, fraction of SOL, strategy)."""
    config_ = IslandConfig.model_validate(config)
    brain = IslandBrain("i0", f.spec(target_sol_fraction=1.0), EXPERTS, seed=4, config=config_)
    ids = {}
    for block, median, sol, strategy in elites:
        cand = _cand(block, strategy)
        result = f.correct(cand, median, bound_ms=sol * median)
        brain.on_feedback(f.feedback(cand, result, f.diagnosis(cand, DiagnosisCategory.SLOW_MEMORY_BOUND)))
        ids[block] = cand.candidate_id
    assert len(brain.archive) == len(elites), "the test elites must sit in different cells"
    return brain, ids


def _parents(brain: IslandBrain, n: int = 300) -> tuple[Counter[str], Counter[ParentSource]]:
    parents: Counter[str] = Counter()
    sources: Counter[ParentSource] = Counter()
    for _ in range(n):
        plan = brain.next_request()
        sources[plan.source] += 1
        if plan.parent is not None and plan.source in (ParentSource.EXPLOIT, ParentSource.EXPLORE):
            parents[plan.parent.candidate_id] += 1
    return parents, sources


def test_expected_gain_follows_measured_gains_from_an_optimistic_prior() -> None:
    room = Headroom()
    assert room.expected_gain("template:a", "slow.memory_bound") == pytest.approx(room.prior_gain)
    for _ in range(6):
        room.observe("template:a", "slow.memory_bound", 1.0, 1.5)  # +50% each
        room.observe("template:b", "slow.memory_bound", 1.0, 0.9)  # slower: no gain
        room.observe("template:b", "slow.memory_bound", 1.0, None)  # failed: no gain
    room.observe("template:c", "start", None, 2.0)  # no measured parent: says nothing
    assert room.expected_gain("template:a", "slow.memory_bound") > 0.3
    assert room.expected_gain("template:b", "slow.memory_bound") < room.prior_gain / 3
    assert room.stats.keys() == {"template:a|slow.memory_bound", "template:b|slow.memory_bound"}


def test_an_elite_near_speed_of_light_is_not_refined_and_others_are() -> None:
    brain, ids = _brain([(1024, 0.1, 0.98, "template:gelu/a"), (64, 0.2, 0.3, "template:gelu/b")])
    parents, _ = _parents(brain)
    assert parents[ids[1024]] == 0
    assert parents[ids[64]] > 100
    off, ids_off = _brain([(1024, 0.1, 0.98, "template:gelu/a"), (64, 0.2, 0.3, "template:gelu/b")], headroom=False)
    assert _parents(off)[0][ids_off[1024]] > 50  # without headroom the fitter elite is refined most


def test_when_every_elite_is_near_speed_of_light_the_island_asks_for_other_plans() -> None:
    brain, _ = _brain([(1024, 0.1, 0.99, "template:gelu/a"), (64, 0.2, 0.975, "template:gelu/b")])
    parents, sources = _parents(brain, 100)
    assert sum(parents.values()) == 0
    assert sources[ParentSource.FRESH] > 70


def test_evaluations_go_where_the_gap_to_speed_of_light_is() -> None:
    # Same fitness, different gaps: the 20%-of-SOL elite gets most exploratory refinements.
    elites = [(1024, 0.1, 0.85, "template:gelu/a"), (64, 0.1, 0.2, "template:gelu/b")]
    brain, ids = _brain(elites, exploit=0.0, fresh=0.0, repair=0.0)
    parents, _ = _parents(brain)
    share = parents[ids[64]] / sum(parents.values())
    assert share > 0.75, parents
    plain, ids_plain = _brain(elites, exploit=0.0, fresh=0.0, repair=0.0, headroom=False)
    flat = _parents(plain)[0]
    assert flat[ids_plain[64]] / sum(flat.values()) < 0.65


def test_families_whose_mutations_paid_off_get_more_refinements() -> None:
    elites = [(1024, 0.1, 0.5, "template:gemm/default"), (64, 0.1, 0.5, "template:softmax/default")]
    brain, ids = _brain(elites, exploit=0.0, fresh=0.0, repair=0.0)
    for _ in range(8):
        brain.headroom.observe("template:gemm", "slow.memory_bound", 1.0, 1.4)
        brain.headroom.observe("template:softmax", "slow.memory_bound", 1.0, 1.0)
    parents, _ = _parents(brain)
    assert parents[ids[1024]] > 3 * parents[ids[64]], parents
    restored = IslandBrain.from_json(brain.to_json(), brain.spec)
    assert restored.headroom == brain.headroom


def test_gains_are_measured_from_feedback_per_family_and_diagnosis() -> None:
    brain, _ = _brain([(64, 0.4, 0.2, "template:gelu/default")])
    (elite,) = brain.archive.elites()
    diagnosis = f.diagnosis(elite.candidate, DiagnosisCategory.SLOW_MEMORY_BOUND)
    child = f.candidate(params={"BLOCK_SIZE": 128, "num_warps": 4}, parent=elite.candidate, diagnosis=diagnosis)
    child = child.model_copy(update={"proposal": child.proposal.model_copy(update={"strategy": "template:gelu/m"})})
    brain.on_feedback(f.feedback(child, f.correct(child, 0.2), diagnosis))  # twice as fast as its parent
    assert family_of(child) == "template:gelu"
    stats = brain.headroom.stats["template:gelu|slow.memory_bound"]
    assert stats.n == 1
    assert stats.gain == pytest.approx(1.0)
