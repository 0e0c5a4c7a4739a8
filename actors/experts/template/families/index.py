"""Reading rows by int64 indices: ``nn.Embedding`` / ``F.embedding``, ``torch.index_select``
(``Tensor.index_select``) along dim 0, and ``x[idx]`` with a 1-dim int64 tensor (the core's
``getitem`` looks ``index_select`` up in the registry).

Each becomes one ``take_rows`` gather node: ``take_rows(x, t)`` reads ``x[t[...], j]`` from the
stored ``x`` of shape ``(V, D)`` at the int64 index ``t`` of shape ``(*S, 1)``, giving ``(*S, D)``
(0.0 where ``t`` is outside ``[0, V)``, where PyTorch raises). A tensor of more than two dims is
read as ``(V, D)`` rows of its trailing dims and the result viewed back. It fuses like any
elementwise op: the ops after it read the gathered values in the same kernel. ``padding_idx``
changes only gradients, so it is accepted; declined, with the reason: ``max_norm`` (it renormalises
the weights in place), ``index_select`` along another dim, and indices of another dtype.

The indices may also be an integer buffer of the model (Swin's ``relative_position_bias_table[
self.relative_position_index.view(-1)]``), int64 or int32, when every use of it is as indices
(``lower.py`` checks, looking through views): it reaches the kernels as any buffer does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import param_or_arg
from actors.experts.template.emit import Scope, Writer, gather_emitter
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import EW_OPS, Node, NodeKind, NodeRef
from actors.experts.template.lowering import INDEX_DTYPES, LowerContext, index_input, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

EW_OPS["take_rows"] = (2, 0)
spell(
    Spec(
        "embedding",
        (
            ("input", REQUIRED),
            ("weight", REQUIRED),
            ("padding_idx", None),
            ("max_norm", None),
            ("norm_type", 2.0),
            ("scale_grad_by_freq", False),
            ("sparse", False),
        ),
    ),
    functions=(F.embedding,),
)
MODULES[nn.Embedding] = Spec("embedding", (("input", REQUIRED),), module_attrs=(("max_norm", "max_norm"),))
spell(
    Spec("index_select", (("input", REQUIRED), ("dim", REQUIRED), ("index", REQUIRED))),
    functions=(torch.index_select,),
    methods=("index_select",),
)
index_input("embedding", "input")
index_input("index_select", "index")
index_input("getitem", "index")  # ``x[idx]`` with a 1-dim int64 tensor: ``composites`` asks index_select


def _indices(lw: LowerContext, ref: object, what: str) -> NodeRef:
    """``ref`` as a tensor of indices (int64; int32 only from a buffer), or decline."""
    if not isinstance(ref, NodeRef) or lw.node(ref).dtype not in INDEX_DTYPES:
        found = lw.node(ref).dtype if isinstance(ref, NodeRef) else type(ref).__name__
        raise UnsupportedGraph(f"{what} indices of {found} are not covered (an int64 tensor only)")
    return ref


def _rows(lw: LowerContext, table: NodeRef, indices: NodeRef, what: str) -> NodeRef:
    """``table[indices]`` along dim 0: ``(*S, *R)`` from a table ``(V, *R)`` and indices ``S``."""
    shape = lw.shape(table)
    if len(shape) < 2:
        raise UnsupportedGraph(f"{what} of a table of shape {shape} is not covered")
    table = lw.in_order(table)
    rows = shape[0]
    rest = shape[1:]
    flat = table if len(rest) == 1 else lw.view(table, (rows, math.prod(rest)))
    s = lw.shape(indices)
    column = lw.view(indices, (*s, 1))
    out = lw.add(
        NodeKind.EW, (*s, math.prod(rest)), op="take_rows", args=(flat.id, column.id), dtype=lw.node(table).dtype
    )
    return out if len(rest) == 1 else lw.view(out, (*s, *rest))


@lowering("embedding")
def _embedding(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    if b.get("max_norm") is not None:
        raise UnsupportedGraph("embedding with max_norm (it renormalises the weights in place) is not covered")
    weight = param_or_arg(lw, b, "weight")
    if weight is None:
        raise UnsupportedGraph("embedding without a weight is not covered")
    return _rows(lw, weight, _indices(lw, b["input"], "embedding"), "embedding")


@lowering("index_select")
def _index_select(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    table = lw.tensor(b["input"], "index_select")
    dim = b.get("dim")
    if not isinstance(dim, int) or dim not in (0, -len(lw.shape(table))):
        raise UnsupportedGraph(f"index_select along dim {dim!r} is not covered (dim 0 only)")
    indices = _indices(lw, b["index"], "index_select")
    if len(lw.shape(indices)) != 1:
        raise UnsupportedGraph("index_select with indices of other than one dim is not covered")
    return _rows(lw, table, indices, "index_select")


@gather_emitter("take_rows")
def _take_rows(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """``x[t, j]`` read from the stored ``x`` ``(V, D)`` at this tile's elements: ``t`` broadcast
    along the last dim, ``j`` the element's own last coordinate."""
    base = w.gather_source(node, "row indices")
    src, index = node.tensor_args()
    count, width = w.plan.nodes[src].shape
    t = w.operand(scope, index, node.shape, row)
    if w.wide and w.plan.nodes[index].dtype != "int64":
        t = f"{t}.to(tl.int64)"  # int32 indices of a buffer: their offsets may pass 2**31
    sp = w.space(row)
    rank = len(node.shape)
    col = sp.index(node.shape, (rank - 1, rank))
    var = f"v{node.id}"
    ok = f"({sp.mask}) & ({t} >= 0) & ({t} < {count})"
    load = f"tl.load({w.pointer(base)} + {t} * {width} + ({col}), mask={ok}, other=0.0).to(tl.float32)"
    w.emit(scope, f"{var} = {load}")
    return var
