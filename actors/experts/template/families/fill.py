"""A tensor of one value shaped like another: ``torch.zeros_like``, ``torch.ones_like``,
``torch.full_like`` (SwinV2's ``torch.cat((q_bias, torch.zeros_like(v_bias), v_bias))``), or built
from sizes: ``torch.ones``, ``torch.zeros`` and ``torch.full``, and a tensor's ``new_zeros``,
``new_ones`` and ``new_full`` (sizes as numbers, any ``device``; shape and dtype read from the
traced value; float32 or bool: Mamba2's ``torch.ones(T, T, dtype=bool)`` mask, a loss's
``pos_weight=torch.full((C,), 2.0, device=x.device)``).

``torch.arange`` in forward (a GPT's position ids: ``self.pos(torch.arange(t, device=...))``;
int64 or float32, bounds that are numbers or sizes) becomes one ``arange`` node: each element's
``start + i * step`` is computed where it is read, as a fill's value is. ``torch.linspace(start,
end, steps)`` (float32; samples along a ray, a detection grid) is one ``linspace`` node computed
as PyTorch does: the float32 step ``(end - start) / (steps - 1)``, ``start + step * i`` in the
first half and ``end - step * (steps - 1 - i)`` in the second.

Each becomes one ``fill`` node of the source's shape and dtype with the value as its attribute and
no argument: a kernel writes the value (it reads nothing), or the ops after it take the value where
they are fused. Declined, with the reason: another ``dtype`` than the source's, sources that are
not float, a fill value that is not a number (or is NaN), and constructors of other dtypes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import lit
from actors.experts.template.ir import EW_OPS, HALF, Node, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

EW_OPS["fill"] = (0, 1)  # no argument; the value
_LIKE = (("dtype", None), ("layout", None), ("device", None), ("requires_grad", False), ("memory_format", None))
spell(Spec("zeros_like", (("input", REQUIRED), *_LIKE)), functions=(torch.zeros_like,))
spell(Spec("ones_like", (("input", REQUIRED), *_LIKE)), functions=(torch.ones_like,))
spell(Spec("full_like", (("input", REQUIRED), ("fill_value", REQUIRED), *_LIKE)), functions=(torch.full_like,))

# The sizes, dtype and device of a constructor are read from its traced value (its meta tensor).
spell(Spec("ones", (), passthrough=True), functions=(torch.ones,))
spell(Spec("zeros", (), passthrough=True), functions=(torch.zeros,))
spell(Spec("new_ones", (("input", REQUIRED),), passthrough=True), methods=("new_ones",))
spell(Spec("new_zeros", (("input", REQUIRED),), passthrough=True), methods=("new_zeros",))
_FULL = (("fill_value", REQUIRED), ("out", None), *_LIKE[:4], ("pin_memory", False))
spell(Spec("full", (("size", REQUIRED), *_FULL)), functions=(torch.full,))
spell(Spec("new_full", (("input", REQUIRED), ("size", REQUIRED), *_FULL)), methods=("new_full",))

_VALUES = {"zeros_like": 0.0, "ones_like": 1.0, "ones": 1.0, "zeros": 0.0, "new_ones": 1.0, "new_zeros": 0.0}
_CONSTANT_DTYPES = {torch.float32: "float32", torch.bool: "bool"}


@lowering("ones", "zeros", "new_ones", "new_zeros", "full", "new_full")
def _constant(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    if not isinstance(traced, torch.Tensor) or traced.dtype not in _CONSTANT_DTYPES:
        what = traced.dtype if isinstance(traced, torch.Tensor) else type(traced).__name__
        raise UnsupportedGraph(f"torch.{canon} of {what} is not covered (float32 or bool)", op=canon)
    dtype = _CONSTANT_DTYPES[traced.dtype]
    value = _VALUES.get(canon, lw.arg(b.get("fill_value")))
    if canon in ("full", "new_full") and b.get("out") is not None:
        raise UnsupportedGraph(f"torch.{canon} with out= is not covered", op=canon)
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        raise UnsupportedGraph(f"torch.{canon} with value {value!r} is not covered (a number, not NaN)", op=canon)
    if dtype == "bool" and not isinstance(value, bool) and value not in (0, 1):
        raise UnsupportedGraph(f"torch.{canon} of bool with value {value!r} is not covered", op=canon)
    return lw.add(NodeKind.EW, tuple(traced.shape), op="fill", args=(), attrs=(float(value),), dtype=dtype)


@lowering("zeros_like", "ones_like", "full_like")
def _fill(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), f"the input of torch.{canon}")
    dtype = lw.node(x).dtype
    if not isinstance(traced, torch.Tensor) or str(traced.dtype).removeprefix("torch.") != dtype:
        raise UnsupportedGraph(f"torch.{canon} to another dtype than its input's ({dtype}) is not covered", op=canon)
    value = _VALUES.get(canon, lw.arg(b.get("fill_value")))
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise UnsupportedGraph(f"torch.{canon} with value {value!r} is not covered (a number, not NaN)", op=canon)
    if dtype not in ("float32", *HALF):
        raise UnsupportedGraph(f"torch.{canon} of a tensor of dtype {dtype} is not covered", op=canon)
    return lw.add(NodeKind.EW, lw.shape(x), op="fill", args=(), attrs=(float(value),), dtype=dtype)


EW_OPS["arange"] = (0, 2)  # no argument; start and step
spell(
    Spec(
        "arange",
        (("start", REQUIRED), ("end", None), ("step", 1), ("out", None), *_LIKE[:4], ("pin_memory", False)),
    ),
    functions=(torch.arange,),
)
_ARANGE_DTYPES = {torch.float32: "float32", torch.int64: "int64"}


@lowering("arange")
def _arange(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``torch.arange([start,] end[, step])`` in forward (a GPT's position ids): one ``arange``
    node, each element ``start + i * step`` computed where it is read."""
    values = [lw.arg(b[k]) for k in ("start", "end", "step")]
    start, end, step = (0, values[0], values[2]) if values[1] is None else values
    if b.get("out") is not None or not isinstance(traced, torch.Tensor) or traced.dtype not in _ARANGE_DTYPES:
        what = traced.dtype if isinstance(traced, torch.Tensor) else type(traced).__name__
        raise UnsupportedGraph(f"torch.arange of {what} is not covered (int64 or float32)", op=canon)
    for value in (start, end, step):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UnsupportedGraph(f"torch.arange with bound {value!r} is not covered (numbers only)", op=canon)
    dtype = _ARANGE_DTYPES[traced.dtype]
    if dtype == "int64" and not all(isinstance(v, int) for v in (start, step)):
        raise UnsupportedGraph("torch.arange of int64 with a fractional start or step is not covered", op=canon)
    attrs = (float(start), float(step))
    return lw.add(NodeKind.EW, tuple(traced.shape), op="arange", args=(), attrs=attrs, dtype=dtype)


