"""Padding: ``F.pad(x, pad, mode, value)`` in the ``constant``, ``reflect``, ``replicate`` and
``circular`` modes, ``torch.constant_pad_nd(x, pad, v)``, and the modules ``nn.ConstantPad1-3d``,
``nn.ZeroPad1-3d``, ``nn.ReflectionPad1-3d``, ``nn.ReplicationPad1-3d`` and ``nn.CircularPad1-3d``.

One ``pad`` gather node reads its stored source at computed addresses, as ``slice`` and ``cat``
do: each output element's coordinate on each dim, less the pad before that dim, is its source
coordinate; inside the source it loads that element, elsewhere it takes the fill value. ``pad``
lists (before, after) pairs from the last dim backwards, as PyTorch does; a negative amount crops
that side, which the same rule covers (the source coordinate only moves further inside). ``attrs``
hold the fill value, then, per dim of the source, its pad before. The elementwise ops after it
fuse into its kernel. A pad of zero everywhere is a view, no kernel. The other modes are the
same node with the mode in its op (``pad_reflect``, ``pad_replicate``, ``pad_circular``): a
coordinate outside the source is mirrored about its edge (without repeating it), clamped to it,
or wrapped around, as PyTorch's modes define; every element then reads the source.

Declined, with the reason: a fill value that is not a number (or NaN), pads that are not ints,
more pairs than dims, pads that leave a dim empty, a reflect pad as wide as its dim or wider, a
circular pad wider than its dim, negative pads outside the constant mode, and sources of dtypes
other than float. A transposed source is copied in order first (``families/strided.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from actors.experts.template.emit import Scope, Writer, axis_coord, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import lit
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec

EW_OPS["pad"] = (1, 0)  # the source; its attrs (the fill value, then one per source dim) are not a fixed count
_MODES = {"constant": "pad", "reflect": "pad_reflect", "replicate": "pad_replicate", "circular": "pad_circular"}
for _op in _MODES.values():
    EW_OPS[_op] = (1, 0)
for _nd in (1, 2, 3):
    for _name, _mode in (("Reflection", "reflect"), ("Replication", "replicate"), ("Circular", "circular")):
        MODULES[getattr(nn, f"{_name}Pad{_nd}d")] = Spec(
            "pad", (("input", REQUIRED), ("mode", _mode)), module_attrs=(("pad", "padding"),)
        )
    for _name in ("Constant", "Zero"):
        MODULES[getattr(nn, f"{_name}Pad{_nd}d")] = Spec(
            "pad", (("input", REQUIRED),), module_attrs=(("pad", "padding"), ("value", "value"))
        )

_SOURCE_DTYPES = ("float32", *HALF)


def _amounts(lw: LowerContext, pad: object, rank: int) -> list[int]:
    """``pad`` (pairs from the last dim backwards) as the pad before each of ``rank`` dims, then after each."""
    pad = lw.arg(pad)
    if not isinstance(pad, list | tuple | torch.Size):
        raise UnsupportedGraph(f"F.pad with a pad of {type(pad).__name__} is not covered (a list of ints)", op="pad")
    amounts = [lw.arg(p) for p in pad]
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in amounts):
        raise UnsupportedGraph(f"F.pad with pad {amounts!r} is not covered (ints only)", op="pad")
    if len(amounts) % 2 or len(amounts) // 2 > rank:
        raise UnsupportedGraph(f"F.pad of a {rank}-dim tensor with pad {amounts!r} is not valid", op="pad")
    before, after = [0] * rank, [0] * rank
    for i in range(len(amounts) // 2):
        before[rank - 1 - i], after[rank - 1 - i] = amounts[2 * i], amounts[2 * i + 1]
    return before + after


def _fill(value: object) -> float:
    """The fill value as a float (``None``, PyTorch's default, is 0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise UnsupportedGraph(f"F.pad with value {value!r} is not covered (a number, not NaN)", op="pad")
    return float(value)


@lowering("pad")
def _pad(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``F.pad(b["input"], b["pad"], b["mode"], b["value"])``; ``traced`` is the traced result."""
    mode = lw.arg(b.get("mode", "constant"))
    if mode not in _MODES:
        raise UnsupportedGraph(f"F.pad mode {mode!r} is not covered (constant, reflect, replicate, circular)", op="pad")
    x = lw.tensor(b.get("input"), "the input of F.pad")
    dtype = lw.node(x).dtype
    if dtype not in _SOURCE_DTYPES:
        raise UnsupportedGraph(f"F.pad of a tensor of dtype {dtype} is not covered (float only)", op="pad")
    shape = lw.shape(x)
    rank = len(shape)
    amounts = _amounts(lw, b["pad"], rank)
    before, after = amounts[:rank], amounts[rank:]
    out = tuple(s + lo + hi for s, lo, hi in zip(shape, before, after, strict=True))
    if min(out, default=1) <= 0:
        raise UnsupportedGraph(f"F.pad of {shape} with pad {b['pad']!r} leaves an empty dim", op="pad")
    if not isinstance(traced, torch.Tensor) or tuple(traced.shape) != out:
        raise UnsupportedGraph(f"F.pad of {shape} with pad {b['pad']!r}: the traced result disagrees", op="pad")
    if not any(amounts):
        return lw.view(x, out)  # nothing added or cut: the tensor itself
    if mode != "constant":
        for size, lo, hi in zip(shape, before, after, strict=True):
            if min(lo, hi) < 0:
                raise UnsupportedGraph(
                    f"F.pad mode {mode!r} with a negative pad {lw.arg(b['pad'])!r} is not covered", op="pad"
                )
            if (mode == "reflect" and max(lo, hi) >= size) or (mode == "circular" and max(lo, hi) > size):
                raise UnsupportedGraph(
                    f"F.pad mode {mode!r} of a dim of {size} by {max(lo, hi)} is not valid", op="pad"
                )
    x = lw.in_order(x)
    attrs = (_fill(lw.arg(b.get("value"))) if mode == "constant" else 0.0, *map(float, before))
    return lw.add(NodeKind.EW, out, op=_MODES[mode], args=(x.id,), attrs=attrs, dtype=dtype)


def padded(lw: LowerContext, x: NodeRef, pad: list[int], value: float = 0.0, mode: str = "constant") -> NodeRef:
    """``F.pad(x, pad, mode, value)`` (``pad``: (before, after) pairs from the last dim backwards)
    from another family's lowering (local response norm's channel window, a convolution's
    ``padding_mode``)."""
    shape = lw.shape(x)
    out = list(shape)
    for i in range(len(pad) // 2):
        out[len(shape) - 1 - i] += pad[2 * i] + pad[2 * i + 1]
    got = _pad(lw, "pad", {"input": x, "pad": pad, "mode": mode, "value": value}, torch.empty(out, device="meta"))
    assert isinstance(got, NodeRef)
    return got


def _axes(src: tuple[int, ...], out: tuple[int, ...], before: list[int]) -> list[tuple[int, int, int]]:
    """The pad as (output extent, source extent, pad before) per axis, outermost first: dims the
    pad leaves alone join the dim inside them when that one is left alone too (``(B, H, W, C)``
    padded on H and W reads ``C`` as one axis and ``B`` as another)."""
    merged: list[list[int]] = []  # innermost first
    for s, o, lo in zip(reversed(src), reversed(out), reversed(before), strict=True):
        if merged and s == o and lo == 0 and merged[-1][0] == merged[-1][1] and merged[-1][2] == 0:
            merged[-1] = [merged[-1][0] * o, merged[-1][1] * s, 0]
        else:
            merged.append([o, s, lo])
    return [(o, s, lo) for o, s, lo in reversed(merged)]


def _emit_pad(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each element's coordinates, less the pads before, address the source; outside it, the fill
    (``pad``), or the coordinate mirrored, clamped or wrapped into it (the other modes)."""
    base = w.gather_source(node, "pads")
    src = w.plan.nodes[node.tensor_args()[0]]
    rank = len(src.shape)
    fill = node.attrs[0]
    before = [int(a) for a in node.attrs[1 : 1 + rank]]
    axes = _axes(src.shape, node.shape, before)
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    terms: list[str] = []
    inside: list[str] = []
    out_inner, src_stride = 1, 1
    for i in reversed(range(len(axes))):  # innermost first
        extent, size, lo = axes[i]
        coord = axis_coord(at, out_inner, extent, outermost=i == 0)
        padded = bool(lo) or extent != size
        if padded:
            var = f"c{node.id}_{i}"
            shift = f" - {lo}" if lo > 0 else f" + {-lo}" if lo < 0 else ""
            w.emit(scope, f"{var} = {coord}{shift}")
            if node.op == "pad":
                inside.append(f"({var} >= 0) & ({var} < {size})")
            elif node.op == "pad_reflect":  # -1 -> 1, size -> size - 2
                w.emit(scope, f"{var} = tl.where({var} < 0, -{var}, {var})")
                w.emit(scope, f"{var} = tl.where({var} >= {size}, {2 * (size - 1)} - {var}, {var})")
            elif node.op == "pad_replicate":
                w.emit(scope, f"{var} = tl.minimum(tl.maximum({var}, 0), {size - 1})")
            else:  # circular
                w.emit(scope, f"{var} = ({var} + {size}) % {size}")
            coord = var
        if size > 1 or padded:  # a padded axis of one still takes part (its coordinate is 0 inside)
            terms.append(coord if src_stride == 1 else f"{coord} * {src_stride}")
        out_inner *= extent
        src_stride *= size
    where, ok = f"s{node.id}", f"k{node.id}"
    w.emit(scope, f"{where} = {' + '.join(reversed(terms))}")  # a padded axis is always among them
    w.emit(scope, f"{ok} = ({sp.mask})" + "".join(f" & {c}" for c in inside))
    var = f"v{node.id}"
    # The fill is the masked load's ``other``, so it takes the source's dtype first, as in PyTorch.
    w.emit(scope, f"{var} = tl.load({w.pointer(base)} + {where}, mask={ok}, other={lit(fill)}).to(tl.float32)")
    return var


for _op in _MODES.values():
    gather_emitter(_op, sources=0)(_emit_pad)
