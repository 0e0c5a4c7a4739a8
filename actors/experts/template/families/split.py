"""Parts of a tensor and broadcast copies: ``split``, ``chunk``, ``unbind``, ``narrow``, ``select``,
``expand``; and ``glu``, two halves of one tensor.

``x.split(size_or_sizes, dim)``, ``x.chunk(n, dim)``, ``x.unbind(dim)``, ``x.narrow(dim, start,
length)`` and ``x.select(dim, i)`` (and their ``torch.`` spellings) are slices of ``x`` along one
dim: each part becomes
the ``slice`` gather node of ``families/slicing.py`` (a part that is all of ``x`` is ``x``), so a
part read by elementwise ops is read in place by their kernel, and a model's ``q, k, v =
qkv.split(d, dim=-1)`` or ``x1, x2 = x.chunk(2, dim=-1)`` needs no copy of its own. The parts are
those PyTorch returns (the traced results' shapes), so a last, shorter part is covered.

``x.expand(*sizes)``, ``x.expand_as(y)`` and ``torch.broadcast_to(x, shape)`` become a
``strided`` copy (``families/strided.py``) with a stride of 0 along each dim they broadcast,
for the ops that read their operand whole (a ``cat`` of a class token expanded over the batch).
``torch.meshgrid(*tensors, indexing)`` is each tensor viewed along its own dim and expanded so
(a detection head's cell grid: ``torch.stack(torch.meshgrid(ys, xs, indexing="ij"))``).

``F.glu(x, dim)`` and ``nn.GLU(dim)`` (a gated linear unit: ``a * sigmoid(b)`` of ``x``'s two
halves) multiply two such slices in one elementwise kernel.

Declined, with the reason: a dim that is not an int, parts of other tensors than float or bool
ones (the slices' own rule).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.slicing import part
from actors.experts.template.families.strided import addressed, strided
from actors.experts.template.ir import NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext, lower_fn, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

spell(
    Spec("split", (("input", REQUIRED), ("split_size_or_sections", REQUIRED), ("dim", 0))),
    functions=(torch.split,),
    methods=("split",),
)
spell(
    Spec("chunk", (("input", REQUIRED), ("chunks", REQUIRED), ("dim", 0))), functions=(torch.chunk,), methods=("chunk",)
)
spell(Spec("unbind", (("input", REQUIRED), ("dim", 0))), functions=(torch.unbind,), methods=("unbind",))
spell(
    Spec("narrow", (("input", REQUIRED), ("dim", REQUIRED), ("start", REQUIRED), ("length", REQUIRED))),
    functions=(torch.narrow,),
    methods=("narrow",),
)
spell(
    Spec("select", (("input", REQUIRED), ("dim", REQUIRED), ("index", REQUIRED))),
    functions=(torch.select,),
    methods=("select",),
)
spell(Spec("glu", (("input", REQUIRED), ("dim", -1))), functions=(torch.nn.functional.glu,))
MODULES[torch.nn.GLU] = Spec("glu", (("input", REQUIRED),), module_attrs=(("dim", "dim"),))
_GRID = (("t0", REQUIRED), ("t1", None), ("t2", None), ("t3", None), ("indexing", None))
spell(Spec("meshgrid", _GRID), functions=(torch.meshgrid,))
spell(
    Spec("expand", (("input", REQUIRED),), passthrough=True),
    functions=(torch.broadcast_to,),
    methods=("expand", "expand_as"),
)


def _dim(lw: LowerContext, value: object, rank: int, op: str) -> int:
    dim = lw.arg(value)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        raise UnsupportedGraph(f"{op} along dim {dim!r} of a {rank}-dim tensor is not covered", op=op)
    return dim % rank


@lowering("select")
def _select(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``x.select(dim, i)``: the elements at ``i`` along ``dim``, the dim dropped (``x[:, i]``)."""
    x = b.get("input")
    if not isinstance(x, NodeRef) or not isinstance(traced, torch.Tensor):
        raise UnsupportedGraph("select of something that is not a tensor", op=canon)
    shape = lw.shape(x)
    dim = _dim(lw, b["dim"], len(shape), canon)
    index = lw.arg(b["index"])
    if not isinstance(index, int) or isinstance(index, bool) or not -shape[dim] <= index < shape[dim]:
        raise UnsupportedGraph(f"select of index {index!r} along a dim of {shape[dim]} is not covered", op=canon)
    return part(lw, x, dim, index % shape[dim], None)


