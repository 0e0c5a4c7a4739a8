"""Behaviour descriptors of a candidate: where it sits in the MAP-Elites grid.

Each descriptor is measured where the evaluator measured it and read from the code otherwise:

- ``launches``: kernel launches per forward (``EvalResult.profile``), else the number of kernels
  defined in the source (``@triton.jit`` functions, ``__global__`` CUDA functions);
- ``tile``: log2 of the tile's element count, from the ``BLOCK…`` constants the source launches
  with, else from ``Proposal.params`` keys naming a block (``BLOCK_SIZE``, ``BLOCK_M`` …);
- ``warps``: ``num_warps`` in the source, else in the params;
- ``fusion``: operators of the reference per launch (fusion extent), from the task's operator
  count and the launches above;
- ``dot``: whether the kernel uses ``tl.dot`` (or an MMA instruction);
- ``sol_fraction``: the measured fraction of the speed-of-light bound. For one task it moves
  with fitness (both are 1 / median time), so it is offered for cross-task archives and is not in
  the default space.

A value that can be neither measured nor read falls into a last "unknown" bin.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Mapping
from enum import StrEnum
from itertools import pairwise

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas import Candidate, EvalResult, ParamValue


class DescriptorKind(StrEnum):
    """What a descriptor measures."""

    LAUNCHES = "launches"
    TILE = "tile"
    WARPS = "warps"
    FUSION = "fusion"
    DOT = "dot"
    SOL_FRACTION = "sol_fraction"


class Descriptor(BaseModel):
    """One axis of the grid: a kind and the bin edges of its values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DescriptorKind
    """What it measures."""
    edges: tuple[float, ...] = Field(min_length=1)
    """Strictly increasing bin edges; ``len(edges) + 1`` value bins plus one "unknown" bin."""

    @model_validator(mode="after")
    def _increasing(self) -> Descriptor:
        if any(b <= a for a, b in pairwise(self.edges)):
            raise ValueError(f"edges of descriptor {self.kind} must increase strictly: {self.edges}")
        return self

    @property
    def size(self) -> int:
        """Bins on this axis, the unknown bin included."""
        return len(self.edges) + 2

    def bin(self, value: float | None) -> int:
        """The bin of ``value`` (the last bin when it is unknown)."""
        if value is None or not math.isfinite(value):
            return len(self.edges) + 1
        return bisect_right(self.edges, value)

    def labels(self) -> tuple[str, ...]:
        """A short label per bin, for plots and tables (the last is the unknown bin)."""
        if self.kind in _INTEGRAL:

            def show(i: int) -> str:
                return f"{2**i}" if self.kind is DescriptorKind.TILE else f"{i}"

            bounds = [math.ceil(e) for e in self.edges]
            inner = [show(lo) if lo == hi - 1 else f"{show(lo)}–{show(hi - 1)}" for lo, hi in pairwise(bounds)]
            return (f"≤{show(bounds[0] - 1)}", *inner, f"≥{show(bounds[-1])}", "?")
        middle = [f"{a:g}–{b:g}" for a, b in pairwise(self.edges)]
        return (f"<{self.edges[0]:g}", *middle, f"≥{self.edges[-1]:g}", "?")


_INTEGRAL = frozenset({DescriptorKind.LAUNCHES, DescriptorKind.TILE, DescriptorKind.WARPS, DescriptorKind.DOT})
_DEFAULT_EDGES: Mapping[DescriptorKind, tuple[float, ...]] = {
    DescriptorKind.LAUNCHES: (1.5, 2.5, 4.5),
    DescriptorKind.TILE: (6.5, 8.5, 10.5, 12.5),
    DescriptorKind.WARPS: (1.5, 3.0, 6.0),
    DescriptorKind.FUSION: (1.5, 2.5, 4.5),
    DescriptorKind.DOT: (0.5,),
    DescriptorKind.SOL_FRACTION: (0.1, 0.25, 0.5, 0.75),
}


