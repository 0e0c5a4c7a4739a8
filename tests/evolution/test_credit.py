"""The credit bandit: a routing prior, learning from rewards, sharing within a family, seeded and
serialisable."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from actors.evolution.credit import START, CreditBandit, ExpertProfile, routing_key
from actors.evolution.errors import PolicyConfigError
from schemas import DiagnosisCategory, ExpertConfig, ExpertKind, Role

EXPERTS = (
    ExpertProfile(name="template", role=Role.TEMPLATE),
    ExpertProfile(name="mem", role=Role.MEMORY),
    ExpertProfile(name="fuse", role=Role.FUSION),
    ExpertProfile(name="fix", role=Role.REPAIR),
)
MEM = DiagnosisCategory.SLOW_MEMORY_BOUND.value


def _choices(bandit: CreditBandit, key: str, n: int, suggested_role: str | None = None) -> Counter[str]:
    return Counter(bandit.choose(key, suggested_role=suggested_role) for _ in range(n))


def test_without_evidence_the_routing_table_decides_most_choices() -> None:
    bandit = CreditBandit(EXPERTS, seed=0)
    assert _choices(bandit, MEM, 400).most_common(1)[0][0] == "mem"
    assert _choices(bandit, DiagnosisCategory.COMPILE_SYNTAX.value, 400).most_common(1)[0][0] == "fix"
    assert _choices(bandit, DiagnosisCategory.SLOW_LAUNCH_BOUND.value, 400).most_common(1)[0][0] == "fuse"
    assert _choices(bandit, START, 400).most_common(1)[0][0] == "template"


def test_bandit_learns_to_prefer_the_expert_that_earns_reward_against_its_prior() -> None:
    bandit = CreditBandit(EXPERTS, seed=1)
    env = np.random.default_rng(2)
    payoff = {"template": 0.8, "mem": 0.1, "fuse": 0.05, "fix": 0.05}  # the prior favours "mem"
    late: Counter[str] = Counter()
    for step in range(300):
        expert = bandit.choose(MEM)
        bandit.update(MEM, expert, float(env.random() < payoff[expert]))
        if step >= 250:
            late[expert] += 1
    assert late["template"] >= 40
    rows = {r.expert: r for r in bandit.rows() if r.key == MEM}
    assert rows["template"].posterior_mean > rows["mem"].posterior_mean
    # learning on one family leaves another family's routing alone
    assert _choices(bandit, DiagnosisCategory.COMPILE_TYPE.value, 200).most_common(1)[0][0] == "fix"


def test_evidence_is_shared_within_a_family_but_not_across_families() -> None:
    bandit = CreditBandit(EXPERTS, seed=0)
    compute, compile_key = DiagnosisCategory.SLOW_COMPUTE_BOUND.value, DiagnosisCategory.COMPILE_TYPE.value
    before = (bandit.posterior(compute, "fuse"), bandit.posterior(compile_key, "fuse"))
    for _ in range(20):
        bandit.update(MEM, "fuse", 1.0)
    after = (bandit.posterior(compute, "fuse"), bandit.posterior(compile_key, "fuse"))
    assert after[0][0] > before[0][0]  # sibling slow.* category borrowed the successes
    assert after[1] == before[1]


def test_suggested_role_of_the_diagnosis_raises_the_prior() -> None:
    bandit = CreditBandit(EXPERTS, seed=0)
    key = DiagnosisCategory.INCORRECT_PRECISION.value
    plain = bandit.prior(key, "mem")
    suggested = bandit.prior(key, "mem", suggested_role=Role.MEMORY)
    assert suggested[0] / sum(suggested) > plain[0] / sum(plain)


def test_same_seed_same_choices_and_different_seeds_differ() -> None:
    def run(seed: int) -> list[str]:
        bandit = CreditBandit(EXPERTS, seed=seed, prior_strength=0.5)
        return [bandit.choose(MEM) for _ in range(60)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_restored_bandit_continues_identically() -> None:
    bandit = CreditBandit(EXPERTS, seed=9)
    for k in range(30):
        bandit.update(MEM, bandit.choose(MEM), (k % 3) / 2)
    copy = CreditBandit.from_state(type(bandit.state()).model_validate_json(bandit.state().model_dump_json()))
    assert [copy.choose(MEM) for _ in range(50)] == [bandit.choose(MEM) for _ in range(50)]
    assert copy.rows() == bandit.rows()


def test_rewards_are_clipped_and_unknown_experts_join() -> None:
    bandit = CreditBandit(EXPERTS, seed=0)
    bandit.update(START, "newcomer", 7.0)
    row = next(r for r in bandit.rows() if r.expert == "newcomer")
    assert row.mean_reward == 1.0
    assert row.role == "general"
    assert "newcomer" in bandit.render()


def test_routing_key_of_a_diagnosis_and_of_none() -> None:
    assert routing_key(None) == START
    assert routing_key(DiagnosisCategory.AT_SOL) == "at_sol"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(PolicyConfigError, match="experts"):
        CreditBandit([], seed=0)
    with pytest.raises(PolicyConfigError, match="family_share"):
        CreditBandit(EXPERTS, seed=0, family_share=2.0)


def test_profile_from_config_gives_the_template_expert_its_own_role() -> None:
    template = ExpertConfig(name="tmpl", kind=ExpertKind.TEMPLATE, role=Role.GENERAL)
    llm = ExpertConfig(name="gpt", kind=ExpertKind.LLM, role=Role.MEMORY, base_url="http://127.0.0.1:1/v1", model="m")
    assert ExpertProfile.from_config(template).role == "template"
    assert ExpertProfile.from_config(llm, weight=2.0) == ExpertProfile(name="gpt", role=Role.MEMORY, weight=2.0)
