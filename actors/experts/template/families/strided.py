"""Copies that move elements: permutations of dims and the shuffles built of them.

One ``strided`` gather node reads its stored source at computed addresses: ``attrs`` hold, per dim
of the node's shape, the source's dim it runs along (-1 where it repeats the same elements: a
stride of 0), so an element's coordinates address the source as ``sum(c_d * stride_d)`` with the
source's row-major strides. Adjacent dims whose
strides nest (``stride_d == stride_{d+1} * extent_{d+1}``) join into one axis: (B, C, H, W)
permuted to (B, H, W, C) reads B, then H*W, then C. Elementwise ops after it fuse into its kernel,
as after ``pad`` and ``roll``; a node whose strides are its source's own row-major ones is the
source itself (a view, no kernel).

What it covers (issue 35's "channel shuffles as copies fused into their consumers"):

- ``x.permute(dims)`` and ``x.transpose(a, b)`` of other dims than the last two (those stay a
  ``PERM`` node, which a product reads by strides with no copy);
- an operand read in row-major order (a reshape, a convolution, a pooling, a scan, a recurrent
  layer, or a read at computed addresses: ``cat``, ``pad``, ``roll``, slicing) that is a
  transpose: it is copied in order first (:func:`in_order`), where these declined before;
- ``F.pixel_shuffle`` / ``nn.PixelShuffle``, ``F.pixel_unshuffle`` / ``nn.PixelUnshuffle``,
  ``F.channel_shuffle`` / ``nn.ChannelShuffle``: a view, a permutation, a view;
- ``x.repeat_interleave(r, dim)`` / ``torch.repeat_interleave`` with an int ``r`` and a ``dim``
  (grouped-query attention's key and value heads): a dim of stride 0 beside ``dim``, then a view;
- ``x.unfold(dim, size, step)`` with ``step == size`` (windows side by side: a ViT's patches,
  ``img.unfold(2, p, p).unfold(3, p, p)``): a view of ``dim`` as (windows, size), the window's
  dim moved last (the elements past the last whole window left out first, as PyTorch does).

Declined, with the reason: sources of other dtypes than float, a shuffle whose channels do not
divide, ``repeat_interleave`` with a tensor of repeats or no ``dim`` (a flattened result),
``unfold`` windows that overlap or leave gaps (``step != size``: no permutation of the source).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from actors.experts.template.emit import Scope, Writer, axis_coord, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.slicing import part
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

EW_OPS["strided"] = (1, 0)  # the source; its attrs (one source dim per dim of the node) are not a fixed count

spell(Spec("pixel_shuffle", (("input", REQUIRED), ("upscale_factor", REQUIRED))), functions=(F.pixel_shuffle,))
spell(Spec("pixel_unshuffle", (("input", REQUIRED), ("downscale_factor", REQUIRED))), functions=(F.pixel_unshuffle,))
spell(Spec("channel_shuffle", (("input", REQUIRED), ("groups", REQUIRED))), functions=(F.channel_shuffle,))
spell(
    Spec("unfold", (("input", REQUIRED), ("dimension", REQUIRED), ("size", REQUIRED), ("step", REQUIRED))),
    methods=("unfold",),
)
MODULES[nn.PixelShuffle] = Spec(
    "pixel_shuffle", (("input", REQUIRED),), module_attrs=(("upscale_factor", "upscale_factor"),)
)
MODULES[nn.PixelUnshuffle] = Spec(
    "pixel_unshuffle", (("input", REQUIRED),), module_attrs=(("downscale_factor", "downscale_factor"),)
)
MODULES[nn.ChannelShuffle] = Spec("channel_shuffle", (("input", REQUIRED),), module_attrs=(("groups", "groups"),))
spell(
    Spec("repeat_interleave", (("input", REQUIRED), ("repeats", REQUIRED), ("dim", None), ("output_size", None))),
    functions=(torch.repeat_interleave,),
    methods=("repeat_interleave",),
)

_SOURCE_DTYPES = ("float32", *HALF, "int64")


def _row_major(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def addressed(lw: LowerContext, x: NodeRef) -> tuple[NodeRef, list[int]]:
    """``x`` as a node that is not a transpose and, per dim of ``x``, the dim of that node it runs
    along: a transpose (a ``PERM`` node, of a ``PERM`` too) swaps its source's last two."""
    node = lw.node(x)
    if node.kind is not NodeKind.PERM:
        return x, list(range(len(lw.shape(x))))
    src, dims = addressed(lw, NodeRef(node.tensor_args()[0]))
    return src, [*dims[:-2], dims[-1], dims[-2]]


