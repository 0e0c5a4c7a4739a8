"""The seam between the template expert's core and its kernel kinds: what a kind provides, and
where it registers.

A kernel kind (a ``KernelKind`` of the schedule: elementwise, row, matrix product, convolution,
pooling, scan, attention) is one registration of a :class:`KernelTemplate`: its writer (the
Triton it emits), its first parameters for a plan (and, with a model of the GPU, the sizes that
fill it), the parameters that change its kernel under given ones, and how those parameters answer
a diagnosis (memory-, compute-, latency-bound, out of resources, imprecise). The renderer
(``render.py``) and the tuner (``tuning.py``) never name a kind: they ask :func:`template_of`.

The core kinds register in ``kernels/`` (one module each); a family whose kernel is its own
(``families/scan.py``, ``families/attention.py``) registers it beside its lowering. Adding a kind:
a ``KernelKind`` member (``fuse.py``), its knobs in the parameter space (``params.py``), and one
module that writes its ``Writer`` and calls :func:`register`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.ir import Plan
from actors.experts.template.lowering import load_families
from actors.experts.template.params import TemplateParams

if TYPE_CHECKING:
    from actors.experts.template.emit import Writer
    from actors.experts.template.hardware import GpuModel

Values = Mapping[str, object]
"""Parameter values chosen so far (by the kinds met earlier in the schedule)."""


def _no_fit(hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values) -> dict[str, object]:
    return {}


@dataclass(frozen=True)
class KernelTemplate:
    """One kernel kind as the core sees it."""

    kind: KernelKind
    writer: type[Writer]
    """Renders one kernel of the kind: ``writer(sched, kernel, params, used).write()``."""
    defaults: Callable[[Plan, Schedule, Kernel, Values], dict[str, object]]
    """First parameters from the schedule's first kernel of the kind (without a GPU model)."""
    relevant: Callable[[Plan, Schedule, Kernel, TemplateParams], list[str]]
    """The parameters that change this kernel's source under the given ones (what mutation steps)."""
    fit: Callable[[GpuModel, Plan, Schedule, Kernel, bool, Values], dict[str, object]] = _no_fit
    """Sizes from a model of the GPU, asked for every kernel of the kind in schedule order
    (``tf32``: the run admits the reference's own TF32; ``values``: those fitted so far)."""
    memory: tuple[str, ...] = ()
    """Parameters a memory-bound kernel steps (vector widths, block sizes, one pass)."""
    compute: tuple[str, ...] = ()
    """Parameters a compute-bound kernel steps (tiles, stages, dot precision, schedule variants)."""
    latency: tuple[str, ...] = ()
    """Parameters that change how much work is in flight (latency-bound)."""
    tiles: tuple[str, ...] = ()
    """Tile sizes: enlarged when launch-bound, shrunk (with ``shrink``) when out of resources."""
    shrink: tuple[str, ...] = ()
    """Beyond ``tiles``, what a kernel out of resources makes smaller or fewer."""
    precision: tuple[str, ...] = ()
    """Dot-precision parameters: ``tf32`` steps back to ``tf32x3``, ``tf32x3`` to ``ieee`` when the
    verdict is imprecise."""
    tf32_only: tuple[tuple[str, object], ...] = ()
    """(parameter, value) pairs a run that does not admit TF32 never steps to."""


_REGISTRY: dict[KernelKind, KernelTemplate] = {}
_KERNELS = "actors.experts.template.kernels"
_loaded: list[str] = []


def register(template: KernelTemplate) -> KernelTemplate:
    """Register a kernel kind's template (each kind once, program-wide)."""
    held = _REGISTRY.get(template.kind)
    if held is not None and held != template:
        raise ValueError(f"kernel kind {template.kind.value!r} is registered twice: {held.writer}, {template.writer}")
    _REGISTRY[template.kind] = template
    return template


def load_kinds() -> tuple[str, ...]:
    """Import the core kinds (``kernels/``) and the op families once (each registers itself)."""
    if not _loaded:
        package = importlib.import_module(_KERNELS)
        names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
        for name in names:
            importlib.import_module(f"{_KERNELS}.{name}")
        load_families()
        _loaded.extend(names)
    return tuple(_loaded)


def template_of(kind: KernelKind) -> KernelTemplate | None:
    """The registered template of ``kind`` (None for ``torch``: no kernel, the reference's own op)."""
    load_kinds()
    return _REGISTRY.get(kind)


def templates() -> tuple[KernelTemplate, ...]:
    """Every registered template, in the order of ``KernelKind``."""
    load_kinds()
    return tuple(_REGISTRY[k] for k in KernelKind if k in _REGISTRY)


def names_in(group: str) -> frozenset[str]:
    """The parameters every kind lists in ``group`` (``memory``, ``compute``, ``latency``,
    ``tiles``, ``shrink``, ``precision``); ``shrink`` includes ``tiles``."""
    found: set[str] = set()
    for template in templates():
        found.update(getattr(template, group))
        if group == "shrink":
            found.update(template.tiles)
    return frozenset(found)
