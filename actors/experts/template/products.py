"""Matrix products while lowering: a product node, or a row reduction for a matrix-vector product."""

from __future__ import annotations

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, one_float_type


def product(lw: LowerContext, a: NodeRef, w: NodeRef) -> NodeRef:
    """``a @ w``: an ``MM`` node, or a row reduction when ``w`` is one column."""
    sa, sb = lw.shape(a), lw.shape(w)
    if len(sa) < 2 or len(sb) < 2:
        raise UnsupportedGraph("matmul with a one-dimensional operand is not covered")
    if sa[-1] != sb[-2]:
        raise UnsupportedGraph(f"matmul of {sa} and {sb} does not match")
    ba, bb = sa[:-2], sb[:-2]
    if ba and bb and ba != bb:
        raise UnsupportedGraph(f"matmul broadcasting batch dims {ba} and {bb} is not covered")
    if sb[-1] == 1 and sa[-1] > 1 and not bb:
        vector = _as_row(lw, w)
        if vector is not None and not lw.transposed(a):
            return _matvec(lw, a, vector)
    dtype = one_float_type(lw, [a, w], "a matrix product")
    return lw.add(NodeKind.MM, (*(ba or bb), sa[-2], sb[-1]), args=(a.id, w.id), dtype=dtype)


def _as_row(lw: LowerContext, column: NodeRef) -> NodeRef | None:
    """A ``(K, 1)`` operand as the ``(K,)`` row it broadcasts like (``None`` if it cannot be read so)."""
    node = lw.node(column)
    if node.kind is NodeKind.PERM:  # the transpose of a (1, K) weight (``linear`` to one output)
        src = NodeRef(node.tensor_args()[0])
        return lw.view(src, (lw.shape(src)[-1],)) if not lw.transposed(src) else None
    if lw.transposed(column):
        return None
    return lw.view(column, (lw.shape(column)[-2],))


def _matvec(lw: LowerContext, a: NodeRef, row: NodeRef) -> NodeRef:
    """``a @ v`` for a column ``v``: each output is the sum over a row of ``a * v``, a memory-bound
    row reduction (the product template would pad the one column to a whole tile)."""
    rank = len(lw.shape(a))
    return lw.red("sum", lw.ew("mul", a, row), (rank - 1, rank), True)
