"""Meta-prompt co-evolution: choice, credit, breeding, culling and persistence, with fixed seeds."""

from __future__ import annotations

import json

import pytest

from actors.evolution.directives import DIRECTIVES, SHARED_DIRECTIVES
from actors.evolution.metaprompt import (
    EvolutionSettings,
    MetaPromptEvolver,
    RolePool,
    SectionOrigin,
    parse_strategy,
    reward,
    section_id_for_text,
    seed_sections,
    strategy_tag,
)
from actors.llm.prompts import ROLES
from schemas import EvalStatus, Experience, Role, TaskSignature

pytestmark = pytest.mark.timeout(10)


def drive(evolver: MetaPromptEvolver, steps: int, good: str | None = None) -> list[str]:
    """Choose and credit ``steps`` times; the ``good`` section earns +0.5, every other -0.5."""
    chosen: list[str] = []
    for _ in range(steps):
        section = evolver.choose()
        chosen.append(section.section_id)
        evolver.record(section.section_id, 0.5 if section.section_id == good else -0.5)
    return chosen


def test_every_role_has_directives_and_seed_sections() -> None:
    assert set(DIRECTIVES) == set(ROLES)
    for role in ROLES:
        seeds = seed_sections(role)
        assert len(seeds) == 3
        assert all(len(s) == 3 for s in seeds)
        evolver = MetaPromptEvolver(role)
        assert [s.origin for s in evolver.sections] == [SectionOrigin.SEED] * 3


def test_section_ids_are_content_hashes_shared_with_the_expert() -> None:
    evolver = MetaPromptEvolver(Role.MEMORY, seed=0)
    for section in evolver.sections:
        assert section.section_id == section_id_for_text(section.text)
        assert section.text.startswith("- ")
    adopted = evolver.adopt("- Use wide loads.\n- Keep rows in registers.\n")
    assert adopted.directives == ("Use wide loads.", "Keep rows in registers.")
    assert adopted.section_id == section_id_for_text(adopted.text)
    assert evolver.adopt(adopted.text) is adopted


def test_strategy_tags_round_trip() -> None:
    sid = section_id_for_text("- x")
    assert parse_strategy(strategy_tag(Role.TILING, sid)) == ("tiling", sid)
    assert parse_strategy(strategy_tag(Role.TILING, None)) == ("tiling", None)
    assert parse_strategy("elementwise/fuse-3") == ("elementwise/fuse-3", None)


def test_reward_is_monotone_and_bounded() -> None:
    values = [reward(d, 0.25) for d in (-3.0, -0.5, 0.0, 0.2, 3.0)]
    assert values == sorted(values)
    assert values[2] == 0.5
    assert 0.0 <= values[0] < 0.01
    assert 0.99 < values[-1] <= 1.0
    assert reward(None, 0.25) == 0.0
    assert reward(float("nan"), 0.25) == 0.0


def test_same_seed_same_outcomes_give_the_same_evolution() -> None:
    a, b, c = (MetaPromptEvolver(Role.FUSION, seed=s) for s in (4, 4, 5))
    assert drive(a, 60) == drive(b, 60)
    assert a.to_json() == b.to_json()
    assert drive(c, 60) != drive(MetaPromptEvolver(Role.FUSION, seed=4), 60)


def test_thompson_choice_concentrates_on_the_section_that_pays() -> None:
    evolver = MetaPromptEvolver(Role.TILING, seed=2, settings=EvolutionSettings(evolve_every=1000))
    good = evolver.sections[1].section_id
    chosen = drive(evolver, 120, good=good)
    late = chosen[60:]
    assert late.count(good) / len(late) > 0.8
    best = evolver.best()
    assert best.section_id == good
    assert best.mean > 0.8


def test_breeding_makes_new_sections_from_the_library_and_respects_the_cap() -> None:
    settings = EvolutionSettings(population_cap=5, evolve_every=3, min_uses=2)
    evolver = MetaPromptEvolver(Role.ALGORITHM, seed=9, settings=settings)
    good = evolver.sections[0].section_id
    drive(evolver, 150, good=good)
    sections = evolver.sections
    assert len(sections) <= settings.population_cap
    bred = [s for s in sections if s.origin in (SectionOrigin.MUTATION, SectionOrigin.CROSSOVER)]
    assert bred, "150 outcomes at evolve_every=3 bred nothing"
    library = set(DIRECTIVES[Role.ALGORITHM]) | set(SHARED_DIRECTIVES)
    for section in sections:
        assert set(section.directives) <= library
        assert 1 <= len(section.directives) <= settings.max_directives
        assert len(set(section.directives)) == len(section.directives)
        assert section.born_at <= evolver.outcomes
    assert len({s.section_id for s in sections}) == len(sections)
    assert evolver.best().mean > 0.6  # the paying line survives culling


def test_breeding_records_parents() -> None:
    evolver = MetaPromptEvolver(Role.REPAIR, seed=1, settings=EvolutionSettings(evolve_every=4, min_uses=1))
    children = []
    for _ in range(40):
        section = evolver.choose()
        child = evolver.record(section.section_id, 0.1)
        if child is not None:
            children.append(child)
    assert children
    for child in children:
        assert child.parents
        assert child.origin in (SectionOrigin.MUTATION, SectionOrigin.CROSSOVER)
        assert len(child.parents) == (2 if child.origin is SectionOrigin.CROSSOVER else 1)


def test_state_round_trips_through_json_and_continues_the_same_stream() -> None:
    settings = EvolutionSettings(evolve_every=5)
    straight = MetaPromptEvolver(Role.GENERAL, seed=12, settings=settings)
    drive(straight, 30)
    saved = straight.to_json()
    json.loads(saved)  # plain JSON, as stored in the kf_prompts bucket
    restored = MetaPromptEvolver.from_json(saved)
    assert restored.state() == RolePool.model_validate_json(saved)
    assert drive(restored, 30) == drive(straight, 30)
    assert restored.to_json() == straight.to_json()


def test_record_experience_credits_by_strategy_tag() -> None:
    evolver = MetaPromptEvolver(Role.MEMORY, seed=0)
    section = evolver.sections[2]

    def experience(strategy: str, child: float | None) -> Experience:
        return Experience(
            run_id="r",
            task_id="t",
            signature=TaskSignature(ops=("relu",)),
            candidate_id="c",
            expert="llm-memory",
            strategy=strategy,
            status=EvalStatus.CORRECT if child is not None else EvalStatus.INCORRECT,
            parent_fitness=1.0,
            child_fitness=child,
            description="wider loads",
        )

    evolver.record_experience(experience(strategy_tag(Role.MEMORY, section.section_id), 1.5))
    evolver.record_experience(experience(strategy_tag(Role.FUSION, section.section_id), 9.0))  # other role
    evolver.record_experience(experience("memory", 9.0))  # no section named
    credited = {s.section_id: s for s in evolver.sections}[section.section_id]
    assert credited.uses == 1
    assert credited.reward_sum == pytest.approx(reward(0.5, 0.25))
    assert evolver.outcomes == 1


def test_unknown_role_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown role 'poetry'"):
        MetaPromptEvolver("poetry")  # type: ignore[arg-type]
