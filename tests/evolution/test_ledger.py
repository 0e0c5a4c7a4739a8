"""The island's bookkeeping, owned by its brain: candidates in flight and overdue, the retrieval
cache, token shares, experience records and meta-prompt pools."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from actors.evolution.brain import RESTART_GRACE_S, IslandBrain
from actors.evolution.credit import ExpertProfile
from actors.evolution.ledger import RESTARTED, InFlightLedger, RetrievalCache, experience_of
from actors.evolution.metaprompt import strategy_tag
from actors.evolution.prompt_pools import PromptPools
from schemas import Budget, DiagnosisCategory, EvalStatus, Role, TaskSignature
from tests.evolution import factories as f

pytestmark = pytest.mark.timeout(30)

EXPERTS = (ExpertProfile(name="template", role=Role.TEMPLATE),)


def test_overdue_candidates_are_forgotten_and_the_rest_kept() -> None:
    ledger = InFlightLedger(last_feedback=0.0)
    ledger.published("old", 10.0)
    ledger.published("new", 95.0)
    assert ledger.overdue(now=100.0, horizon_s=50.0, in_flight=2) == ["old"]
    assert set(ledger.outstanding) == {"new"}
    ledger.answered("new", 101.0)
    assert ledger.outstanding == {}
    assert ledger.last_feedback == 101.0


def test_candidates_in_flight_from_before_a_restart_expire_once_feedback_has_been_silent_long() -> None:
    ledger = InFlightLedger(last_feedback=100.0)
    ledger.planning = 1
    assert ledger.overdue(now=120.0, horizon_s=50.0, in_flight=4) == []  # feedback is recent
    assert ledger.overdue(now=200.0, horizon_s=50.0, in_flight=4) == [RESTARTED] * 3  # one is being planned


def test_slots_from_before_a_restart_go_after_the_restart_grace_not_the_full_horizon() -> None:
    """The restored count can include candidates whose feedback the killed process had taken."""
    ledger = InFlightLedger(last_feedback=100.0)
    ledger.published("mine", 150.0)
    assert ledger.overdue(now=159.9, horizon_s=780.0, in_flight=3, restart_s=60.0) == []
    assert ledger.overdue(now=160.1, horizon_s=780.0, in_flight=3, restart_s=60.0) == [RESTARTED] * 2
    assert set(ledger.outstanding) == {"mine"}  # published by this process: the full horizon


def test_a_restored_brain_gives_up_its_old_slots_after_the_grace() -> None:
    brain = IslandBrain("i0", f.spec(islands=1, eval_timeout_s=180.0), EXPERTS, seed=0)
    brain.in_flight = 2  # restored from the archive store; this process published nothing
    brain.ledger.last_feedback = 1000.0
    assert brain.expire_lost(now=1000.0 + RESTART_GRACE_S - 1) == []
    assert brain.expire_lost(now=1000.0 + RESTART_GRACE_S + 1) == [RESTARTED, RESTARTED]
    assert brain.in_flight == 0


def test_the_retrieval_cache_answers_within_its_lifetime_only() -> None:
    cache = RetrievalCache(ttl_s=5.0)
    assert cache.get("slow.memory_bound", 0.0) is None
    cache.put("slow.memory_bound", (), 10.0)
    assert cache.get("slow.memory_bound", 14.9) == ()
    assert cache.get("slow.memory_bound", 15.0) is None


def test_the_brain_gives_each_island_its_token_share_and_expires_lost_candidates() -> None:
    spec = f.spec(islands=3, budget=Budget(tokens=10, wall_s=60.0), eval_timeout_s=10.0)
    brains = [IslandBrain(i, spec, EXPERTS, seed=0) for i in spec.island_names()]
    assert [b.tokens_left() for b in brains] == [4, 3, 3]
    brains[0].record_tokens(3)
    assert brains[0].tokens_left() == 1
    brain = brains[1]
    brain.in_flight = 2
    brain.ledger.published("c1", 0.0)
    brain.ledger.published("c2", 90.0)
    assert brain.expire_lost(now=101.0) == ["c1"]  # horizon: 4 timeouts + 60 s = 100 s
    assert brain.in_flight == 1


def test_a_feedback_yields_its_experience_record_and_the_outcome_of_the_experiences_it_used() -> None:
    parent = f.candidate()
    child = f.candidate(parent=parent).model_copy(update={"experience_ids": ("exp-a", "exp-b")})
    fb = f.feedback(child, f.correct(child, 0.5), f.diagnosis(child, DiagnosisCategory.SLOW_MEMORY_BOUND))
    record, outcome = experience_of(fb, TaskSignature(), parent_fitness=1.5)
    assert record.experience_id == f"exp-{child.candidate_id}"
    assert record.status is EvalStatus.CORRECT
    assert record.parent_fitness == 1.5
    assert outcome is not None
    assert outcome.experience_ids == ("exp-a", "exp-b")
    assert outcome.improved == (fb.result.fitness is not None and fb.result.fitness > 1.5)
    no_experiences = f.feedback(parent, f.correct(parent, 0.5), f.diagnosis(parent, DiagnosisCategory.AT_SOL))
    assert experience_of(no_experiences, TaskSignature(), None)[1] is None


def test_prompt_pools_credit_only_sections_of_their_own_roles() -> None:
    pools = PromptPools("run1", "i0", seed=3)
    pools.add(Role.FUSION, None)
    chosen = pools.section_for(Role.FUSION)
    assert chosen is not None
    assert chosen.text
    assert pools.section_for(Role.MEMORY) is None
    section = pools.pools[Role.FUSION].sections[0].section_id
    cand = f.candidate(expert="gpt")
    fb = f.feedback(cand, f.correct(cand, 0.5), f.diagnosis(cand, DiagnosisCategory.AT_SOL))
    record, _ = experience_of(fb, TaskSignature(), None)
    assert pools.credit(record) is None  # strategy "test": made with no section
    credited = pools.credit(record.model_copy(update={"strategy": strategy_tag(Role.FUSION, section)}))
    assert credited is not None
    role, saved = credited
    assert role is Role.FUSION
    assert pools.key(role) == "run1.i0.fusion"
    restored = PromptPools("run1", "i0", seed=3)
    restored.add(Role.FUSION, saved)
    assert json.loads(restored.pools[Role.FUSION].to_json()) == json.loads(saved)


@pytest.mark.parametrize(("island", "expected"), [("i0", [0, 2, 4, 6]), ("i1", [1, 3, 5, 7])])
def test_fresh_requests_walk_the_starting_points_interleaved_with_the_other_islands(
    island: str, expected: list[int]
) -> None:
    """The template expert answered every island's first requests with its default configuration."""
    brain = IslandBrain(island, f.spec(islands=2), EXPERTS, seed=3)
    starts = []
    for _ in range(4):
        plan = brain.next_request()
        assert plan.parent is None  # nothing evaluated yet: every request is a fresh start
        starts.append(plan.start)
        assert plan.request(f.spec(islands=2)).start == plan.start
    assert starts == expected
    restored = IslandBrain.from_json(brain.to_json(), f.spec(islands=2))
    assert restored.next_request().start == expected[-1] + 2  # a restart goes on, not back to the first


def test_plans_are_ranked_interleaved_with_the_other_islands_and_their_candidates_in_reply_order() -> None:
    """Evaluators judge lower ranks first: every island's k-th plan before anyone's (k+1)-th, and
    a plan's proposals in the order the expert gave them (its first starting point first)."""
    run = f.spec(islands=2)
    ranks = {}
    for island in ("i0", "i1"):
        brain = IslandBrain(island, run, EXPERTS, seed=3)
        ranks[island] = [brain.next_request().rank for _ in range(3)]
        restored = IslandBrain.from_json(brain.to_json(), run)
        ranks[island].append(restored.next_request().rank)  # a restart goes on
    assert ranks == {"i0": [0, 2, 4, 6], "i1": [1, 3, 5, 7]}
    plan = IslandBrain("i1", run, EXPERTS, seed=3).next_request()
    proposal = f.candidate().proposal
    wide = replace(plan, n=3)
    assert [wide.candidate(run, proposal, place=p).rank for p in range(3)] == [3, 4, 5]
    assert plan.candidate(run, proposal).rank == 1
