"""The island brain: requests, feedback, rewards, repair, budgets, determinism and restart."""

from __future__ import annotations

from collections import Counter

import pytest

from actors.diagnosis.rules import RuleDiagnoser
from actors.evolution.archive import AddStatus
from actors.evolution.brain import IslandBrain, IslandConfig, ParentSource, RequestPlan
from actors.evolution.credit import START, CreditBandit, ExpertProfile
from actors.evolution.errors import WrongIsland
from schemas import (
    Budget,
    DiagnosisCategory,
    EvalStatus,
    Feedback,
    KernelLanguage,
    Proposal,
    Role,
    StopReason,
)
from schemas.candidate import AVOID_KEPT
from tests.evolution import factories as f
from tests.evolution.landscape import Landscape

EXPERTS = (
    ExpertProfile(name="template", role=Role.TEMPLATE),
    ExpertProfile(name="mem", role=Role.MEMORY),
    ExpertProfile(name="fuse", role=Role.FUSION),
    ExpertProfile(name="fix", role=Role.REPAIR),
)
DIAGNOSER = RuleDiagnoser()


def _brain(seed: int = 0, island: str = "i0", **spec_kw: object) -> IslandBrain:
    return IslandBrain(island, f.spec(**spec_kw), EXPERTS, seed=seed)


def _step(brain: IslandBrain, env: Landscape) -> tuple[RequestPlan, Feedback]:
    plan = brain.next_request()
    fb = env.evaluate(brain, plan)
    brain.on_feedback(fb)
    return plan, fb


def test_first_request_is_a_fresh_start_routed_by_the_start_prior() -> None:
    brain = _brain()
    plan = brain.next_request()
    assert (plan.source, plan.key, plan.parent) == (ParentSource.FRESH, START, None)
    experts = Counter(_brain(seed=s).next_request().expert for s in range(60))
    assert experts.most_common(1)[0][0] == "template"
    request = plan.request(brain.spec)
    assert request.parent is None
    assert request.seed == plan.seed
    assert request.task == brain.spec.task


def test_clean_feedback_fills_a_cell_improves_the_best_and_rewards_the_expert() -> None:
    brain = _brain()
    plan = brain.next_request()
    cand = plan.candidate(brain.spec, Proposal(source=f.KERNEL, language=KernelLanguage.TRITON))
    res = f.correct(cand, 0.2)
    out = brain.on_feedback(f.feedback(cand, res, DIAGNOSER.diagnose(res, cand)))
    assert out.add_status is AddStatus.NEW_CELL
    assert out.improved_best
    assert out.elite is not None
    assert out.elite.diagnosis is not None
    assert out.elite.result == res
    assert out.reward is not None
    assert (out.reward.key, out.reward.expert, out.reward.value) == (START, plan.expert, 1.0)
    status = brain.status(at=0.0)
    assert (status.evaluated, status.archive_size, status.best_candidate_id) == (1, 1, cand.candidate_id)


@pytest.mark.parametrize(
    ("parent_ms", "child", "reward"),
    [
        (0.4, "faster", 1.0),
        (0.4, "slower", 0.1),
        (0.4, "failed", 0.0),
        (None, "incorrect", 0.5),
        (None, "failed", 0.0),
        (None, "faster", 1.0),
    ],
)
def test_reward_follows_what_the_child_achieved_against_its_parent(
    parent_ms: float | None, child: str, reward: float
) -> None:
    brain = _brain()
    parent = f.candidate()
    pres = f.correct(parent, parent_ms) if parent_ms else f.failed(parent, EvalStatus.RUNTIME_ERROR)
    pdiag = DIAGNOSER.diagnose(pres, parent)
    brain.on_feedback(f.feedback(parent, pres, pdiag))
    kid = f.candidate(parent=parent, diagnosis=pdiag, expert="mem")
    from schemas import Correctness

    results = {
        "faster": f.correct(kid, 0.2),
        "slower": f.correct(kid, 0.8),
        "failed": f.failed(kid),
        "incorrect": f.incorrect(kid, Correctness(trials=5, passed_trials=0, atol=1e-5, rtol=1e-5)),
    }
    out = brain.on_feedback(f.feedback(kid, results[child], DIAGNOSER.diagnose(results[child], kid)))
    assert out.reward is not None
    assert (out.reward.key, out.reward.expert, out.reward.value) == (pdiag.category.value, "mem", reward)


