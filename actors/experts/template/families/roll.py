"""``torch.roll`` (``Tensor.roll``): the elements shifted cyclically along some dims (Swin's shifted
windows: ``torch.roll(x, shifts=(-3, -3), dims=(1, 2))``).

It becomes one ``roll`` gather node of the source's shape: each output element reads its stored
source at ``sum(((c_d - shift_d) mod n_d) * stride_d)``; ``attrs`` hold each dim's shift, reduced
to ``[0, n_d)``. Dims that are not rolled join the dim inside them when that one is not rolled
either, so a roll of ``(B, H, W, C)`` over H and W reads ``C`` as one axis. Without ``dims`` the
flattened tensor is rolled and viewed back, as PyTorch does. The elementwise ops after it fuse into
its kernel. A roll by whole turns is the tensor itself (a view, no kernel).

Declined, with the reason: shifts or dims that are not ints, shifts and dims of different lengths,
and sources of other dtypes than float. A transposed source is copied in order first.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.emit import Scope, Writer, axis_coord, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

EW_OPS["roll"] = (1, 0)  # the source; its attrs (one shift per source dim) are not a fixed count
spell(
    Spec("roll", (("input", REQUIRED), ("shifts", REQUIRED), ("dims", None))),
    functions=(torch.roll,),
    methods=("roll",),
)

_SOURCE_DTYPES = ("float32", *HALF)


def _ints(lw: LowerContext, value: object, what: str) -> list[int]:
    """An int or a tuple or list of ints, as a list."""
    value = lw.arg(value)
    items = [lw.arg(v) for v in (value if isinstance(value, tuple | list | torch.Size) else [value])]
    ints = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    if not items or len(ints) != len(items):
        raise UnsupportedGraph(f"torch.roll with {what} {value!r} is not covered (ints only)", op="roll")
    return ints


@lowering("roll")
def _roll(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``torch.roll(b["input"], b["shifts"], b["dims"])``."""
    x = lw.tensor(b.get("input"), "the input of torch.roll")
    if lw.node(x).dtype not in _SOURCE_DTYPES:
        raise UnsupportedGraph(f"torch.roll of a tensor of dtype {lw.node(x).dtype} is not covered", op="roll")
    shape = lw.shape(x)
    shifts = _ints(lw, b["shifts"], "shifts")
    if b.get("dims") is None:  # the flattened tensor is rolled, then viewed back
        if len(shifts) != 1:
            raise UnsupportedGraph(f"torch.roll with shifts {shifts} and no dims is not valid", op="roll")
        src, dims = lw.view(x, (math.prod(shape),)), [0]
    else:
        src, dims = x, _ints(lw, b["dims"], "dims")
    flat = lw.shape(src)
    rank = len(flat)
    if len(dims) != len(shifts) or not all(-rank <= d < rank for d in dims):
        raise UnsupportedGraph(f"torch.roll of {shape} with shifts {shifts} and dims {dims} is not covered", op="roll")
    per_dim = [0] * rank
    for shift, dim in zip(shifts, dims, strict=True):  # a dim named twice is rolled by both
        per_dim[dim % rank] = (per_dim[dim % rank] + shift) % flat[dim % rank]
    if not any(per_dim):
        return x  # whole turns: every element stays where it is
    src = lw.in_order(src)
    attrs = tuple(map(float, per_dim))
    rolled = lw.add(NodeKind.EW, flat, op="roll", args=(src.id,), attrs=attrs, dtype=lw.node(x).dtype)
    return lw.view(rolled, shape)


def _axes(shape: tuple[int, ...], shifts: list[int]) -> list[tuple[int, int]]:
    """(extent, shift) per axis, outermost first: adjacent dims not rolled are one axis."""
    merged: list[list[int]] = []  # innermost first
    for n, s in zip(reversed(shape), reversed(shifts), strict=True):
        if merged and s == 0 and merged[-1][1] == 0:
            merged[-1][0] *= n
        else:
            merged.append([n, s])
    return [(n, s) for n, s in reversed(merged)]


@gather_emitter("roll", sources=0)
def _emit_roll(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each element's coordinate along a rolled axis, less the shift (mod the extent), addresses the source."""
    base = w.gather_source(node, "rolls")
    axes = _axes(node.shape, [int(a) for a in node.attrs])
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    terms: list[str] = []
    inner = 1
    for i in reversed(range(len(axes))):  # innermost first
        extent, shift = axes[i]
        coord = axis_coord(at, inner, extent, outermost=i == 0)
        if shift:
            coord = f"(({coord} + {extent - shift}) % {extent})"
        if extent > 1:
            terms.append(coord if inner == 1 else f"{coord} * {inner}")
        inner *= extent
    where, var = f"s{node.id}", f"v{node.id}"
    w.emit(scope, f"{where} = {' + '.join(reversed(terms))}")
    w.emit(scope, f"{var} = tl.load({w.pointer(base)} + {where}, mask={sp.mask}, other=0.0).to(tl.float32)")
    return var