@lowering("split", "chunk", "unbind", "narrow")
def _split(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    """The parts PyTorch returns (``traced``: a tuple of tensors, or one tensor for ``narrow``)."""
    x = b.get("input")
    if not isinstance(x, NodeRef):
        raise UnsupportedGraph(f"{canon} of something that is not a tensor", op=canon)
    shape = lw.shape(x)
    if not shape:
        raise UnsupportedGraph(f"{canon} of a tensor of no dims is not valid", op=canon)
    dim = _dim(lw, b["dim"], len(shape), canon)
    if canon == "narrow":
        start = lw.arg(b["start"])
        if not isinstance(traced, torch.Tensor) or not isinstance(start, int) or isinstance(start, bool):
            raise UnsupportedGraph("narrow with a start that is not an int is not covered", op=canon)
        start += shape[dim] if start < 0 else 0
        count = int(traced.shape[dim])
        return x if count == shape[dim] else part(lw, x, dim, start, count)
    if not isinstance(traced, tuple | list) or not all(isinstance(t, torch.Tensor) for t in traced) or not traced:
        raise UnsupportedGraph(f"{canon}: the traced result is not a tuple of tensors", op=canon)
    parts: list[NodeRef] = []
    start = 0
    for t in traced:
        out = tuple(int(s) for s in t.shape)
        if canon == "unbind":
            parts.append(part(lw, x, dim, start, None))
            start += 1
            continue
        count = out[dim]
        parts.append(x if count == shape[dim] else part(lw, x, dim, start, count))
        start += count
    if start != shape[dim]:
        raise UnsupportedGraph(f"{canon} of {shape}: the parts do not cover dim {dim}", op=canon)
    return TupleRef(tuple(parts))


@lowering("glu")
def _glu(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``F.glu(x, dim)`` / ``nn.GLU(dim)``: the first half of ``x`` along ``dim`` times the sigmoid of
    the second, both halves read in place by one elementwise kernel."""
    x = lw.tensor(b.get("input"), "the input of glu")
    shape = lw.shape(x)
    if not shape:
        raise UnsupportedGraph("glu of a tensor of no dims is not valid", op=canon)
    dim = _dim(lw, b["dim"], len(shape), canon)
    if shape[dim] % 2:
        raise UnsupportedGraph(f"glu along a dim of odd size {shape[dim]} is not valid", op=canon)
    half = shape[dim] // 2
    first, second = (part(lw, x, dim, start, half) for start in (0, half))
    return lw.ew("mul", first, lw.ew("sigmoid", second))


@lowering("expand")
def _expand(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``x`` broadcast to the traced result's shape: a copy reading each broadcast dim with stride 0
    (int64 indices too: ``idx[..., None].expand(...)`` before a ``torch.gather``)."""
    given = b.get("input")
    indices = isinstance(given, NodeRef) and lw.node(given).dtype == "int64"
    x = given if indices and isinstance(given, NodeRef) else lw.tensor(given, "the input of expand")
    if not isinstance(traced, torch.Tensor):
        raise UnsupportedGraph("expand: the traced result is not a tensor", op=canon)
    out = tuple(int(s) for s in traced.shape)
    shape = lw.shape(x)
    if out == shape:
        return x
    lead = len(out) - len(shape)
    if lead < 0 or any(s not in (1, o) for s, o in zip(shape, out[lead:], strict=True)):
        raise UnsupportedGraph(f"expand of {shape} to {out} is not valid", op=canon)
    src, dims = addressed(lw, x)
    per_dim = [-1] * lead + [-1 if s == 1 and o != 1 else d for s, o, d in zip(shape, out[lead:], dims, strict=True)]
    return strided(lw, src, out, per_dim)  # only dims of one added in front: a view (``strided``'s own rule)


@lowering("meshgrid")
def _meshgrid(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> TupleRef:
    """``torch.meshgrid(*tensors, indexing)``: each 0- or 1-dim tensor viewed along its own dim and
    expanded to the grid (``xy`` swaps the first two dims, as PyTorch does); at most four."""
    first = b.get("t0")
    given = list(first) if isinstance(first, tuple | list) else [first, b.get("t1"), b.get("t2"), b.get("t3")]
    parts = [p for p in given if p is not None]
    indexing = lw.arg(b.get("indexing")) or "ij"
    if indexing not in ("ij", "xy") or not parts or len(parts) > 4:
        raise UnsupportedGraph(f"torch.meshgrid of {len(parts)} tensors, indexing={indexing!r}", op=canon)
    refs: list[NodeRef] = []
    for p in parts:
        if not isinstance(p, NodeRef) or len(lw.shape(p)) > 1:
            raise UnsupportedGraph("torch.meshgrid of other than 0- or 1-dim tensors", op=canon)
        refs.append(p)
    sizes = [math.prod(lw.shape(r)) for r in refs]
    where = list(range(len(refs)))
    if indexing == "xy" and len(refs) >= 2:
        where[0], where[1] = 1, 0
    grid = [0] * len(refs)
    for k, size in zip(where, sizes, strict=True):
        grid[k] = size
    expand = lower_fn("expand")
    assert expand is not None
    outs: list[NodeRef] = []
    for r, k in zip(refs, where, strict=True):
        along = [1] * len(refs)
        along[k] = grid[k]
        out = expand(lw, "expand", {"input": lw.view(r, tuple(along))}, torch.empty(grid, device="meta"))
        assert isinstance(out, NodeRef)
        outs.append(out)
    return TupleRef(tuple(outs))
