"""Resampling: ``F.interpolate`` / ``nn.Upsample`` (and ``nn.UpsamplingNearest2d`` /
``nn.UpsamplingBilinear2d``) in modes ``nearest``, ``nearest-exact``, ``linear``, ``bilinear`` and
``trilinear``: a U-Net's or a feature pyramid's upsampling, a decoder's resize.

One ``upsample`` gather node reads its stored source at computed addresses. Per spatial dim (the
last one, two or three of a (N, C, *spatial) tensor) it takes PyTorch's own scale: ``1 /
scale_factor`` where the call gave a factor (and did not ask to recompute it), else ``in / out``;
for the linear modes with ``align_corners=True``, ``(in - 1) / (out - 1)``. Each output coordinate
``o`` reads, in float32 as PyTorch's kernels compute it:

- ``nearest``: ``min(floor(o * scale), in - 1)``; ``nearest-exact``: ``min(floor((o + 0.5) *
  scale), in - 1)``;
- the linear modes: ``s = scale * (o + 0.5) - 0.5`` clamped at 0 (``scale * o`` with aligned
  corners), the elements at ``floor(s)`` and the next one (the last one again at the edge),
  weighted ``1 - l`` and ``l`` with ``l = s - floor(s)``: 2, 4 or 8 loads per element.

``attrs`` hold the mode's code, then per spatial dim its scale (float32). The elementwise ops
after it fuse into its kernel.

Declined, with the reason: ``bicubic`` and ``area`` modes, ``antialias=True``, sources other than
float of 3 to 5 dims, a mode whose dims do not match the input's (``bilinear`` of a 5-dim tensor).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import lit
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

EW_OPS["upsample"] = (1, 0)  # the source; its attrs (the mode, one scale per spatial dim) are not a fixed count

_PARAMS = (
    ("input", REQUIRED),
    ("size", None),
    ("scale_factor", None),
    ("mode", "nearest"),
    ("align_corners", None),
    ("recompute_scale_factor", None),
    ("antialias", False),
)
spell(Spec("interpolate", _PARAMS), functions=(F.interpolate,))
_UPSAMPLE_ATTRS = tuple((n, n) for n in ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor"))
MODULES[nn.Upsample] = Spec("interpolate", (("input", REQUIRED),), module_attrs=_UPSAMPLE_ATTRS)
MODULES[nn.UpsamplingNearest2d] = MODULES[nn.Upsample]  # mode "nearest", as the module sets it
MODULES[nn.UpsamplingBilinear2d] = MODULES[nn.Upsample]  # mode "bilinear", align_corners=True

MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")
_LINEAR_DIMS = {"linear": 1, "bilinear": 2, "trilinear": 3}
_SOURCE_DTYPES = ("float32", *HALF)


def _f32(value: float) -> float:
    """``value`` rounded to float32, as PyTorch's kernels hold a scale."""
    return float(np.float32(value))


def _scales(lw: LowerContext, b: dict[str, Any], src: tuple[int, ...], out: tuple[int, ...], mode: str) -> list[float]:
    """Per spatial dim, the scale PyTorch's kernel maps output coordinates with."""
    k = len(src)
    factor = lw.arg(b.get("scale_factor"))
    recompute = bool(lw.arg(b.get("recompute_scale_factor")))
    aligned = bool(lw.arg(b.get("align_corners"))) and mode in _LINEAR_DIMS
    factors: list[float | None] = [None] * k
    if factor is not None and not recompute:
        given = list(factor) if isinstance(factor, tuple | list) else [factor] * k
        if len(given) != k or not all(isinstance(f, int | float) and not isinstance(f, bool) and f > 0 for f in given):
            raise UnsupportedGraph(f"interpolate with scale_factor={factor!r} is not covered", op="interpolate")
        factors = [float(f) for f in given]
    scales = []
    for i, o, f in zip(src, out, factors, strict=True):
        if aligned:
            scales.append(_f32((i - 1) / (o - 1)) if o > 1 else 0.0)
        elif f is not None:
            scales.append(_f32(1.0 / f))
        else:
            scales.append(float(np.float32(i) / np.float32(o)))
    return scales


