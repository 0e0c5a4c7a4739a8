"""``F.one_hot(t, num_classes)``: a classifier's targets or predictions as rows of 0 and 1 (a
Brier score, a label-smoothed loss written by hand, a mask of the predicted class).

The result is one comparison node of int64 type: the element at ``(*i, c)`` is ``t[*i] == c``,
computed where it is read (the class positions are an ``arange`` along the new last dim, ``t`` is
read once per row and broadcast). It is stored as int64 0/1 where it is an output, and it is read
as float32 0.0/1.0 where PyTorch converts it (``.float()``, ``probs - one_hot``), so nothing of
``C`` times the targets' size is written in between.

Declined, with the reason: ``num_classes=-1`` (the class count is read from the data), targets of
another dtype than int64. A target outside ``[0, num_classes)`` gives a row of zeros, where PyTorch
raises.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, index_input, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

spell(
    Spec("one_hot", (("tensor", REQUIRED), ("num_classes", -1))),
    functions=(F.one_hot,),
)
index_input("one_hot", "tensor")


@lowering("one_hot")
def _one_hot(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    t, classes = b.get("tensor"), lw.arg(b.get("num_classes", -1))
    if not isinstance(t, NodeRef) or lw.node(t).dtype != "int64":
        found = lw.node(t).dtype if isinstance(t, NodeRef) else type(t).__name__
        raise UnsupportedGraph(f"F.one_hot of {found} is not covered (an int64 tensor)", op=canon)
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise UnsupportedGraph(
            f"F.one_hot with num_classes={classes!r} is not covered: the class count must be given (not read "
            "from the data)",
            op=canon,
        )
    shape = (*lw.shape(t), classes)
    if isinstance(traced, torch.Tensor) and tuple(traced.shape) != shape:
        raise UnsupportedGraph(f"F.one_hot traced to {tuple(traced.shape)}, not {shape}", op=canon)
    rows = lw.view(lw.in_order(t), (*lw.shape(t), 1))
    positions = lw.add(NodeKind.EW, (classes,), op="arange", args=(), attrs=(0.0, 1.0), dtype="int64")
    return lw.add(NodeKind.EW, shape, op="eq", args=(rows.id, positions.id), dtype="int64")
