"""Default parameters for a plan, and mutation steered by the parent's diagnosis.

``default_params`` picks sizes from the traced shapes (whole rows in registers when they fit,
larger matmul tiles for larger products). ``mutate`` steps one to three of the parameters that
matter for the plan to a neighbouring value; the diagnosis decides which parameters and which
direction (launch-bound: fuse and enlarge; memory-bound: vector width, block sizes, one pass;
compute-bound: matmul tiles, stages and dot precision; latency-bound: split-K, persistence, stages
and warps; out of resources: smaller and fewer). Given where the time goes (each kernel kind's
share), a mutation aims at one kind drawn in proportion to its share.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from actors.evolution.amdahl import family_weights
from actors.experts.template.errors import InvalidParams
from actors.experts.template.fuse import KernelKind, Schedule, schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import Plan
from actors.experts.template.kernel_kinds import names_in, template_of, templates
from actors.experts.template.params import SPACE, TemplateParams
from schemas.enums import DiagnosisCategory, OpFamily

_FAMILIES = frozenset(f.value for f in OpFamily)


def default_params(plan: Plan, hw: GpuModel | None = None, tf32: bool = False) -> TemplateParams:
    """A good first configuration for the plan's shapes; with a model of the target GPU, the
    sizes that fill it (``hardware.py``). ``tf32``: the run admits the reference's own TF32 in its
    convolutions (precision parity; cuDNN runs fp32 convolutions so at PyTorch's defaults)."""
    values: dict[str, object] = {}
    sched = schedule(plan, TemplateParams())
    seen: set[KernelKind] = set()
    for kernel in sched.kernels:
        template = template_of(kernel.kind)
        if kernel.kind in seen or template is None:
            continue
        seen.add(kernel.kind)
        values.update(template.defaults(plan, sched, kernel, values))
    if hw is not None and hw.is_gpu:
        values.update(_fit_to(hw, plan, sched, tf32))
    values["share_sizes"] = _many_kernels(sched)
    return TemplateParams.from_dict(values)


SHARE_SIZES_FROM = 32
"""Plans of this many kernels or more start with ``share_sizes`` (and may change it): a whole
model's first verdict waits for the compile of all its functions (KernelBench L3-15: 714 of them,
20-26 s on a 16-core host); below, few functions are compiled and the constants stay constants."""


def _many_kernels(sched: Schedule) -> bool:
    return sum(1 for kernel in sched.kernels if kernel.kind is not KernelKind.TORCH) >= SHARE_SIZES_FROM


def _fit_to(hw: GpuModel, plan: Plan, sched: Schedule, tf32: bool = False) -> dict[str, object]:
    """First sizes from the GPU model, per kernel kind (each kind's ``fit``, in schedule order)."""
    values: dict[str, object] = {}
    for kernel in sched.kernels:
        template = template_of(kernel.kind)
        if template is not None:
            values.update(template.fit(hw, plan, sched, kernel, tf32, values))
    return values


def relevant_params(plan: Plan, params: TemplateParams) -> tuple[str, ...]:
    """The parameters that change the rendered kernels of ``plan`` under ``params``."""
    by_kind = relevant_by_kind(plan, params)
    return tuple(dict.fromkeys(n for names in by_kind.values() for n in names))


def relevant_by_kind(plan: Plan, params: TemplateParams) -> dict[str, tuple[str, ...]]:
    """:func:`relevant_params` per kernel kind of the schedule (``""``: the fusion flags, which
    change kernels of every kind)."""
    names: dict[str, list[str]] = {}
    sched = schedule(plan, params)
    for kernel in sched.kernels:
        template = template_of(kernel.kind)
        if template is not None:
            names.setdefault(kernel.kind.value, []).extend(template.relevant(plan, sched, kernel, params))
    for i, flag in enumerate(("fuse_epilogue", "fuse_prologue")):
        if len({f[i] for f in plan.fusions}) > 1:
            names.setdefault("", []).append(flag)
    if _many_kernels(sched):
        names.setdefault("", []).append("share_sizes")
    return {kind: tuple(dict.fromkeys(n)) for kind, n in names.items() if n}


def _aimed(
    plan: Plan, params: TemplateParams, rng: np.random.Generator, shares: Mapping[str, float] | None
) -> tuple[str, ...]:
    """The parameters of one kernel kind, drawn in proportion to its share of the time (Amdahl's
    law: a kind that takes most of the time pays most to improve), with the fusion flags; all
    relevant parameters where no shares are known or the plan has one kind."""
    by_kind = relevant_by_kind(plan, params)
    everything = tuple(dict.fromkeys(n for names in by_kind.values() for n in names))
    kinds = {k for k in by_kind if k}
    if not shares or len(kinds) < 2:
        return everything
    weights = family_weights({OpFamily(f): w for f, w in shares.items() if f in _FAMILIES}, kinds)
    if not weights:
        return everything
    names = sorted(weights)
    p = np.array([weights[k] for k in names])
    kind = names[int(rng.choice(len(names), p=p / p.sum()))]
    return tuple(dict.fromkeys((*by_kind[kind], *by_kind.get("", ()))))


def _step(name: str, value: object, rng: np.random.Generator, direction: int) -> object:
    """A neighbouring value of one parameter (``direction`` 0: either way)."""
    space = SPACE[name]
    if isinstance(value, bool | str):
        others = [v for v in space if v != value]
        return others[int(rng.integers(len(others)))]
    i = space.index(value)
    if direction == 0:
        direction = 1 if rng.random() < 0.5 else -1
    stride = 2 if rng.random() < 0.2 else 1
    j = min(len(space) - 1, max(0, i + direction * stride))
    return space[j]


def _among(relevant: tuple[str, ...], group: str) -> tuple[str, ...]:
    """The ``relevant`` parameters some kernel kind lists in ``group`` (all of them where none does)."""
    chosen = names_in(group)
    return tuple(n for n in relevant if n in chosen) or relevant


def _choices(
    relevant: tuple[str, ...], params: TemplateParams, diagnosis: DiagnosisCategory | None
) -> tuple[tuple[str, ...], int, dict[str, object]]:
    """(candidate parameter names, direction, forced values) for a diagnosis."""
    forced: dict[str, object] = {}
    if diagnosis is DiagnosisCategory.SLOW_LAUNCH_BOUND:
        for flag in ("fuse_epilogue", "fuse_prologue"):
            if flag in relevant and not getattr(params, flag):
                forced[flag] = True
        return _among(relevant, "tiles"), 1, forced
    if diagnosis is DiagnosisCategory.SLOW_MEMORY_BOUND:
        return _among(relevant, "memory"), 0, forced
    if diagnosis is DiagnosisCategory.SLOW_COMPUTE_BOUND:
        return _among(relevant, "compute"), 0, forced
    if diagnosis is DiagnosisCategory.SLOW_LATENCY_BOUND:
        return _among(relevant, "latency"), 0, forced
    if diagnosis in (
        DiagnosisCategory.COMPILE_RESOURCES,
        DiagnosisCategory.COMPILE_TIMEOUT,
        DiagnosisCategory.RUNTIME_OOM,
    ):
        if "row_one_pass" in relevant and params.row_one_pass:
            forced["row_one_pass"] = False
        if diagnosis is DiagnosisCategory.COMPILE_TIMEOUT and "share_sizes" in relevant and not params.share_sizes:
            forced["share_sizes"] = True  # fewer functions to compile
        return _among(relevant, "shrink"), -1, forced
    if diagnosis is DiagnosisCategory.INCORRECT_PRECISION:
        for name in sorted(names_in("precision")):
            if getattr(params, name) == "tf32x3":  # fma sums in fp32 already
                forced[name] = "ieee"
            elif getattr(params, name) == "tf32":  # TF32 refused: the fp32-accurate passes
                forced[name] = "tf32x3"
    return relevant, 0, forced


def mutate(
    plan: Plan,
    params: TemplateParams,
    rng: np.random.Generator,
    *,
    diagnosis: DiagnosisCategory | None,
    tf32: bool = False,
    shares: Mapping[str, float] | None = None,
) -> TemplateParams:
    """A valid neighbour of ``params`` for ``plan``, steered by ``diagnosis`` (``tf32``: the run
    admits TF32 convolutions; else none is proposed) and aimed at one kernel kind drawn by its
    share of the time (``shares``: ``OpFamily`` value → share; see :func:`_aimed`).

    Returns ``params`` itself only when no other valid configuration is reachable.
    """
    relevant = relevant_params(plan, params)
    if not relevant:
        return params
    names, direction, forced = _choices(_aimed(plan, params, rng, shares), params, diagnosis)
    for attempt in range(64):
        changes: dict[str, object] = dict(forced) if attempt < 32 else {}
        count = 1 + int(rng.random() < 0.4) + int(rng.random() < 0.15)
        pool = names if attempt < 48 else relevant
        for _ in range(count):
            name = pool[int(rng.integers(len(pool)))]
            current = changes.get(name, getattr(params, name))
            changes[name] = _step(name, current, rng, direction if attempt < 32 else 0)
        try:
            candidate = params.with_changes(**changes)
        except InvalidParams:
            continue
        if (candidate.fuse_epilogue, candidate.fuse_prologue) not in plan.fusions:
            continue
        if not tf32 and any(
            getattr(candidate, name) == value != getattr(params, name)
            for template in templates()
            for name, value in template.tf32_only
        ):
            continue
        if candidate != params:
            return candidate
    return params
