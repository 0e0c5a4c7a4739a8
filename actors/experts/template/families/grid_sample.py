"""``F.affine_grid`` and ``F.grid_sample`` of 4-dim tensors: a spatial transformer's sampling (the
localisation net's ``theta``, then the input read at the transformed coordinates).

``affine_grid(theta, (N, C, H, W))`` is one ``affine_grid`` gather node of shape ``(N, H, W, 2)``:
the element ``(n, h, w, k)`` is ``theta[n, k, 0] * x_w + theta[n, k, 1] * y_h + theta[n, k, 2]``,
with ``x_w`` and ``y_h`` the points of ``linspace(-1, 1, size)`` as PyTorch computes them (its
halves from either end), scaled by ``(size - 1) / size`` unless ``align_corners``.

``grid_sample(x, grid)`` is one ``grid_sample`` gather node of shape ``(N, C, Ho, Wo)``: each
element reads its grid point (two loads), maps it to source coordinates as PyTorch does
(``((g + 1) * size - 1) / 2``, or ``(g + 1) / 2 * (size - 1)`` with ``align_corners``; clamped into
the source with ``padding_mode='border'``) and reads the source there: the four neighbours weighted
by their opposite areas (``bilinear``, a neighbour outside the source reading 0 with ``zeros``),
or the nearest one (``nearest``, halves to even as ``nearbyint``). The elementwise ops after it
fuse into its kernel.

Declined, with the reason: 5-dim (volumetric) sampling, ``bicubic`` mode, ``padding_mode=
'reflection'``, grids or thetas of other shapes or dtypes than float32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import lit
from actors.experts.template.ir import EW_OPS, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

EW_OPS["affine_grid"] = (1, 1)  # theta; align_corners
EW_OPS["grid_sample"] = (2, 3)  # the source and the grid; the mode's code, the padding's code, align_corners
spell(
    Spec("affine_grid", (("theta", REQUIRED), ("size", REQUIRED), ("align_corners", None))),
    functions=(F.affine_grid,),
)
spell(
    Spec(
        "grid_sample",
        (
            ("input", REQUIRED),
            ("grid", REQUIRED),
            ("mode", "bilinear"),
            ("padding_mode", "zeros"),
            ("align_corners", None),
        ),
    ),
    functions=(F.grid_sample,),
)
MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border")


def _float32(lw: LowerContext, ref: object, what: str) -> NodeRef:
    t = lw.tensor(ref, what)
    if lw.node(t).dtype != "float32":
        raise UnsupportedGraph(f"{what} of {lw.node(t).dtype} is not covered (float32)")
    return lw.in_order(t)


@lowering("affine_grid")
def _affine_grid(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    theta = _float32(lw, b.get("theta"), "the theta of affine_grid")
    size = lw.arg(b.get("size"))
    shape = lw.shape(theta)
    if not isinstance(size, tuple | list | torch.Size) or len(size) != 4 or len(shape) != 3 or shape[1:] != (2, 3):
        raise UnsupportedGraph(
            f"affine_grid of theta {shape} to size {size!r} is not covered (2-D: theta (N, 2, 3), size of 4)", op=canon
        )
    n, _, h, w = (int(s) for s in size)
    if n != shape[0] or not isinstance(traced, torch.Tensor) or tuple(traced.shape) != (n, h, w, 2):
        raise UnsupportedGraph(f"affine_grid of theta {shape} to size {tuple(size)} is not valid", op=canon)
    aligned = 1.0 if lw.arg(b.get("align_corners")) else 0.0
    return lw.add(NodeKind.EW, (n, h, w, 2), op="affine_grid", args=(theta.id,), attrs=(aligned,), dtype="float32")


def _base(coord: str, size: int, aligned: bool) -> str:
    """``linspace(-1, 1, size)[coord]`` as PyTorch computes it (the first half from -1 up, the rest
    from 1 down), scaled by ``(size - 1) / size`` unless ``aligned``; 0 where ``size`` is 1."""
    if size <= 1:
        return "0.0"
    step = lit(2.0 / (size - 1))
    c = f"{coord}.to(tl.float32)"
    point = f"tl.where({coord} < {size // 2}, -1.0 + {c} * {step}, 1.0 - ({size - 1} - {c}) * {step})"
    return point if aligned else f"({point} * {lit((size - 1) / size)})"


@gather_emitter("affine_grid", sources=0)
def _emit_affine_grid(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    base = w.gather_source(node, "an affine grid's theta")
    _, h, wd, _ = node.shape
    aligned = bool(node.attrs[0])
    sp = w.space(row)
    i = node.id
    at = sp.index(node.shape, (0, 4))
    k, x, y, n = f"ag{i}_k", f"ag{i}_x", f"ag{i}_y", f"ag{i}_n"
    w.emit(scope, f"{k} = ({at}) % 2")
    w.emit(scope, f"{x} = {_base(f'((({at}) // 2) % {wd})', wd, aligned)}")
    w.emit(scope, f"{y} = {_base(f'((({at}) // {2 * wd}) % {h})', h, aligned)}")
    w.emit(scope, f"{n} = (({at}) // {2 * wd * h}) * 6 + {k} * 3")
    ptr = w.pointer(base)
    loads = [f"tl.load({ptr} + {n} + {j}, mask={sp.mask}, other=0.0)" for j in range(3)]
    var = f"v{i}"
    w.emit(scope, f"{var} = {loads[0]} * {x} + {loads[1]} * {y} + {loads[2]}")
    return var


@lowering("grid_sample")
def _grid_sample(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = _float32(lw, b.get("input"), "the input of grid_sample")
    grid = _float32(lw, b.get("grid"), "the grid of grid_sample")
    mode, padding = lw.arg(b.get("mode")), lw.arg(b.get("padding_mode"))
    if mode not in MODES:
        raise UnsupportedGraph(f"grid_sample mode {mode!r} is not covered ({', '.join(MODES)})", op=canon)
    if padding not in PADDINGS:
        raise UnsupportedGraph(f"grid_sample padding_mode {padding!r} is not covered ({', '.join(PADDINGS)})", op=canon)
    xs, gs = lw.shape(x), lw.shape(grid)
    if len(xs) != 4 or len(gs) != 4 or gs[0] != xs[0] or gs[3] != 2:
        raise UnsupportedGraph(
            f"grid_sample of {xs} at a grid of {gs} is not covered (4-dim, the grid (N, H, W, 2))", op=canon
        )
    out = (xs[0], xs[1], gs[1], gs[2])
    if not isinstance(traced, torch.Tensor) or tuple(traced.shape) != out:
        raise UnsupportedGraph(f"grid_sample of {xs} at a grid of {gs} is not valid", op=canon)
    attrs = (float(MODES.index(mode)), float(PADDINGS.index(padding)), 1.0 if lw.arg(b.get("align_corners")) else 0.0)
    return lw.add(NodeKind.EW, out, op="grid_sample", args=(x.id, grid.id), attrs=attrs, dtype="float32")


def _source_coord(g: str, size: int, aligned: bool, border: bool) -> str:
    """A grid value mapped to the source's coordinates along a dim of ``size`` (PyTorch's
    unnormalisation, then the border's clamp)."""
    coord = f"(({g} + 1.0) / 2.0 * {size - 1})" if aligned else f"((({g} + 1.0) * {size} - 1.0) / 2.0)"
    return f"tl.minimum(tl.maximum({coord}, 0.0), {float(size - 1)})" if border else coord