def test_failures_are_offered_for_repair_under_their_diagnosis() -> None:
    brain = _brain(seed=4)
    cand = f.candidate()
    log = 'k.cu(3): error: identifier "yy" is undefined\n  out[i] = yy[i];\n  ^\n'
    res = f.failed(cand, EvalStatus.COMPILE_ERROR, compile_log=log)
    brain.on_feedback(f.feedback(cand, res, DIAGNOSER.diagnose(res, cand)))
    plans = [brain.next_request() for _ in range(5)]
    repair = [p for p in plans if p.source is ParentSource.REPAIR]
    assert len(repair) == 1  # one failure, repaired once
    (p,) = repair
    assert p.parent is not None
    assert p.parent.candidate_id == cand.candidate_id
    assert p.key == DiagnosisCategory.COMPILE_TYPE.value
    assert p.diagnosis is not None
    assert "compile.type" in p.instructions
    assert "fix it" in p.instructions


def test_the_diagnosis_steers_which_expert_is_asked() -> None:
    counts: dict[str, Counter[str]] = {}
    for category in (DiagnosisCategory.SLOW_LAUNCH_BOUND, DiagnosisCategory.SLOW_MEMORY_BOUND):
        seen: Counter[str] = Counter()
        for seed in range(40):
            brain = _brain(seed=seed)
            cand = f.candidate()
            res = f.correct(cand, 0.2)
            brain.on_feedback(f.feedback(cand, res, f.diagnosis(cand, category, None)))
            plan = brain.next_request()
            if plan.key == category.value:
                seen[plan.expert] += 1
        counts[category.value] = seen
    assert counts["slow.launch_bound"]["fuse"] > counts["slow.launch_bound"]["mem"]
    assert counts["slow.memory_bound"]["mem"] > counts["slow.memory_bound"]["fuse"]


def test_redelivered_feedback_changes_nothing_and_foreign_feedback_is_refused() -> None:
    brain = _brain()
    env = Landscape(0, fail=0.0)
    _, fb = _step(brain, env)
    before = brain.to_json()
    again = brain.on_feedback(fb)
    assert again.duplicate
    assert brain.to_json() == before
    with pytest.raises(WrongIsland, match="i9"):
        brain.on_feedback(fb.model_copy(update={"island": "i9"}))


def test_in_flight_counts_requests_replies_and_feedback() -> None:
    brain = _brain(inflight_per_island=2)
    a, b = brain.next_request(), brain.next_request()
    assert not brain.wants_request()
    assert brain.in_flight == 2
    brain.on_reply(a, 0, decline="refused")  # declined: nothing in flight for it; no reward either way
    assert brain.wants_request()
    assert brain.declines == 1
    assert brain.status().declines == 1  # the report reads it from the island's last status
    assert not [r for r in brain.credit_table() if r.expert == a.expert]  # a decline is not a failed idea
    assert brain.credit.usage_of(a.expert).declined_by == {"refused": 1}
    brain.on_reply(b, 1)
    assert brain.in_flight == 1


def test_budget_stops_the_island_on_tokens_time_quota_and_speed_of_light() -> None:
    env = Landscape(1, fail=0.0)
    by_count = _brain(islands=2, budget=Budget(candidates=6, wall_s=None))
    for _ in range(4):
        _step(by_count, env)
    # The candidate budget is the run's shared quota (actors.runtime.quota), not a share per island.
    assert by_count.budget_exhausted(now=0.0) is None
    by_count.stop(StopReason.CANDIDATES)
    assert by_count.budget_exhausted(now=0.0) is StopReason.CANDIDATES
    assert not by_count.wants_request()
    by_tokens = _brain(islands=2, budget=Budget(tokens=1000, wall_s=None))
    by_tokens.record_tokens(499)
    assert by_tokens.budget_exhausted(now=0.0) is None
    by_tokens.record_tokens(1)
    assert by_tokens.budget_exhausted(now=0.0) is StopReason.TOKENS
    by_time = _brain(budget=Budget(wall_s=60.0))
    assert by_time.budget_exhausted(now=1059.0) is None  # the spec was created at t = 1000
    assert by_time.budget_exhausted(now=1060.0) is StopReason.WALL_TIME
    assert by_time.budget_exhausted(now=0.0) is StopReason.WALL_TIME  # sticky
    assert not by_time.wants_request()
    assert by_time.status(at=0.0).stopped is StopReason.WALL_TIME
    at_sol = _brain(target_sol_fraction=0.5)
    cand = f.candidate()
    res = f.correct(cand, 0.1, bound_ms=0.06)
    at_sol.on_feedback(f.feedback(cand, res, DIAGNOSER.diagnose(res)))
    assert at_sol.budget_exhausted(now=0.0) is StopReason.SPEED_OF_LIGHT