def strided(lw: LowerContext, src: NodeRef, shape: tuple[int, ...], dims: list[int]) -> NodeRef:
    """The elements of ``src`` (not a transpose) in a tensor of ``shape`` whose dim ``i`` runs along
    ``src``'s dim ``dims[i]`` (-1: a dim that repeats the same elements). ``attrs`` hold ``dims``,
    not strides, so that the node is the same at every size (``any_sizes``)."""
    dtype = lw.node(src).dtype
    if dtype not in _SOURCE_DTYPES:
        raise UnsupportedGraph(f"a copy of a tensor of dtype {dtype} is not covered (float only)")
    moving = [d for n, d in zip(shape, dims, strict=True) if n != 1]
    if math.prod(shape) == lw.node(src).numel and -1 not in moving and moving == sorted(moving):
        return lw.view(src, shape)  # the source's own order: no copy
    attrs = tuple(float(d) for d in dims)
    return lw.add(NodeKind.EW, tuple(shape), op="strided", args=(src.id,), attrs=attrs, dtype=dtype)


def permuted(lw: LowerContext, x: NodeRef, order: list[int]) -> NodeRef:
    """``x.permute(order)`` as a copy in the permuted order."""
    shape = lw.shape(x)
    src, dims = addressed(lw, x)
    return strided(lw, src, tuple(shape[d] for d in order), [dims[d] for d in order])


def in_order(lw: LowerContext, x: NodeRef) -> NodeRef:
    """``x`` itself, or, where it is a transpose, a copy of it in row-major order."""
    if lw.node(x).kind is not NodeKind.PERM:
        return x
    return permuted(lw, x, list(range(len(lw.shape(x)))))


