"""Concatenation: ``torch.cat`` (``torch.concat``, ``torch.concatenate``) and ``torch.stack`` of
float or int64 tensors (a stack is a ``cat`` of its parts viewed with a new dim of one; int64
parts, a meshgrid's coordinates or topk's indices, are read and joined as integers).

One ``cat`` gather node whose arguments are the parts, stored first (by the kernels that make
them, or the model's inputs and weights) and read at computed addresses: each output element
works out its coordinate along the joined dim, the part it falls in and that part's element, and
loads it (the parts' loads masked to their own range, picked with ``tl.where``). The elementwise
ops after the concatenation fuse into that kernel. Empty parts are left out; one part is the part
itself. Declined, with the reason: parts of other shapes (beyond the joined dim) or dtypes. A
transposed part is copied in order first (``families/strided.py``). More than 16 parts join in two
steps (a ``cat`` of ``cat`` nodes).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import EW_OPS, Node, NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

MAX_PARTS = 16
"""Most parts one ``cat`` node reads (one masked load each per output element)."""

EW_OPS["cat"] = (2, 1)  # at least two parts; the joined dim
spell(Spec("cat", (("tensors", REQUIRED), ("dim", 0))), functions=(torch.cat, torch.concat, torch.concatenate))
spell(Spec("stack", (("tensors", REQUIRED), ("dim", 0))), functions=(torch.stack,))


@lowering("cat")
def _cat(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    refs, dtype = _parts(lw, b, "torch.cat")
    shapes = [lw.shape(r) for r in refs]
    rank = len(shapes[0])
    dim = b.get("dim", 0)
    if not isinstance(dim, int) or rank == 0 or not -rank <= dim < rank:
        raise UnsupportedGraph(f"torch.cat along dim {dim!r} of {rank}-dim parts is not covered")
    dim %= rank
    for s in shapes:
        if len(s) != rank or s[:dim] != shapes[0][:dim] or s[dim + 1 :] != shapes[0][dim + 1 :]:
            raise UnsupportedGraph(f"torch.cat of parts of shapes {shapes} along dim {dim} is not covered")
    kept = [r for r, s in zip(refs, shapes, strict=True) if s[dim] > 0]
    if not kept:
        raise UnsupportedGraph("torch.cat of empty parts only is not covered")
    return kept[0] if len(kept) == 1 else join(lw, kept, dim, dtype)


def _parts(lw: LowerContext, b: dict[str, Any], what: str) -> tuple[list[NodeRef], str]:
    """The parts of a ``cat`` or ``stack`` call and their one dtype; declined (with ``what``) for
    something other than a list of tensors and for mixed dtypes."""
    parts = b["tensors"]
    if isinstance(parts, TupleRef):  # an op's tuple of tensors (``torch.stack(torch.meshgrid(...))``)
        parts = list(parts.items)
    if not isinstance(parts, list | tuple) or not parts:
        raise UnsupportedGraph(f"{what} of something other than a list of tensors is not covered")
    refs = [p if _int64(lw, p) else lw.tensor(p, f"a part of {what}") for p in parts]
    dtypes = {lw.node(r).dtype for r in refs}
    if len(dtypes) != 1:
        raise UnsupportedGraph(f"{what} of parts of dtypes {sorted(dtypes)} is not covered")
    return refs, dtypes.pop()


def _int64(lw: LowerContext, part: object) -> bool:
    return isinstance(part, NodeRef) and lw.node(part).dtype == "int64"


@lowering("stack")
def _stack(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``torch.stack``: each part viewed with a dim of one at ``dim``, then joined along it."""
    refs, dtype = _parts(lw, b, "torch.stack")
    shapes = {lw.shape(r) for r in refs}
    if len(shapes) != 1:
        raise UnsupportedGraph(f"torch.stack of parts of shapes {sorted(shapes)} is not covered")
    shape = shapes.pop()
    dim = b.get("dim", 0)
    if not isinstance(dim, int) or not -len(shape) - 1 <= dim <= len(shape):
        raise UnsupportedGraph(f"torch.stack along dim {dim!r} of {len(shape)}-dim parts is not covered")
    dim %= len(shape) + 1
    viewed = [lw.view(r, (*shape[:dim], 1, *shape[dim:])) for r in refs]
    return viewed[0] if len(viewed) == 1 else join(lw, viewed, dim, dtype)


def join(lw: LowerContext, parts: list[NodeRef], dim: int, dtype: str) -> NodeRef:
    """One ``cat`` node of ``parts``; of more than :data:`MAX_PARTS`, a ``cat`` of the ``cat`` of
    each run of consecutive parts (a dense block's concatenation of all its layers' outputs: the
    runs are copied once more, and every kernel reads at most ``MAX_PARTS`` parts)."""
    parts = [lw.in_order(r) for r in parts]  # a transposed part: copied in order first
    if len(parts) > MAX_PARTS:
        size = -(-len(parts) // MAX_PARTS)
        runs = [parts[i : i + size] for i in range(0, len(parts), size)]
        parts = [run[0] if len(run) == 1 else join(lw, run, dim, dtype) for run in runs]
        if len(parts) > MAX_PARTS:
            return join(lw, parts, dim, dtype)
    out = list(lw.shape(parts[0]))
    out[dim] = sum(lw.shape(r)[dim] for r in parts)
    return lw.add(NodeKind.EW, tuple(out), op="cat", args=tuple(r.id for r in parts), attrs=(float(dim),), dtype=dtype)


@gather_emitter("cat", sources=0)
def _emit_cat(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each element's coordinate along the joined dim picks the part it is read from."""
    dim = int(node.attrs[0])
    shape = node.shape
    size, inner = shape[dim], math.prod(shape[dim + 1 :])
    sp = w.space(row)
    at = sp.index(shape, (0, len(shape)))
    c, outer, rest = f"c{node.id}", f"o{node.id}", f"r{node.id}"
    w.emit(scope, f"{c} = (({at}) // {inner}) % {size}")
    w.emit(scope, f"{outer} = ({at}) // {inner * size}")
    w.emit(scope, f"{rest} = ({at}) % {inner}")
    start = 0
    widen = "" if node.dtype == "int64" else ".to(tl.float32)"  # indices (topk's, a meshgrid's) stay integers
    other = "0" if node.dtype == "int64" else "0.0"
    pieces: list[tuple[int, str]] = []
    for i, src in enumerate(node.tensor_args()):
        base = w.gather_source(node, "parts of torch.cat", i)
        part = w.plan.nodes[src].shape[dim]
        var = f"v{node.id}_{i}"
        at_part = f"({outer} * {part} + ({c} - {start})) * {inner} + {rest}"
        ok = f"({sp.mask}) & ({c} >= {start}) & ({c} < {start + part})"
        w.emit(scope, f"{var} = tl.load({w.pointer(base)} + {at_part}, mask={ok}, other={other}){widen}")
        start += part
        pieces.append((start, var))
    expr = pieces[-1][1]
    for end, var in reversed(pieces[:-1]):
        expr = f"tl.where({c} < {end}, {var}, {expr})"
    out = f"v{node.id}"
    w.emit(scope, f"{out} = {expr}")
    return out
