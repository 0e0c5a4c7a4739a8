"""``F.unfold`` / ``nn.Unfold`` (im2col): the sliding windows of an image as columns (a patch
embedding written as ``proj(F.unfold(x, p, stride=p).transpose(1, 2))``, involutions, local
attention).

It becomes one ``im2col`` gather node of PyTorch's output shape ``(N, C * kh * kw, L)`` over an
``(N, C, H, W)`` source (a ``(C, H, W)`` one is viewed with a batch of one and back): the element
at ``(n, c * kh * kw + i * kw + j, oh * OW + ow)`` reads the source at row ``oh * sh - ph + i * dh``
and column ``ow * sw - pw + j * dw``, 0 outside the image (the zero padding). The ops after it
(the product that embeds the patches, a transpose) read it as any stored tensor; elementwise ops
fuse into its kernel.

Declined, with the reason: sources of other than three or four dims or of other dtypes than float,
and window arguments that are not ints or pairs of ints.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

EW_OPS["im2col"] = (1, 0)  # the source; attrs: kernel, dilation, padding and stride, (h, w) each
_WINDOW = ("kernel_size", "dilation", "padding", "stride")
spell(
    Spec("im2col", (("input", REQUIRED), ("kernel_size", REQUIRED), ("dilation", 1), ("padding", 0), ("stride", 1))),
    functions=(F.unfold,),
)
MODULES[nn.Unfold] = Spec("im2col", (("input", REQUIRED),), module_attrs=tuple((n, n) for n in _WINDOW))


def _pair(lw: LowerContext, value: object, what: str) -> tuple[int, int]:
    value = lw.arg(value)
    items = [lw.arg(v) for v in value] if isinstance(value, tuple | list) else [value, value]
    ints = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    if len(items) != 2 or len(ints) != 2:
        raise UnsupportedGraph(f"F.unfold with {what}={value!r} is not covered (an int or two)", op="im2col")
    return ints[0], ints[1]


@lowering("im2col")
def _unfold(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of F.unfold")
    dtype = lw.node(x).dtype
    if dtype not in ("float32", *HALF):
        raise UnsupportedGraph(f"F.unfold of a tensor of dtype {dtype} is not covered", op=canon)
    shape = lw.shape(x)
    if len(shape) not in (3, 4):
        raise UnsupportedGraph(f"F.unfold of a {len(shape)}-D input (only (N, C, H, W) or (C, H, W))", op=canon)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_pair(lw, b.get(n), n) for n in _WINDOW)
    src = lw.view(x, (1, *shape)) if len(shape) == 3 else x
    n, c, h, w = lw.shape(src)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = (n, c * kh * kw, oh * ow)
    want = tuple(traced.shape) if hasattr(traced, "shape") else None
    if want != (out if len(shape) == 4 else out[1:]):
        raise UnsupportedGraph(f"F.unfold of {shape} gives {want}, not the {out} its windows make", op=canon)
    attrs = tuple(float(v) for v in (kh, kw, dh, dw, ph, pw, sh, sw))
    cols = lw.add(NodeKind.EW, out, op="im2col", args=(lw.in_order(src).id,), attrs=attrs, dtype=dtype)
    return cols if len(shape) == 4 else lw.view(cols, out[1:])


@gather_emitter("im2col", sources=0)
def _emit_unfold(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """Each column element's window position and offset in it address the source; 0 outside it."""
    base = w.gather_source(node, "windows")
    _, c, h, wd = w.plan.nodes[node.tensor_args()[0]].shape
    kh, kw, dh, dw, ph, pw, sh, sw = (int(a) for a in node.attrs)
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    _, rows, cols = node.shape
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    k = f"k{node.id}"
    lines = [
        f"l{k} = ({at}) % {cols}",
        f"r{k} = (({at}) // {cols}) % {rows}",
        f"n{k} = ({at}) // {rows * cols}",
        f"y{k} = (l{k} // {ow}) * {sh} - {ph} + ((r{k} // {kw}) % {kh}) * {dh}",
        f"x{k} = (l{k} % {ow}) * {sw} - {pw} + (r{k} % {kw}) * {dw}",
        f"s{k} = (n{k} * {c} + r{k} // {kh * kw}) * {h * wd} + y{k} * {wd} + x{k}",
        f"m{k} = ({sp.mask}) & (y{k} >= 0) & (y{k} < {h}) & (x{k} >= 0) & (x{k} < {wd})",
    ]
    for line in lines:
        w.emit(scope, line)
    var = f"v{node.id}"
    w.emit(scope, f"{var} = tl.load({w.pointer(base)} + s{k}, mask=m{k}, other=0.0).to(tl.float32)")
    return var
