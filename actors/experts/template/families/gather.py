"""``torch.gather(x, dim, index)`` (``Tensor.gather``) and ``torch.topk(x, k, dim)`` (``Tensor.topk``):
a mixture of experts' routing (the largest gate weights, then each token's chosen experts' outputs).

``gather`` becomes one ``take_along`` gather node: each output element reads the stored ``x`` at
its own coordinates, but along ``dim`` at the int64 ``index`` value of the same element (0.0 where
the index is outside ``[0, x.shape[dim])``, where PyTorch raises). It fuses like any elementwise
op: the index is computed in the same kernel (an ``expand`` of indices is read with stride 0), the
ops after it read the gathered values in place.

``topk`` is ``k`` rounds of a row's largest value and its first index (``amax``, ``argmax``), the
elements taken in earlier rounds set to ``-inf`` before the next; the values and indices of the
rounds are joined along ``dim`` (largest first, as ``sorted=True`` gives them; ``largest=False``
negates the input and the values). Equal values are taken lowest index first, an order PyTorch
leaves undefined.

Declined, with the reason: an ``index`` of another rank than ``x`` or larger than ``x`` along a dim
other than ``dim``, indices of other dtypes, a ``topk`` along a dim other than the last, ``k``
above 16 or above the dim's size, ``sorted=False`` (any order is valid; taken as sorted).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.concat import join
from actors.experts.template.ir import EW_OPS, Node, NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import INDEX_DTYPES, LowerContext, index_input, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

EW_OPS["take_along"] = (2, 1)  # the source and the indices; the dim
spell(
    Spec("gather", (("input", REQUIRED), ("dim", REQUIRED), ("index", REQUIRED), ("sparse_grad", False))),
    functions=(torch.gather,),
    methods=("gather",),
)
spell(
    Spec("topk", (("input", REQUIRED), ("k", REQUIRED), ("dim", -1), ("largest", True), ("sorted", True))),
    functions=(torch.topk,),
    methods=("topk",),
)
index_input("gather", "index")
MAX_K = 16
"""The most rounds a ``topk`` is lowered to (each is a reduction of the row)."""


@lowering("gather")
def _gather(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of torch.gather")
    index = b.get("index")
    if not isinstance(index, NodeRef) or lw.node(index).dtype not in INDEX_DTYPES:
        found = lw.node(index).dtype if isinstance(index, NodeRef) else type(index).__name__
        raise UnsupportedGraph(f"torch.gather with indices of {found} is not covered (an int64 tensor)", op=canon)
    shape, ishape = lw.shape(x), lw.shape(index)
    dim = lw.arg(b.get("dim"))
    if not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < max(1, len(shape)):
        raise UnsupportedGraph(f"torch.gather along dim {dim!r} of a {len(shape)}-dim tensor is not valid", op=canon)
    dim %= max(1, len(shape))
    if len(ishape) != len(shape) or any(i > s for d, (i, s) in enumerate(zip(ishape, shape, strict=True)) if d != dim):
        raise UnsupportedGraph(f"torch.gather of {shape} with indices of shape {ishape} is not valid", op=canon)
    x = lw.in_order(x)
    return lw.add(
        NodeKind.EW, ishape, op="take_along", args=(x.id, index.id), attrs=(float(dim),), dtype=lw.node(x).dtype
    )


@gather_emitter("take_along")
def _take_along(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """``x`` at this element's coordinates, its own ``dim`` coordinate replaced by the index."""
    base = w.gather_source(node, "indices along a dim")
    src, index = node.tensor_args()
    shape = w.plan.nodes[src].shape
    dim = int(node.attrs[0])
    t = f"({w.operand(scope, index, node.shape, row)}).to(tl.int64)"  # a cat of indices is computed in float32
    sp = w.space(row)
    rank = len(node.shape)
    terms = [f"{t} * {math.prod(shape[dim + 1 :])}"]
    for d in range(rank):
        if d != dim:
            coord = sp.index(node.shape, (d, d + 1))
            terms.append(f"({coord}) * {math.prod(shape[d + 1 :])}")
    var = f"v{node.id}"
    ok = f"({sp.mask}) & ({t} >= 0) & ({t} < {shape[dim]})"
    load = f"tl.load({w.pointer(base)} + {' + '.join(terms)}, mask={ok}, other=0.0).to(tl.float32)"
    w.emit(scope, f"{var} = {load}")
    return var


@lowering("topk")
def _topk(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> TupleRef:
    x = lw.tensor(b.get("input"), "the input of topk")
    shape = lw.shape(x)
    k, dim = lw.arg(b.get("k")), lw.arg(b.get("dim"))
    if not shape or not isinstance(dim, int) or isinstance(dim, bool) or dim % len(shape) != len(shape) - 1:
        raise UnsupportedGraph(f"topk along dim {dim!r} of {shape} is not covered (the last dim)", op=canon)
    size = shape[-1]
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= min(MAX_K, size):
        raise UnsupportedGraph(f"topk with k={k!r} of a dim of {size} is not covered (1 to {MAX_K})", op=canon)
    largest = bool(lw.arg(b.get("largest", True)))
    if lw.node(x).dtype != "float32":
        raise UnsupportedGraph(f"topk of a tensor of dtype {lw.node(x).dtype} is not covered (float32)", op=canon)
    rank = len(shape)
    cur = x if largest else lw.ew("neg", x)
    positions = lw.add(NodeKind.EW, (size,), op="arange", args=(), attrs=(0.0, 1.0), dtype="int64")
    values: list[NodeRef] = []
    indices: list[NodeRef] = []
    for r in range(k):
        values.append(lw.red("amax", cur, (rank - 1, rank), True, split_rows=False))
        indices.append(lw.red("argmax", cur, (rank - 1, rank), True, split_rows=False))
        if r < k - 1:
            cur = lw.ew("where", lw.ew("eq", positions, indices[-1]), float("-inf"), cur)
    if not largest:
        values = [lw.ew("neg", v) for v in values]
    if k == 1:
        return TupleRef((values[0], indices[0]))
    return TupleRef((join(lw, values, rank - 1, "float32"), join(lw, indices, rank - 1, "int64")))