def test_an_island_improves_on_its_first_correct_kernel() -> None:
    brain, env = _brain(seed=2), Landscape(3)
    first: float | None = None
    for _ in range(60):
        _, fb = _step(brain, env)
        if first is None and fb.result.fitness is not None:
            first = fb.result.fitness
    best = brain.archive.best()
    assert first is not None
    assert best is not None
    assert best.fitness > first
    # reached by refining elites: fresh starts never go beyond a block of 512 on this landscape
    assert best.candidate.generation >= 2
    assert int(best.candidate.proposal.params["BLOCK_SIZE"]) >= 1024
    assert [p.best for p in brain.fitness_history if p.best is not None] == sorted(
        p.best for p in brain.fitness_history if p.best is not None
    )


def test_stagnation_is_reported_once_the_island_stops_improving() -> None:
    brain = IslandBrain("i0", f.spec(), EXPERTS, seed=0, config=IslandConfig(stagnation_window=5))
    env = Landscape(0, fail=1.0)  # nothing ever works
    flags = []
    for _ in range(7):
        _step(brain, env)
        flags.append(brain.status(at=0.0).stagnating)
    assert flags[:4] == [False] * 4
    assert flags[-1]


def test_same_seed_same_plans_different_seed_or_island_differs() -> None:
    def plans(seed: int, island: str) -> list[tuple[str, str, int]]:
        brain, env = _brain(seed=seed, island=island), Landscape(7)
        out = []
        for _ in range(25):
            plan, _ = _step(brain, env)
            out.append((plan.expert, plan.source.value, plan.seed))
        return out

    assert plans(1, "i0") == plans(1, "i0")
    assert plans(1, "i0") != plans(2, "i0")
    assert plans(1, "i0") != plans(1, "i1")


def test_brain_restored_from_json_continues_identically() -> None:
    brain, env = _brain(seed=5), Landscape(11)
    for _ in range(20):
        _step(brain, env)
    restored = IslandBrain.from_json(brain.to_json(), brain.spec)
    env_a, env_b = Landscape(12), Landscape(12)
    for _ in range(20):
        pa, _fa = _step(brain, env_a)
        pb, _fb = _step(restored, env_b)
        assert (pa.expert, pa.source, pa.seed, pa.key) == (pb.expert, pb.source, pb.seed, pb.key)
        assert (pa.parent.candidate_id if pa.parent else None) == (pb.parent.candidate_id if pb.parent else None)
    assert restored.credit_table() == brain.credit_table()
    assert restored.to_json() == brain.to_json()
    assert [e.candidate.proposal.params for e in restored.archive.elites()] == [
        e.candidate.proposal.params for e in brain.archive.elites()
    ]


LLM_AND_TEMPLATE = (ExpertProfile(name="template", role=Role.TEMPLATE), ExpertProfile(name="gpt", role=Role.GENERAL))


def _asked(brain: IslandBrain, env: Landscape, steps: int, *, declines: int = 0) -> list[str]:
    """Run ``steps`` requests; the LLM declines its first ``declines`` requests of them."""
    asked = []
    for _ in range(steps):
        plan = brain.next_request()
        asked.append(plan.expert)
        if plan.expert == "gpt" and declines > 0:
            declines -= 1
            brain.on_reply(plan, 0, decline="no_code")
            continue
        brain.on_feedback(env.evaluate(brain, plan))
    return asked


