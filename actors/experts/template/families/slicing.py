"""Basic indexing of a tensor: ``x[:, -1, :]``, ``x[t]``, ``x[:, :k]``, ``x[..., 1:5]``, ``x[:, None]``
(the core's ``getitem`` looks ``slice`` up in the registry once its own cases do not apply).

An index of ints, slices of any positive step (``None`` bounds and negative ones resolved against
the traced shape, as Python does), ``None`` (a new dim of one) and one ``Ellipsis``, alone or in a
tuple, becomes one ``slice`` gather node: it reads its stored source at computed addresses, each
output element at ``sum((start_d + c_d * step_d) * stride_d)`` over the source's dims. ``attrs``
hold, per dim of the source, its start, then, per dim, its count (an integer index is a count of
one; :data:`WHOLE` for a dim taken whole, so that the node is the same at every size of that dim
and the copies for other sizes read the dim's size from the source's shape), then, only where some
step is not 1 (a Swin patch merge's ``x[:, 0::2, 1::2, :]``), per dim, its step. The dims an
integer index drops and those ``None`` adds are of size one, so the output's linear index is the
same over its own shape as over the counts: the node has the traced result's shape and the emitter
needs nothing more. The elementwise ops after it fuse into its kernel, as after ``cat``. A
selection of the whole tensor in order (with new or dropped dims of one) is a view, no kernel; a
slice of a slice that kept every dim is one slice of the first one's source.

An int64 source (token ids shifted for a language model's targets, ``ids[:, 1:]``; a tabular
model's categorical column, ``cats[:, i]``) is read and kept as int64 (its values are indices).

Declined, with the reason: steps below 1 (PyTorch refuses them too), tensor indices (beyond ``x[idx]`` with one 1-dim
int64 tensor, which ``families/index.py`` reads), bool indices, an empty selection and sources of
other dtypes. A transposed source is copied in order first (``families/strided.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.any_batch import Sym
from actors.experts.template.emit import Scope, Writer, axis_coord, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering

EW_OPS["slice"] = (1, 0)  # the source; its attrs (two per source dim) are not a fixed count

_SOURCE_DTYPES = ("float32", "bool", "int64", *HALF)

WHOLE = -1.0
"""A count in a slice's ``attrs`` for a dim taken whole (start 0, every element)."""


def counts_of(node: Node, shape: tuple[int, ...]) -> list[int]:
    """The counts of a ``slice`` node over its source's ``shape`` (:data:`WHOLE` resolved)."""
    rank = len(shape)
    return [shape[d] if a == WHOLE else int(a) for d, a in enumerate(node.attrs[rank : 2 * rank])]


def steps_of(node: Node, rank: int) -> list[int]:
    """The steps of a ``slice`` node over a source of ``rank`` dims (1 each where none are held)."""
    held = node.attrs[2 * rank : 3 * rank]
    return [int(a) for a in held] if held else [1] * rank


def _bound(lw: LowerContext, value: object, what: str) -> int | None:
    """A slice bound as a Python int (one computed in forward, ``x.size(1) // 2``, was traced), or None."""
    value = lw.arg(value)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise UnsupportedGraph(f"a slice {what} of {type(value).__name__} is not covered (an int only)")