@lowering("in_order")
def _in_order(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """The lowerer's own call (:meth:`LowerContext.in_order`), not a spelled op."""
    return in_order(lw, b["input"])


@lowering("permute_dims")
def _permute_dims(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """A permutation of ``b["input"]``'s dims ``b["dims"]`` other than a swap of the last two."""
    return permuted(lw, b["input"], list(b["dims"]))


def _int(lw: LowerContext, value: object, what: str, op: str) -> int:
    value = lw.arg(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnsupportedGraph(f"{op} with {what} {value!r} is not covered (a positive int)", op=op)
    return value


def _shuffled(lw: LowerContext, x: NodeRef, split: tuple[int, ...], dims: list[int], out: tuple[int, ...]) -> NodeRef:
    """``x`` viewed as ``split``, permuted by ``dims``, viewed as ``out``."""
    return lw.view(permuted(lw, lw.view(x, split), dims), out)


@lowering("unfold")
def _unfold(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``x.unfold(dim, size, step)`` with ``step == size``: (..., n, ...) -> (..., n // size, ..., size)."""
    x = lw.tensor(b.get("input"), "the input of unfold")
    shape = lw.shape(x)
    dim = lw.arg(b["dimension"])
    if not shape or not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < len(shape):
        raise UnsupportedGraph(f"unfold along dim {dim!r} of a {len(shape)}-dim tensor is not covered", op=canon)
    dim %= len(shape)
    size, step = _int(lw, b["size"], "size", canon), _int(lw, b["step"], "step", canon)
    if step != size:
        raise UnsupportedGraph(
            f"unfold with step {step} and size {size} (windows that overlap or leave gaps) is not covered", op=canon
        )
    count = shape[dim] // size
    if count < 1:
        raise UnsupportedGraph(f"unfold of a dim of {shape[dim]} into windows of {size} is not valid", op=canon)
    if count * size != shape[dim]:  # the elements past the last whole window are not in any
        x = part(lw, x, dim, 0, count * size)
    windows = lw.view(x, (*shape[:dim], count, size, *shape[dim + 1 :]))
    order = [d for d in range(len(shape) + 1) if d != dim + 1] + [dim + 1]
    return permuted(lw, windows, order)


@lowering("pixel_shuffle", "pixel_unshuffle", "channel_shuffle")
def _shuffle(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """(N..., C*r*r, H, W) -> (N..., C, H*r, W*r) and back; (N, C, *) with its channels in ``g``
    groups read group by group."""
    x = lw.tensor(b.get("input"), f"the input of {canon}")
    shape = lw.shape(x)
    if canon == "channel_shuffle":
        g = _int(lw, b["groups"], "groups", canon)
        if len(shape) < 3 or shape[1] % g:
            raise UnsupportedGraph(f"channel_shuffle of {shape} in {g} groups is not covered", op=canon)
        n, c, rest = shape[0], shape[1], shape[2:]
        sp = list(range(3, 3 + len(rest)))
        return _shuffled(lw, x, (n, g, c // g, *rest), [0, 2, 1, *sp], shape)
    if len(shape) < 3:
        raise UnsupportedGraph(f"{canon} of a {len(shape)}-dim tensor is not valid", op=canon)
    *lead, c, h, w = shape
    k = len(lead)
    outer = list(range(k))
    if canon == "pixel_shuffle":
        r = _int(lw, b["upscale_factor"], "upscale_factor", canon)
        if c % (r * r):
            raise UnsupportedGraph(f"pixel_shuffle of {shape} by {r}: channels do not divide", op=canon)
        split = (*lead, c // (r * r), r, r, h, w)
        dims = [*outer, k, k + 3, k + 1, k + 4, k + 2]
        return _shuffled(lw, x, split, dims, (*lead, c // (r * r), h * r, w * r))
    r = _int(lw, b["downscale_factor"], "downscale_factor", canon)
    if h % r or w % r:
        raise UnsupportedGraph(f"pixel_unshuffle of {shape} by {r}: the sizes do not divide", op=canon)
    split = (*lead, c, h // r, r, w // r, r)
    dims = [*outer, k, k + 2, k + 4, k + 1, k + 3]
    return _shuffled(lw, x, split, dims, (*lead, c * r * r, h // r, w // r))


@lowering("repeat_interleave")
def _repeat_interleave(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """Each element ``r`` times along ``dim``: the source read with a stride of 0 beside ``dim``."""
    x = lw.tensor(b.get("input"), "the input of repeat_interleave")
    repeats, dim = lw.arg(b["repeats"]), lw.arg(b.get("dim"))
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise UnsupportedGraph("repeat_interleave with repeats other than a positive int is not covered", op=canon)
    shape = lw.shape(x)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < len(shape):
        raise UnsupportedGraph(f"repeat_interleave with dim={dim!r} is not covered (a dim of the tensor)", op=canon)
    dim %= len(shape)
    out = (*shape[:dim], shape[dim] * repeats, *shape[dim + 1 :])
    if not isinstance(traced, torch.Tensor) or tuple(traced.shape) != out:
        raise UnsupportedGraph(f"repeat_interleave of {shape}: the traced result disagrees", op=canon)
    if repeats == 1:
        return x
    src, dims = addressed(lw, x)
    split = (*shape[: dim + 1], repeats, *shape[dim + 1 :])
    copied = strided(lw, src, split, [*dims[: dim + 1], -1, *dims[dim + 1 :]])
    return lw.view(copied, out)


def _axes(shape: tuple[int, ...], strides: list[int]) -> list[tuple[int, int]]:
    """(extent, stride) per axis, outermost first: a dim joins the one inside it where their
    strides nest; dims of one drop out."""
    merged: list[list[int]] = []  # innermost first
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n == 1:
            continue
        if merged and merged[-1][1] * merged[-1][0] == s and merged[-1][1] != 0:
            merged[-1][0] *= n
        else:
            merged.append([n, s])
    return [(n, s) for n, s in reversed(merged)] or [(1, 0)]


@gather_emitter("strided", sources=0)
def _emit_strided(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each element's coordinate along each axis, times the source's stride there, addresses it."""
    base = w.gather_source(node, "copies")
    strides = _row_major(w.plan.nodes[node.tensor_args()[0]].shape)
    axes = _axes(node.shape, [strides[int(d)] if d >= 0 else 0 for d in node.attrs])
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    terms: list[str] = []
    inner = 1
    for i in reversed(range(len(axes))):  # innermost first
        extent, stride = axes[i]
        coord = axis_coord(at, inner, extent, outermost=i == 0)
        if stride != 0 and extent != 1:
            terms.append(coord if stride == 1 else f"{coord} * {stride}")
        inner *= extent
    where, var = f"s{node.id}", f"v{node.id}"
    w.emit(scope, f"{where} = {' + '.join(reversed(terms)) if terms else f'({at}) * 0'}")
    # indices (an expand before a gather) stay exact int64; everything else is computed in float32
    load = f"tl.load({w.pointer(base)} + {where}, mask={sp.mask}, other=0"
    w.emit(scope, f"{var} = {load})" if node.dtype == "int64" else f"{var} = {load}.0).to(tl.float32)")
    return var
