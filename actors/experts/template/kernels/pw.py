"""Elementwise kernels: a flat domain, ``pw_ept`` elements per thread, ``pw_warps`` per program."""

from __future__ import annotations

from actors.experts.template.emit import PointwiseWriter
from actors.experts.template.emit_mm import element_size
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.params import TemplateParams


def _defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    return {"pw_warps": 8 if kernel.numel >= 1 << 20 else 4, "pw_ept": 4}


def _fit(hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values) -> dict[str, object]:
    if "pw_ept" in values:
        return {}
    last = kernel.nodes[-1] if kernel.nodes else -1
    ept = hw.vector_width(element_size(plan.nodes[last].dtype if last >= 0 else "float32"))
    return {"pw_ept": ept, "pw_warps": hw.elementwise_warps(kernel.numel, ept)}


def _relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    return ["pw_warps", "pw_ept"]


register(
    KernelTemplate(
        kind=KernelKind.PW,
        writer=PointwiseWriter,
        defaults=_defaults,
        relevant=_relevant,
        fit=_fit,
        memory=("pw_ept", "pw_warps"),
        latency=("pw_warps",),
        tiles=("pw_ept",),
    )
)
