"""The nesting of a forward's outputs (an ``nn.LSTM``'s ``(output, (h, c))``), as a worker reports
it and the parent compares it with the reference's.

The outputs are judged flattened in order; their nesting is compared here, so a candidate that
returns ``(a, b, c)`` where the reference returns ``(a, (b, c))`` is incorrect: a user's model
that unpacks the reference's result would break on it. Nesting and lengths must match; a list
where the reference returns a tuple (or the reverse) is accepted, since both unpack and index
alike. A tensor and a tuple of one tensor differ.

Wire form (JSON, made by :func:`gpu_runner.sandboxed.common.output_structure`): a leaf is a string
(``"tensor"``, or a non-tensor's type name); a tuple or list is an array whose first item is
``"tuple"`` or ``"list"`` and whose other items are its items. A candidate's process may report
anything: :func:`read` takes only that form, bounded in depth and size, and anything else is a
structure it did not report.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_DEPTH = 32
"""Deepest nesting read from a report."""
MAX_NODES = 4096
"""Most leaves and sequences read from a report."""
DESCRIBED_CHARS = 200
"""Longest description of a structure in a verdict."""


@dataclass(frozen=True)
class Nest:
    """A tuple or a list of outputs."""

    kind: str
    """``"tuple"`` or ``"list"``."""
    items: tuple[Nest | str, ...]


Structure = Nest | str
"""A read structure: a :class:`Nest`, or a leaf's name."""


def read(value: object) -> Structure | None:
    """A reported structure, or None where ``value`` is not one in the wire form (or too large)."""
    budget = [MAX_NODES]

    def node(v: object, depth: int) -> Structure | None:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            return None
        if isinstance(v, str):
            return v[:40]
        if not isinstance(v, list) or not v or v[0] not in ("tuple", "list"):
            return None
        items = [node(x, depth + 1) for x in v[1:]]
        if any(x is None for x in items):
            return None
        return Nest(str(v[0]), tuple(x for x in items if x is not None))

    return node(value, 0)


def same(a: Structure, b: Structure) -> bool:
    """Whether two structures nest alike (leaves are alike; a tuple and a list are alike)."""
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)
    return len(a.items) == len(b.items) and all(same(x, y) for x, y in zip(a.items, b.items, strict=True))


def describe(s: Structure) -> str:
    """``(tensor, (tensor, tensor))``; a list in brackets, a tuple of one as ``(tensor,)``."""

    def text(n: Structure) -> str:
        if isinstance(n, str):
            return n
        inner = ", ".join(text(x) for x in n.items)
        if n.kind == "list":
            return f"[{inner}]"
        return f"({inner},)" if len(n.items) == 1 else f"({inner})"

    out = text(s)
    return out if len(out) <= DESCRIBED_CHARS else out[: DESCRIBED_CHARS - 3] + "..."


def difference(reference: object, candidate: object) -> str | None:
    """What differs between the reference's reported structure and a candidate's, in words; None
    where they nest alike, or where the reference reported none (nothing to compare with)."""
    ref = read(reference)
    if ref is None:
        return None
    cand = read(candidate)
    if cand is None:
        return "output structure differs: the candidate's process reported no readable output structure"
    if same(ref, cand):
        return None
    return f"output structure differs: the reference returns {describe(ref)}, the candidate {describe(cand)}"