EW_OPS["linspace"] = (0, 3)  # no argument; start, end and the count
spell(
    Spec("linspace", (("start", REQUIRED), ("end", REQUIRED), ("steps", REQUIRED), ("out", None), *_LIKE[:4])),
    functions=(torch.linspace,),
)


@lowering("linspace")
def _linspace(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    values = [lw.arg(b[k]) for k in ("start", "end", "steps")]
    if b.get("out") is not None or not isinstance(traced, torch.Tensor) or traced.dtype != torch.float32:
        what = traced.dtype if isinstance(traced, torch.Tensor) else type(traced).__name__
        raise UnsupportedGraph(f"torch.linspace of {what} is not covered (float32)", op=canon)
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values) or not isinstance(values[2], int):
        raise UnsupportedGraph(f"torch.linspace with arguments {values!r} is not covered (numbers)", op=canon)
    attrs = (float(values[0]), float(values[1]), float(values[2]))
    return lw.add(NodeKind.EW, tuple(traced.shape), op="linspace", args=(), attrs=attrs, dtype="float32")


@gather_emitter("linspace", sources=0)
def _emit_linspace(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """PyTorch's two halves: from ``start`` up to the middle, from ``end`` down after it."""
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    start, end, steps = float(node.attrs[0]), float(node.attrs[1]), int(node.attrs[2])
    var = f"v{node.id}"
    if steps == 1:
        w.emit(scope, f"{var} = tl.where({sp.mask}, {lit(start)}, {lit(start)})")
        return var
    first, last = torch.tensor(start, dtype=torch.float32), torch.tensor(end, dtype=torch.float32)
    step = float((last - first) / (steps - 1))  # in float32, as PyTorch computes it (not folded in double)
    i = f"i{node.id}"
    w.emit(scope, f"{i} = ({at}).to(tl.float32)")
    up = f"{lit(float(first))} + {lit(step)} * {i}"
    down = f"{lit(float(last))} - {lit(step)} * ({lit(float(steps - 1))} - {i})"
    w.emit(scope, f"{var} = tl.where({i} < {lit(float(steps // 2))}, {up}, {down})")
    return var


@gather_emitter("arange", sources=0)
def _emit_arange(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """``start + i * step`` at each element ``i`` of the tile (int64 where the node is)."""
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    start, step = node.attrs
    var = f"v{node.id}"
    if node.dtype == "int64":
        w.emit(scope, f"{var} = ({at}).to(tl.int64) * {int(step)} + {int(start)}")
    else:
        w.emit(scope, f"{var} = ({at}).to(tl.float32) * {lit(step)} + {lit(start)}")
    return var


@gather_emitter("fill", sources=0)
def _emit_fill(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """The value at every element of the tile (a tile-shaped value from the tile's mask)."""
    var = f"v{node.id}"
    w.emit(scope, f"{var} = tl.where({w.space(row).mask}, {lit(node.attrs[0])}, {lit(node.attrs[0])})")
    return var
