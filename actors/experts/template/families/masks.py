"""Constant tensors built in ``forward`` and the logic of bool masks: Mamba2's segment sum writes
``x.masked_fill(~torch.tril(torch.ones(T, T, device=x.device, dtype=bool)), -torch.inf)``.

``torch.ones`` and ``torch.zeros`` (sizes as numbers, any ``device``) become one ``fill`` node of
the traced shape and dtype (the elementwise op ``families/fill.py`` brings: no argument, the value
as its attribute), so the ops after it take the value where they are fused; ``tril``/``triu`` of a
bool mask are the core's triangle ops (``composites.py``), still 0 / 1. ``~mask``,
``torch.logical_not`` and ``torch.bitwise_not`` of a bool mask are ``mask == 0`` (a bool mask is
0.0 / 1.0 inside a kernel). Declined, with the reason: constructors of other dtypes than float32
and bool, and ``~`` of a tensor that is not bool (a bitwise not of integers).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

_CONSTANT_DTYPES = {torch.float32: "float32", torch.bool: "bool"}

# The sizes, dtype and device of a constructor are read from its traced value (its meta tensor).
spell(Spec("ones", (), passthrough=True), functions=(torch.ones,))
spell(Spec("zeros", (), passthrough=True), functions=(torch.zeros,))
spell(
    Spec("logical_not", (("input", REQUIRED),)),
    functions=(operator.invert, torch.logical_not, torch.bitwise_not),
    methods=("logical_not", "bitwise_not"),
)


@lowering("ones", "zeros")
def _constant(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    if not isinstance(traced, torch.Tensor) or traced.dtype not in _CONSTANT_DTYPES:
        what = traced.dtype if isinstance(traced, torch.Tensor) else type(traced).__name__
        raise UnsupportedGraph(f"torch.{canon} of {what} is not covered (float32 or bool)", op=canon)
    value = 1.0 if canon == "ones" else 0.0
    shape = tuple(traced.shape)
    return lw.add(NodeKind.EW, shape, op="fill", args=(), attrs=(value,), dtype=_CONSTANT_DTYPES[traced.dtype])


@lowering("logical_not")
def _logical_not(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    mask = b.get("input")
    if not isinstance(mask, NodeRef) or lw.node(mask).dtype != "bool":
        what = lw.node(mask).dtype if isinstance(mask, NodeRef) else type(mask).__name__
        raise UnsupportedGraph(f"a logical or bitwise not of {what} is covered for bool masks only", op=canon)
    return lw.add(NodeKind.EW, lw.shape(mask), op="eq", args=(mask.id, 0.0), dtype="bool")
