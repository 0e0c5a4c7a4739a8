"""The logic of bool masks: Mamba2's segment sum writes
``x.masked_fill(~torch.tril(torch.ones(T, T, device=x.device, dtype=bool)), -torch.inf)``.

``torch.ones`` of a bool dtype is a ``fill`` node (``families/fill.py``); ``tril``/``triu`` of a
bool mask are the core's triangle ops (``composites.py``), still 0 / 1. ``~mask``,
``torch.logical_not`` and ``torch.bitwise_not`` of a bool mask are ``mask == 0`` (a bool mask is
0.0 / 1.0 inside a kernel). Declined, with the reason: ``~`` of a tensor that is not bool (a
bitwise not of integers).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

spell(
    Spec("logical_not", (("input", REQUIRED),)),
    functions=(operator.invert, torch.logical_not, torch.bitwise_not),
    methods=("logical_not", "bitwise_not"),
)


@lowering("logical_not")
def _logical_not(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    mask = b.get("input")
    if not isinstance(mask, NodeRef) or lw.node(mask).dtype != "bool":
        what = lw.node(mask).dtype if isinstance(mask, NodeRef) else type(mask).__name__
        raise UnsupportedGraph(f"a logical or bitwise not of {what} is covered for bool masks only", op=canon)
    return lw.add(NodeKind.EW, lw.shape(mask), op="eq", args=(mask.id, 0.0), dtype="bool")
