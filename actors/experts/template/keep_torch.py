"""Leaving a reference op the templates do not cover to PyTorch (run policy ``--torch-ops reference``).

An FX node the lowerer cannot map becomes a ``TORCH`` plan node: the same call the reference
makes (its own submodule ``self.attn(...)``, the same ``torch``/``F`` function, the same tensor
method or operator), written as a Python expression over the plan's tensors. ``render`` puts it
between the kernels as ``_bN = (<expr>).contiguous()``; the gate admits it because the reference
calls it. Only calls that read at least one tensor are kept (a constructor would build on the
wrong device); device arguments and values the expression cannot spell decline.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import attr_path
from actors.experts.template.ir import NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext

_BINARY = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/", operator.floordiv: "//",
    operator.matmul: "@", operator.pow: "**", operator.mod: "%", operator.eq: "==", operator.ne: "!=",
    operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=", operator.and_: "&",
    operator.or_: "|", operator.xor: "^",
}  # fmt: skip
_UNARY = {operator.neg: "-", operator.invert: "~", operator.pos: "+"}
_NAMESPACES = (
    ("torch.nn.functional", torch.nn.functional),
    ("torch", torch),
    ("torch.special", torch.special),
    ("torch.linalg", torch.linalg),
    ("torch.fft", torch.fft),
)


LAYOUT_METHODS = frozenset(
    {
        "view", "reshape", "permute", "transpose", "t", "contiguous", "flatten", "unflatten", "squeeze",
        "unsqueeze", "split", "chunk", "unbind", "narrow", "movedim", "swapaxes", "expand", "expand_as", "view_as",
        "unfold",
    }
)  # fmt: skip
"""Tensor methods that only move or re-address data (the evaluator admits them under ``forbid``)."""
_LAYOUT_FUNCTIONS = {getattr(torch, name): name for name in LAYOUT_METHODS if callable(getattr(torch, name, None))}


def _plain_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, int | slice) for i in items)


def is_layout(fxn: fx.Node) -> bool:
    """Whether an FX node only moves or re-addresses data (kept as a method call under any policy)."""
    if fxn.op == "call_method":
        return str(fxn.target) in LAYOUT_METHODS
    if fxn.op != "call_function":
        return False
    if fxn.target is operator.getitem:
        return len(fxn.args) == 2 and _plain_index(fxn.args[1])
    try:
        return fxn.target in _LAYOUT_FUNCTIONS
    except TypeError:  # an unhashable target
        return False


def _function_name(target: Any, source: str) -> str:
    """A qualified name for a torch function, spelled the way the reference spells it."""
    name = getattr(target, "__name__", None)
    if not isinstance(name, str):
        raise UnsupportedGraph(f"function {target!r} cannot be named", op=str(target))
    found = [qual for qual, mod in _NAMESPACES if getattr(mod, name, None) is target]
    if not found:
        raise UnsupportedGraph(f"function {name} is not a torch function", op=name)
    for qual in found:  # prefer the namespace the reference writes (``torch.relu`` vs ``F.relu``)
        short = {"torch.nn.functional": "F"}.get(qual, qual)
        if f"{short}.{name}(" in source or f"{qual}.{name}(" in source:
            return f"{qual}.{name}"
    return f"{found[0]}.{name}"


def _literal(value: Any) -> str:
    if value is None or isinstance(value, bool | int | str):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, slice):
        return f"slice({_literal(value.start)}, {_literal(value.stop)}, {_literal(value.step)})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tuple | list | torch.Size):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple | torch.Size) else f"[{inner}]"
    raise UnsupportedGraph(f"a {type(value).__name__} argument cannot be passed to a PyTorch op here")


class _Spelling:
    """Turns lowered arguments into expression text with ``{i}`` slots for tensors."""

    def __init__(self, lw: LowerContext) -> None:
        self.lw = lw
        self.tensors: list[int] = []

    def slot(self, ref: NodeRef) -> str:
        if ref.id not in self.tensors:
            self.tensors.append(ref.id)
        return "{" + str(self.tensors.index(ref.id)) + "}"

    def arg(self, value: Any) -> str:
        if isinstance(value, fx.Node):
            value = self.lw.arg(value)  # an uncovered operand declines with its own reason
        if isinstance(value, NodeRef):
            return self.slot(value)
        if isinstance(value, TupleRef):
            if not all(isinstance(r, NodeRef) for r in value.items):
                raise UnsupportedGraph("a tuple with an item the templates do not compute cannot be passed on")
            return "(" + "".join(self.slot(r) + ", " for r in value.items if isinstance(r, NodeRef)) + ")"
        if isinstance(value, tuple | list) and any(isinstance(v, fx.Node) for v in value):
            inner = ", ".join(self.arg(v) for v in value)
            return f"({inner},)" if isinstance(value, tuple) else f"[{inner}]"
        return _literal(value)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)


def _expression(lw: LowerContext, fxn: fx.Node, source: str) -> tuple[str, list[int]]:
    sp = _Spelling(lw)
    target = fxn.target
    if fxn.op == "call_module":
        text = f"{attr_path(str(target))}({sp.call(tuple(fxn.args), dict(fxn.kwargs))})"
    elif fxn.op == "call_method" and target == "unfold":
        text = _unfold(lw, sp, fxn)
    elif fxn.op == "call_method":
        receiver, *rest = fxn.args
        text = f"{sp.arg(receiver)}.{target}({sp.call(tuple(rest), dict(fxn.kwargs))})"
    elif fxn.op == "call_function" and is_layout(fxn) and target in _LAYOUT_FUNCTIONS:
        receiver, *rest = fxn.args
        name = _LAYOUT_FUNCTIONS[target]
        text = f"{sp.arg(receiver)}.{name}({sp.call(tuple(rest), dict(fxn.kwargs))})"  # the method spelling
    elif target is operator.getitem:
        text = f"{sp.arg(fxn.args[0])}[{sp.arg(fxn.args[1])}]"
    elif target in _BINARY and len(fxn.args) == 2:
        text = f"({sp.arg(fxn.args[0])} {_BINARY[target]} {sp.arg(fxn.args[1])})"
    elif target in _UNARY and len(fxn.args) == 1:
        text = f"({_UNARY[target]}{sp.arg(fxn.args[0])})"
    else:
        text = f"{_function_name(target, source)}({sp.call(tuple(fxn.args), dict(fxn.kwargs))})"
    if not sp.tensors:
        raise UnsupportedGraph(f"{fxn.name} reads no tensor of the forward: not kept in PyTorch", op=fxn.name)
    return text, sp.tensors


def _unfold(lw: LowerContext, sp: _Spelling, fxn: fx.Node) -> str:
    """``x.unfold(dim, size, step)`` (sliding windows: a view) spelled as the ``as_strided`` view it
    is, over a contiguous copy of ``x``: the candidate's source gate counts the method ``unfold`` as
    compute (``F.unfold`` is), while ``as_strided`` is plainly a view."""
    bound = dict(zip(("dimension", "size", "step"), fxn.args[1:], strict=False)) | dict(fxn.kwargs)
    src = lw.arg(fxn.args[0])
    values = [bound.get(k) for k in ("dimension", "size", "step")]
    if not isinstance(src, NodeRef) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UnsupportedGraph(f"{fxn.name}: unfold of other than a tensor with int dimension, size and step")
    dim, size, step = (int(v) for v in values if isinstance(v, int))
    shape = lw.shape(src)
    if not -len(shape) <= dim < len(shape) or step < 1 or not 1 <= size <= shape[dim]:
        raise UnsupportedGraph(f"{fxn.name}: unfold({dim}, {size}, {step}) of shape {shape} is not covered")
    dim %= len(shape)
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    out_shape = [*shape[:dim], (shape[dim] - size) // step + 1, *shape[dim + 1 :], size]
    out_strides = [*strides[:dim], strides[dim] * step, *strides[dim + 1 :], strides[dim]]
    return f"{sp.arg(src)}.contiguous().as_strided({tuple(out_shape)!r}, {tuple(out_strides)!r})"


def _dtype(value: torch.Tensor) -> str:
    name = str(value.dtype).removeprefix("torch.")
    if name not in ("float32", "bool", "int64"):
        raise UnsupportedGraph(f"a kept PyTorch op returning {name} is not covered")
    return name


def keep(lw: LowerContext, fxn: fx.Node, traced: Any, source: str) -> object:
    """The ``TORCH`` node(s) for ``fxn``: one per tensor it returns (a tuple becomes a ``TupleRef``)."""
    text, tensors = _expression(lw, fxn, source)
    lw.ops.append(f"torch:{fxn.target if isinstance(fxn.target, str) else getattr(fxn.target, '__name__', '?')}")
    if isinstance(traced, torch.Tensor):
        return lw.add(NodeKind.TORCH, tuple(traced.shape), dtype=_dtype(traced), args=tuple(tensors), path=text)
    if isinstance(traced, tuple | list) and traced and all(isinstance(t, torch.Tensor) for t in traced):
        items = tuple(
            lw.add(NodeKind.TORCH, tuple(t.shape), dtype=_dtype(t), args=tuple(tensors), path=f"({text})[{i}]")
            for i, t in enumerate(traced)
        )
        return TupleRef(items)
    raise UnsupportedGraph(f"{fxn.name} returns a {type(traced).__name__}: not kept in PyTorch", op=fxn.name)