class DescriptorSpace(BaseModel):
    """The axes of an archive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    descriptors: tuple[Descriptor, ...] = Field(min_length=1)
    """The axes, in cell-index order."""

    @classmethod
    def of(cls, *kinds: DescriptorKind) -> DescriptorSpace:
        """A space over ``kinds`` with their default bin edges."""
        return cls(descriptors=tuple(Descriptor(kind=k, edges=_DEFAULT_EDGES[k]) for k in kinds))

    @classmethod
    def default(cls) -> DescriptorSpace:
        """Launches per forward × tile size × warps: what the template and LLM experts vary."""
        return cls.of(DescriptorKind.LAUNCHES, DescriptorKind.TILE, DescriptorKind.WARPS)

    @property
    def shape(self) -> tuple[int, ...]:
        """Bins per axis."""
        return tuple(d.size for d in self.descriptors)

    def cell(self, values: Mapping[str, ParamValue]) -> tuple[int, ...]:
        """The cell of descriptor ``values`` (keyed by kind; missing means unknown)."""
        out: list[int] = []
        for d in self.descriptors:
            v = values.get(d.kind.value)
            out.append(d.bin(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None))
        return tuple(out)

    def measure(
        self, candidate: Candidate, result: EvalResult, *, task_ops: int | None = None
    ) -> dict[str, ParamValue]:
        """Descriptor values of a candidate, with ``<kind>_from`` saying measured or read from code."""
        out: dict[str, ParamValue] = {}
        for d in self.descriptors:
            value, origin = _value(d.kind, candidate, result, task_ops)
            if value is not None:
                out[d.kind.value] = value
                out[f"{d.kind.value}_from"] = origin
        return out


_JIT = re.compile(r"@triton\.jit\b")
_GLOBAL = re.compile(r"__global__\s+(?:void|static)")
_BLOCK_ASSIGN = re.compile(r"\b(BLOCK[A-Z0-9_]*)\s*(?::\s*tl\.constexpr\s*)?=\s*(\d+)\b")
_WARPS = re.compile(r"\bnum_warps\s*=\s*(\d+)\b")


def code_kernel_count(source: str) -> int:
    """Kernels defined in a candidate's source (Triton JIT functions and CUDA ``__global__``)."""
    return len(_JIT.findall(source)) + len(_GLOBAL.findall(source))


def tile_elements(params: Mapping[str, ParamValue], source: str) -> tuple[int | None, str]:
    """Elements of one tile (product of the block sizes) and where they were read.

    The ``BLOCK…`` constants in the source come first: they are what the kernel is launched with.
    ``Proposal.params`` are the fallback (a source that computes its blocks at run time): a
    template's params may also describe template families the candidate does not use.
    """
    blocks: dict[str, int] = {}
    for name, value in _BLOCK_ASSIGN.findall(source):
        blocks[name] = max(blocks.get(name, 0), int(value))
    blocks = {k: v for k, v in blocks.items() if v > 0}
    if blocks:
        return math.prod(blocks.values()), "code"
    from_params = [int(v) for k, v in params.items() if "block" in k.lower() and isinstance(v, int) and v > 0]
    return (math.prod(from_params) if from_params else None), "params"


def _warps(params: Mapping[str, ParamValue], source: str) -> tuple[int | None, str]:
    found = [int(x) for x in _WARPS.findall(source)]
    if found:
        return max(found), "code"
    value = params.get("num_warps")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, "params"
    return None, "params"


def _launches(candidate: Candidate, result: EvalResult) -> tuple[int | None, str]:
    if result.profile is not None and result.profile.kernel_launches is not None:
        return result.profile.kernel_launches, "measured"
    count = code_kernel_count(candidate.proposal.source)
    return (count if count > 0 else None), "code"


def _value(
    kind: DescriptorKind, candidate: Candidate, result: EvalResult, task_ops: int | None
) -> tuple[float | int | None, str]:
    source, params = candidate.proposal.source, candidate.proposal.params
    if kind is DescriptorKind.LAUNCHES:
        return _launches(candidate, result)
    if kind is DescriptorKind.TILE:
        elements, origin = tile_elements(params, source)
        return (round(math.log2(elements), 3) if elements else None), origin
    if kind is DescriptorKind.WARPS:
        return _warps(params, source)
    if kind is DescriptorKind.FUSION:
        launches, origin = _launches(candidate, result)
        if task_ops is None or not launches:
            return None, origin
        return round(task_ops / launches, 3), origin
    if kind is DescriptorKind.DOT:
        uses = "tl.dot(" in source or "mma" in source or "wmma::" in source
        return int(uses), "code"
    fraction = result.sol.fraction if result.sol is not None else None
    return fraction, "measured"