@lowering("interpolate")
def _interpolate(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``F.interpolate(b["input"], ...)``; ``traced`` is the traced result (its shape)."""
    mode = lw.arg(b.get("mode", "nearest"))
    if mode not in MODES:
        raise UnsupportedGraph(f"interpolate mode {mode!r} is not covered ({', '.join(MODES)})", op="interpolate")
    if lw.arg(b.get("antialias")):
        raise UnsupportedGraph("interpolate with antialias=True is not covered", op="interpolate")
    x = lw.in_order(lw.tensor(b.get("input"), "the input of interpolate"))
    shape = lw.shape(x)
    dtype = lw.node(x).dtype
    if dtype not in _SOURCE_DTYPES or not 3 <= len(shape) <= 5:
        raise UnsupportedGraph(f"interpolate of a {len(shape)}-dim {dtype} tensor is not covered", op="interpolate")
    k = len(shape) - 2
    if mode in _LINEAR_DIMS and _LINEAR_DIMS[mode] != k:
        raise UnsupportedGraph(f"interpolate mode {mode!r} of a {len(shape)}-dim tensor is not valid", op="interpolate")
    if not isinstance(traced, torch.Tensor) or tuple(traced.shape[:2]) != shape[:2] or traced.dim() != len(shape):
        raise UnsupportedGraph(f"interpolate of {shape}: the traced result disagrees", op="interpolate")
    out = tuple(int(s) for s in traced.shape)
    scales = _scales(lw, b, shape[2:], out[2:], mode)
    aligned = 1.0 if mode in _LINEAR_DIMS and bool(lw.arg(b.get("align_corners"))) else 0.0
    attrs = (float(MODES.index(mode)), aligned, *scales)
    return lw.add(NodeKind.EW, out, op="upsample", args=(x.id,), attrs=attrs, dtype=dtype)


@gather_emitter("upsample", sources=0)
def _emit_upsample(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each output coordinate mapped to its source element(s) per spatial dim (see the module doc)."""
    base = w.gather_source(node, "resampled reads")
    src = w.plan.nodes[node.tensor_args()[0]].shape
    mode = MODES[int(node.attrs[0])]
    aligned = bool(node.attrs[1])
    scales = [float(a) for a in node.attrs[2:]]
    k = len(scales)
    out = node.shape
    sp = w.space(row)
    at = sp.index(out, (0, len(out)))
    n = node.id
    # Per spatial dim, innermost last: its output coordinate, and the source's stride along it.
    strides = [1] * k
    for d in range(k - 2, -1, -1):
        strides[d] = strides[d + 1] * src[3 + d]
    inner = 1
    coords: list[str] = [""] * k
    for d in range(k - 1, -1, -1):
        var = f"o{n}_{d}"
        w.emit(scope, f"{var} = (({at}) // {inner}) % {out[2 + d]}" if inner != 1 else f"{var} = ({at}) % {out[2 + d]}")
        coords[d] = var
        inner *= out[2 + d]
    outer = f"b{n}"
    spatial = math.prod(src[2:])
    w.emit(scope, f"{outer} = (({at}) // {inner}) * {spatial}")
    ptr = w.pointer(base)
    var = f"v{n}"
    if mode in ("nearest", "nearest-exact"):
        terms = [outer]
        for d in range(k):
            idx = f"i{n}_{d}"
            shift = " + 0.5" if mode == "nearest-exact" else ""
            pos = f"({coords[d]}.to(tl.float32){shift}) * {lit(scales[d])}"
            w.emit(scope, f"{idx} = tl.minimum(tl.floor({pos}).to(tl.int32), {src[2 + d] - 1})")
            terms.append(idx if strides[d] == 1 else f"{idx} * {strides[d]}")
        w.emit(scope, f"{var} = tl.load({ptr} + {' + '.join(terms)}, mask={sp.mask}, other=0.0).to(tl.float32)")
        return var
    lows: list[tuple[str, str, str, str]] = []  # per dim: first index, next index, weight of first, of next
    for d in range(k):
        s, i0, i1, l1 = f"s{n}_{d}", f"i{n}_{d}", f"j{n}_{d}", f"l{n}_{d}"
        if aligned:
            w.emit(scope, f"{s} = {lit(scales[d])} * {coords[d]}.to(tl.float32)")
        else:
            w.emit(scope, f"{s} = tl.maximum({lit(scales[d])} * ({coords[d]}.to(tl.float32) + 0.5) - 0.5, 0.0)")
        w.emit(scope, f"{i0} = tl.minimum(tl.floor({s}).to(tl.int32), {src[2 + d] - 1})")
        w.emit(scope, f"{i1} = tl.minimum({i0} + 1, {src[2 + d] - 1})")
        w.emit(scope, f"{l1} = {s} - {i0}.to(tl.float32)")
        lows.append((i0, i1, f"(1.0 - {l1})", l1))

    # The corners, blended innermost dim first, as PyTorch's kernels nest their sums.
    def blend(d: int, offset: str) -> str:
        i0, i1, w0, w1 = lows[d]
        if d == k - 1:
            a = f"tl.load({ptr} + {offset} + {i0}, mask={sp.mask}, other=0.0).to(tl.float32)"
            b = f"tl.load({ptr} + {offset} + {i1}, mask={sp.mask}, other=0.0).to(tl.float32)"
            return f"({w0} * {a} + {w1} * {b})"
        stride = strides[d]
        first = blend(d + 1, f"{offset} + {i0} * {stride}")
        second = blend(d + 1, f"{offset} + {i1} * {stride}")
        return f"({w0} * {first} + {w1} * {second})"

    w.emit(scope, f"{var} = {blend(0, outer)}")
    return var
