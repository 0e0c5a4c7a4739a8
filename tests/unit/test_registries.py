"""Expert kinds and actor kinds are chosen through registries: every kind has its entry, the
command line offers exactly the registered kinds, and an unregistered kind is a clear error."""

from __future__ import annotations

import argparse

import pytest

from actors.commands.cli import build_parser
from actors.commands.launch import build_actor
from actors.experts.registry import EXPERT_KINDS, build_expert
from actors.kinds.registry import ACTOR_KINDS, actor_kind_entry
from actors.runtime.errors import ConfigError
from actors.runtime.options import ActorOptions
from schemas import ActorKind, ExpertConfig, ExpertKind, Role

pytestmark = pytest.mark.timeout(30)


def _choices(argv: list[str], dest: str) -> list[str]:
    """The choices the parser offers for the option ``dest`` of the subcommand ``argv``."""
    parser: argparse.ArgumentParser = build_parser()
    for word in argv:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return list(next(a for a in parser._actions if a.dest == dest).choices or [])


def test_every_expert_kind_has_an_implementation() -> None:
    assert set(EXPERT_KINDS) == set(ExpertKind)


def test_every_actor_kind_but_the_controller_has_a_builder() -> None:
    assert set(ACTOR_KINDS) == set(ActorKind) - {ActorKind.CONTROLLER}


def test_the_command_line_offers_exactly_the_registered_kinds() -> None:
    assert _choices(["expert", "set"], "kind") == [k.value for k in EXPERT_KINDS]
    assert _choices(["actor"], "kind") == [k.value for k in ACTOR_KINDS]
    assert _choices(["expert", "set"], "role") == [r.value for r in Role if r is not Role.TEMPLATE]


def test_an_expert_kind_without_an_implementation_is_a_clear_error_not_an_llm_expert() -> None:
    config = ExpertConfig(name="gpt", kind=ExpertKind.LLM, role=Role.FUSION, base_url="http://x/v1", model="m")
    only_template = {ExpertKind.TEMPLATE: EXPERT_KINDS[ExpertKind.TEMPLATE]}
    with pytest.raises(ConfigError) as err:
        build_expert(config, only_template)
    assert "no implementation of kind" in str(err.value)
    assert "template" in str(err.value)


def test_the_template_kind_builds_the_template_expert() -> None:
    from actors.experts.template.expert import TemplateExpert

    expert = build_expert(ExpertConfig(name="template-x", kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE))
    assert isinstance(expert, TemplateExpert)
    assert expert.name == "template-x"


def test_an_actor_kind_without_a_builder_is_a_clear_error() -> None:
    with pytest.raises(ConfigError) as err:
        build_actor(ActorKind.CONTROLLER, ActorOptions(), url="nats://127.0.0.1:1", run_id="r1")
    assert "cannot be started on its own" in str(err.value)
    with pytest.raises(ConfigError):
        actor_kind_entry(ActorKind.ISLAND, {})


@pytest.mark.parametrize("kind", [k for k, e in ACTOR_KINDS.items() if e.needs_run])
def test_a_kind_that_works_for_one_run_refuses_to_start_without_one(kind: ActorKind) -> None:
    with pytest.raises(ConfigError) as err:
        build_actor(kind, ActorOptions(), url="nats://127.0.0.1:1", run_id=None, island="i0")
    assert "needs --run" in str(err.value)
