"""The fits of ``any_sizes``, as data: how a plan's dimensions follow the task's free sizes
(``Plan.sizes``), and their plain JSON form (the analysis child process and the plan store send
plans that way). Nothing here imports the rest of the template package."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Factor = tuple[int, int, int]
"""``(size index, a, b)``: the factor ``a * s + b`` of a fitted quantity."""
Floor = tuple[int, int, int, int]
"""``(size index, a, b, q)``: the factor ``(a * s + b) // q`` (a strided window's output, ``q``
the strides of the windows that led there multiplied), with ``a * s + b >= q`` wherever the
reference takes ``s`` (so Python's floor and the kernels' truncating division agree)."""


@dataclass(frozen=True)
class Fit:
    """A quantity fitted to the sizes: ``scale * prod(a * s[i] + b for (i, a, b) in factors)
    * prod((a * s[i] + b) // q for (i, a, b, q) in floors)``."""

    scale: int
    factors: tuple[Factor, ...] = ()
    floors: tuple[Floor, ...] = ()

    @property
    def moves(self) -> bool:
        """Whether it follows some size."""
        return bool(self.factors or self.floors)

    def at(self, sizes: tuple[int, ...]) -> int:
        """Its value at ``sizes``."""
        affine = math.prod(a * sizes[i] + b for i, a, b in self.factors)
        return self.scale * affine * math.prod((a * sizes[i] + b) // q for i, a, b, q in self.floors)

    def text(self, names: tuple[str, ...]) -> str:
        """Its expression in the run-time size variables ``names``."""
        parts = [_affine(names[i], a, b) for i, a, b in self.factors]
        parts += [_floor(names[i], a, b, q) for i, a, b, q in self.floors]
        if self.scale != 1 or not parts:
            parts.insert(0, str(self.scale))
        return parts[0] if len(parts) == 1 else "(" + " * ".join(parts) + ")"


def _floor(name: str, a: int, b: int, q: int) -> str:
    inner = _affine(name, a, b)
    return f"({inner} // {q})"


def _affine(name: str, a: int, b: int) -> str:
    term = name if a == 1 else f"{a} * {name}"
    if not b:
        return term if a == 1 else f"({term})"
    return f"({term} {'+' if b > 0 else '-'} {abs(b)})"


@dataclass(frozen=True)
class Sizes:
    """What :func:`find` found (``Plan.sizes``): the sizes, how every dimension and moving constant
    follows them, and the smallest value of each the reference takes."""

    names: tuple[str, ...] = ()
    values: tuple[int, ...] = ()
    """At the reference's shapes."""
    dims: tuple[tuple[Fit | None, ...], ...] = ()
    """Per node, per dimension: its fit (``None``: a constant)."""
    args: tuple[tuple[Fit | None, ...], ...] = ()
    """Per node, per argument: the fit of a float constant that moves (``None``: it does not)."""
    least: tuple[int, ...] = ()
    """Per size, the smallest the reference takes (1, or 2: batch norm's statistics)."""
    plan: Any = None
    """The plan the fits are of where it is not the plan that holds them (an ``ir.Plan``): the
    reference lowered without choices taken by size (a reduction over few huge rows split in
    parts), whose copy then runs at every size but the task's; ``None``: the plan itself."""

    def __bool__(self) -> bool:
        return bool(self.names)

    @property
    def variables(self) -> tuple[str, ...]:
        """The run-time variables: ``kf_<size name>``."""
        return tuple(f"kf_{name}" for name in self.names)


def to_data(found: Sizes) -> dict[str, Any]:
    """``found`` as plain JSON-able data (``Plan.sizes`` in ``plan_to_dict``)."""

    def fit(f: Fit | None) -> list[Any] | None:
        if f is None:
            return None
        return [f.scale, [list(x) for x in f.factors], *([[list(x) for x in f.floors]] if f.floors else [])]

    return {
        "names": list(found.names),
        "values": list(found.values),
        "dims": [[fit(f) for f in row] for row in found.dims],
        "args": [[fit(f) for f in row] for row in found.args],
        "least": list(found.least),
    }


def from_data(data: Mapping[str, Any] | None) -> Sizes:
    """The inverse of :func:`to_data` (empty data: no sizes)."""
    if not data:
        return Sizes()

    def fit(f: Any) -> Fit | None:
        if f is None:
            return None
        floors = tuple((int(i), int(a), int(b), int(q)) for i, a, b, q in f[2]) if len(f) > 2 else ()
        return Fit(int(f[0]), tuple((int(i), int(a), int(b)) for i, a, b in f[1]), floors)

    return Sizes(
        names=tuple(str(n) for n in data["names"]),
        values=tuple(int(v) for v in data["values"]),
        dims=tuple(tuple(fit(f) for f in row) for row in data["dims"]),
        args=tuple(tuple(fit(f) for f in row) for row in data["args"]),
        least=tuple(int(v) for v in data["least"]),
    )