def _selection(lw: LowerContext, index: object, shape: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """Per dim of ``shape``: the first element ``index`` selects, how many (one for an int) and the
    step between them."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, NodeRef):
            raise UnsupportedGraph(
                "indexing by a tensor is covered only as x[idx] with one 1-dim int64 tensor", op="getitem"
            )
        if isinstance(item, bool) or not (item is None or item is Ellipsis or isinstance(item, int | slice)):
            raise UnsupportedGraph(f"indexing a tensor by {type(item).__name__} is not covered", op="getitem")
    consumed = sum(1 for item in items if isinstance(item, int | slice))
    ellipses = sum(1 for item in items if item is Ellipsis)
    if ellipses > 1 or consumed > len(shape):
        raise UnsupportedGraph(f"index {index!r} of a {len(shape)}-dim tensor is not valid", op="getitem")
    starts: list[int] = []
    counts: list[int] = []
    steps: list[int] = []
    for item in items:
        if item is Ellipsis:
            for d in range(len(starts), len(starts) + len(shape) - consumed):
                starts.append(0)
                counts.append(shape[d])
                steps.append(1)
        elif isinstance(item, slice):
            size = shape[len(starts)]
            step = _bound(lw, item.step, "step")
            if step is not None and step < 1:
                raise UnsupportedGraph(f"a slice with step {step} is not valid (PyTorch takes steps of 1 or more)")
            picked = range(*slice(_bound(lw, item.start, "start"), _bound(lw, item.stop, "stop"), step).indices(size))
            starts.append(picked.start if picked else 0)
            counts.append(len(picked))
            steps.append(picked.step if len(picked) > 1 else 1)
        elif isinstance(item, int):
            size = shape[len(starts)]
            if not -size <= item < size:
                raise UnsupportedGraph(f"index {item} of a dim of {size} is out of range", op="getitem")
            starts.append(item % size)
            counts.append(1)
            steps.append(1)
    for d in range(len(starts), len(shape)):  # the dims the index does not name: all of each
        starts.append(0)
        counts.append(shape[d])
        steps.append(1)
    return starts, counts, steps


@lowering("slice")
def _slice(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``b["input"][b["index"]]`` (a basic index); ``traced`` is the traced result."""
    x = b.get("input")
    if not isinstance(x, NodeRef):
        raise UnsupportedGraph(f"indexing a {type(x).__name__} is not covered", op="getitem")
    dtype = lw.node(x).dtype
    shape = lw.shape(x)
    starts, counts, steps = _selection(lw, b["index"], shape)
    if not isinstance(traced, torch.Tensor) or math.prod(traced.shape) != math.prod(counts):
        raise UnsupportedGraph(f"index {b['index']!r} of shape {shape}: the traced result disagrees", op="getitem")
    out = tuple(int(s) for s in traced.shape)
    if 0 in counts:
        raise UnsupportedGraph(f"a slice of {shape} that selects no element is not covered", op="getitem")
    if counts == list(shape):  # any dtype: ``idx[..., None]`` of int64 indices
        return lw.view(x, out)  # all of it, in order (new or dropped dims of one): the tensor itself
    if dtype not in _SOURCE_DTYPES:
        raise UnsupportedGraph(f"slicing a tensor of dtype {dtype} is not covered (float and bool only)", op="getitem")
    x = lw.in_order(x)  # a slice of a transpose: of its copy in order
    inner = lw.node(x)
    rank = len(shape)
    if inner.op == "slice" and len(inner.attrs) in (2 * rank, 3 * rank):
        source = lw.node(NodeRef(inner.tensor_args()[0])).shape
        if len(source) == rank and counts_of(inner, source) == list(shape):
            # A slice of a slice of the same dims (``x[:, 1:][:, ::2]``): one slice of the first's source.
            first = steps_of(inner, rank)
            starts = [int(a) + s * t for a, s, t in zip(inner.attrs[:rank], starts, first, strict=True)]
            steps = [s * t if c > 1 else 1 for s, t, c in zip(steps, first, counts, strict=True)]
            x = NodeRef(inner.tensor_args()[0])
            shape = source
    whole = [
        start == 0 and count == size and step == 1
        for start, count, size, step in zip(starts, counts, shape, steps, strict=True)
    ]
    attrs = tuple(float(v) for v in starts) + tuple(
        WHOLE if w else float(count) for w, count in zip(whole, counts, strict=True)
    )
    if any(step != 1 for step in steps):
        attrs += tuple(float(step) for step in steps)
    return lw.add(NodeKind.EW, out, op="slice", args=(x.id,), attrs=attrs, dtype=dtype)


def part(lw: LowerContext, x: NodeRef, dim: int, start: int, count: int | None) -> NodeRef:
    """``x`` along ``dim`` from ``start``: ``count`` elements, or the one at ``start`` with the dim
    dropped (``None``), as ``x[:, ..., start:start + count]`` (the parts of ``split``, ``chunk``,
    ``glu``, a cell's gates, the whole windows of ``unfold``)."""
    shape = lw.shape(x)
    at: object = start if count is None else slice(start, start + count)
    out = (*shape[:dim], *(() if count is None else (count,)), *shape[dim + 1 :])
    cut = _slice(lw, "slice", {"input": x, "index": (*(slice(None),) * dim, at)}, torch.empty(out, device="meta"))
    assert isinstance(cut, NodeRef)
    return cut


def _axes(
    shape: tuple[int, ...], starts: list[int], counts: list[int], steps: list[int]
) -> tuple[int, list[tuple[int, int, int]]]:
    """The selection as a constant offset and (count, inner, stride) per axis that varies, inner
    axes last: a dim taken whole joins the axis outside it (``x[:, -1, :]`` of ``(B, T, H)`` reads
    ``b * T * H + (T - 1) * H + h``: one axis of ``H`` and one of ``B``); a dim's step multiplies
    its stride."""
    merged: list[list[int]] = []  # [extent, start, count, step], innermost first
    for size, start, count, step in zip(
        reversed(shape), reversed(starts), reversed(counts), reversed(steps), strict=True
    ):
        if merged and merged[-1][1] == 0 and merged[-1][2] == merged[-1][0] and merged[-1][3] == 1 and step == 1:
            inner_extent = merged[-1][0]
            merged[-1] = [size * inner_extent, start * inner_extent, count * inner_extent, 1]
        else:
            merged.append([size, start, count, step])
    offset, stride, inner = 0, 1, 1
    axes: list[tuple[int, int, int]] = []
    for extent, start, count, step in merged:
        offset += start * stride
        if isinstance(count, Sym) or count > 1:  # a size of the copies for other sizes: may be more than one
            axes.append((count, inner, stride * step))
            inner *= count
        stride *= extent
    return offset, list(reversed(axes))


@gather_emitter("slice", sources=0)
def _emit_slice(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each element's coordinates in the selection, shifted by its starts, address the source."""
    base = w.gather_source(node, "slices")
    src = w.plan.nodes[node.tensor_args()[0]]
    rank = len(src.shape)
    starts = [int(a) for a in node.attrs[:rank]]
    counts = counts_of(node, src.shape)
    offset, axes = _axes(src.shape, starts, counts, steps_of(node, rank))
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    terms = [] if axes else [f"({at})"]  # one element: the index is 0 wherever the mask holds
    terms += [str(offset)] if offset else []
    for i, (count, inner, stride) in enumerate(axes):
        coord = axis_coord(at, inner, count, outermost=i == 0)
        terms.append(coord if stride == 1 else f"{coord} * {stride}")
    where = f"s{node.id}"
    w.emit(scope, f"{where} = {' + '.join(terms)}")
    other = "0" if src.dtype in ("bool", "int64") else "0.0"
    widen = "" if src.dtype == "int64" else ".to(tl.float32)"  # indices stay integers
    var = f"v{node.id}"
    w.emit(scope, f"{var} = tl.load({w.pointer(base)} + {where}, mask={sp.mask}, other={other}){widen}")
    return var