@gather_emitter("grid_sample", sources=0)
def _emit_grid_sample(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    src = w.gather_source(node, "a sampled input")
    grid = w.gather_source(node, "a sampling grid", 1)
    _, c, ho, wo = node.shape
    h, wd = w.plan.nodes[node.tensor_args()[0]].shape[2:]
    mode, border, aligned = MODES[int(node.attrs[0])], bool(node.attrs[1]), bool(node.attrs[2])
    sp = w.space(row)
    i = node.id
    at = sp.index(node.shape, (0, 4))
    point, plane = f"gs{i}_at", f"gs{i}_plane"
    w.emit(scope, f"{point} = ((({at}) // {c * ho * wo}) * {ho * wo} + ({at}) % {ho * wo}) * 2")
    w.emit(scope, f"{plane} = (({at}) // {ho * wo}) * {h * wd}")
    gp = w.pointer(grid)
    ix, iy = f"gs{i}_ix", f"gs{i}_iy"
    gx = f"tl.load({gp} + {point}, mask={sp.mask}, other=0.0)"
    gy = f"tl.load({gp} + {point} + 1, mask={sp.mask}, other=0.0)"
    w.emit(scope, f"{ix} = {_source_coord(gx, wd, aligned, border)}")
    w.emit(scope, f"{iy} = {_source_coord(gy, h, aligned, border)}")
    ptr = w.pointer(src)

    def read(xc: str, yc: str) -> str:
        ok = f"({sp.mask}) & ({xc} >= 0) & ({xc} < {wd}) & ({yc} >= 0) & ({yc} < {h})"
        return f"tl.load({ptr} + {plane} + {yc} * {wd} + {xc}, mask={ok}, other=0.0)"

    var = f"v{i}"
    if mode == "nearest":
        nx, ny = f"gs{i}_nx", f"gs{i}_ny"
        for name, coord in ((nx, ix), (ny, iy)):  # nearbyint: halves to even
            w.emit(scope, f"{name} = tl.floor({coord} + 0.5)")
            w.emit(scope, f"{name} = tl.where(({name} - {coord} == 0.5) & ({name} % 2.0 != 0.0), {name} - 1.0, {name})")
            w.emit(scope, f"{name} = {name}.to(tl.int32)")
        w.emit(scope, f"{var} = {read(nx, ny)}")
        return var
    x0, y0, fx0, fy0 = f"gs{i}_x0", f"gs{i}_y0", f"gs{i}_fx0", f"gs{i}_fy0"
    w.emit(scope, f"{fx0} = tl.floor({ix})")
    w.emit(scope, f"{fy0} = tl.floor({iy})")
    w.emit(scope, f"{x0} = {fx0}.to(tl.int32)")
    w.emit(scope, f"{y0} = {fy0}.to(tl.int32)")
    e, s, wst, nth = f"gs{i}_e", f"gs{i}_s", f"gs{i}_w", f"gs{i}_n"
    w.emit(scope, f"{e} = {ix} - {fx0}")  # toward the east neighbour
    w.emit(scope, f"{s} = {iy} - {fy0}")  # toward the south neighbour
    w.emit(scope, f"{wst} = ({fx0} + 1.0) - {ix}")
    w.emit(scope, f"{nth} = ({fy0} + 1.0) - {iy}")
    w.emit(
        scope,
        f"{var} = {read(x0, y0)} * ({wst} * {nth}) + {read(f'({x0} + 1)', y0)} * ({e} * {nth})"
        f" + {read(x0, f'({y0} + 1)')} * ({wst} * {s}) + {read(f'({x0} + 1)', f'({y0} + 1)')} * ({e} * {s})",
    )
    return var