def test_an_llm_expert_that_declined_once_is_asked_again_on_every_island() -> None:
    spec = f.spec(islands=2)
    for island in ("i0", "i1"):
        brain = IslandBrain(island, spec, LLM_AND_TEMPLATE, seed=5)
        env = Landscape(3, fail=0.0)
        asked = _asked(brain, env, 30, declines=1)
        first = asked.index("gpt")
        assert asked[first + 1 :].count("gpt") >= 2, (island, asked)
        usage = brain.credit.usage_of("gpt")
        assert (usage.requests, usage.declines) == (asked.count("gpt"), 1)
        # The decline entered no credit row: the LLM's pulls are only its evaluated candidates.
        assert sum(r.pulls for r in brain.credit_table() if r.expert == "gpt") == usage.answered


def test_the_template_expert_winning_early_does_not_starve_an_llm_expert() -> None:
    """With a routing prior that favours the template expert, every island still asks the LLM
    expert its minimum number of times early in its run; without the guarantee some do not."""
    spec = f.spec(islands=3)
    short: dict[int, int] = {}
    for tries in (2, 0):
        short[tries] = 0
        for seed in range(12):
            for island in ("i0", "i1", "i2"):
                config = IslandConfig(min_tries_per_expert=tries)
                brain = IslandBrain(island, spec, LLM_AND_TEMPLATE, seed=seed, config=config)
                short[tries] += _asked(brain, Landscape(seed, fail=0.0), 8).count("gpt") < 2
    assert short[2] == 0
    assert short[0] > 0  # the guarantee is what gives the LLM its share


def test_a_streak_of_declines_rests_the_expert_for_growing_spells_and_an_answer_ends_it() -> None:
    bandit = CreditBandit(LLM_AND_TEMPLATE, 0, min_tries=0)
    bandit.record_answer("gpt", decline="refused")
    assert bandit.usage_of("gpt").rest == 0  # one decline: asked as usual
    bandit.record_answer("gpt", decline="refused")
    assert bandit.usage_of("gpt").rest == 2
    assert [bandit.choose(START) for _ in range(2)] == ["template", "template"]
    bandit.record_answer("gpt", decline="no_code")
    assert bandit.usage_of("gpt").rest == 4
    bandit.record_answer("gpt", decline=None)
    assert bandit.usage_of("gpt").streak == 0
    assert bandit.usage_of("gpt").declined_by == {"refused": 2, "no_code": 1}
    restored = CreditBandit.from_state(bandit.state())
    assert restored.usage_of("gpt") == bandit.usage_of("gpt")
    assert restored.min_tries == bandit.min_tries


@pytest.mark.parametrize("switch", ["config", "run_spec"])
def test_uniform_experts_ignore_the_diagnosis_routing(switch: str) -> None:
    routed, uniform = Counter[str](), Counter[str]()
    on = (
        (IslandConfig(uniform_experts=True), f.spec())
        if switch == "config"
        else (IslandConfig(), f.spec(ablations={"uniform_experts": True}))
    )
    for seed in range(60):
        for (config, spec), seen in (((IslandConfig(), f.spec()), routed), (on, uniform)):
            brain = IslandBrain("i0", spec, EXPERTS, seed=seed, config=config)
            cand = f.candidate()
            diag = f.diagnosis(cand, DiagnosisCategory.COMPILE_TYPE, None)
            brain.on_feedback(f.feedback(cand, f.failed(cand), diag))
            plan = brain.next_request()
            if plan.source is ParentSource.REPAIR:
                seen[plan.expert] += 1
    assert routed["fix"] > 2 * max(routed["mem"], routed["fuse"], 1)  # repair is routed to the repair role
    assert max(uniform.values()) < 2.5 * min(uniform[e.name] for e in EXPERTS)


def test_the_island_claims_each_kernel_once_and_remembers_them_across_a_restart() -> None:
    brain = _brain()
    assert brain.claim_kernel("k1")
    assert brain.claim_kernel("k2")
    assert not brain.claim_kernel("k1")  # published already: not again
    brain.forget_kernel("k2")  # not published after all (the candidate budget was spent)
    assert brain.claim_kernel("k2")
    for i in range(AVOID_KEPT + 5):
        brain.claim_kernel(f"n{i}")
    avoid = brain.kernels_to_avoid()
    assert len(avoid) == AVOID_KEPT
    assert avoid[-1] == f"n{AVOID_KEPT + 4}"  # the newest, newest last
    restored = IslandBrain.from_json(brain.to_json(), brain.spec)
    assert not restored.claim_kernel("k1")
    assert restored.kernels_to_avoid() == avoid
