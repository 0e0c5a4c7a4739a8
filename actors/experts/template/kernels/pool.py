"""Pooling kernels: one output element per thread (``emit_pool``), ``pw_warps`` per program."""

from __future__ import annotations

from actors.experts.template.emit_pool import PoolWriter
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.ir import Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.params import TemplateParams


def _defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    return {} if "pw_warps" in values else {"pw_warps": 4}


def _relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    return ["pw_warps"]


register(KernelTemplate(kind=KernelKind.POOL, writer=PoolWriter, defaults=_defaults, relevant=_relevant))
