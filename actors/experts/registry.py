"""The registry of expert kinds: which implementation serves an ``ExpertConfig`` of each kind.

Adding a kind: its ``ExpertKind`` member, its module (an ``Expert``, ``actors.experts.base``), and
one factory here registered in ``EXPERT_KINDS``; ``kfoundry expert set --kind`` offers every
registered kind. Factories import their module when called, so the template expert never loads
the OpenAI SDK and an LLM expert never loads the FX tracer.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.experts.base import Expert
from actors.runtime.errors import ConfigError
from schemas import ExpertConfig, ExpertKind


def _template(config: ExpertConfig) -> Expert:
    from actors.experts.template.expert import TemplateExpert
    from actors.experts.template.plan_store import PlanStore, default_store_dir

    return TemplateExpert(config.name, gpu=config.target_gpu, plan_store=PlanStore(default_store_dir()))


def _llm(config: ExpertConfig) -> Expert:
    from actors.experts.llm.expert import LLMExpert

    return LLMExpert(config)


EXPERT_KINDS: dict[ExpertKind, Callable[[ExpertConfig], Expert]] = {
    ExpertKind.TEMPLATE: _template,
    ExpertKind.LLM: _llm,
}
"""Every expert kind, with the factory of its implementation."""


def build_expert(
    config: ExpertConfig, registry: dict[ExpertKind, Callable[[ExpertConfig], Expert]] = EXPERT_KINDS
) -> Expert:
    """The implementation behind an expert configuration; a clear error for a kind with none."""
    factory = registry.get(config.kind)
    if factory is None:
        known = ", ".join(k.value for k in registry)
        raise ConfigError(f"expert {config.name!r}: no implementation of kind {config.kind!r} (kinds: {known})")
    return factory(config)
