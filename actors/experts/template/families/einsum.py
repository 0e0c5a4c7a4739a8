"""``torch.einsum`` of any number of operands, as a sequence of pairwise contractions.

``composites.py`` covers the two-operand einsums that are one matrix product as they stand and
falls through to this module for every other one. Lowered:

1. An index that appears in one operand only and not in the output is summed away first (a
   ``sum`` reduction of that operand, its summed dims moved last).
2. While more than one operand is left, the pair whose result is smallest (ties: the pair sharing
   most indices) is contracted: an index both share and still needed later (by the output or
   another operand) is a batch dim, one both share and needed nowhere else is contracted, the
   others are the free rows and columns. That is one (batched) matrix product
   (``products.product``) of the two operands permuted and reshaped to ``(B, M, K)`` and
   ``(B, K, N)``; with nothing to contract, an elementwise product that broadcasts the two.
3. The last operand is permuted into the output's order.

Permutes are PyTorch data movement (``{0}.permute(...)``, copied contiguous: admitted under every
run policy), reshapes are views; a product's operand that is ``(B, K, M)`` rather than
``(B, M, K)`` is read transposed by the product, not copied. Declined, with the reason: an
ellipsis, an index repeated within one operand (a diagonal), sizes of one index that differ
(broadcasting), an output index found in no operand, and operands other than float32.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.products import product

Term = tuple[NodeRef, str]
"""An operand and its indices, one letter per dim."""


@lowering("einsum")
def _einsum(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    equation, operands = b.get("equation"), b.get("operands")
    if not isinstance(equation, str) or not isinstance(operands, tuple | list) or not operands:
        raise UnsupportedGraph("einsum of other than an equation string and tensors is not covered", op="einsum")
    return contract(lw, equation, [lw.tensor(t, "an einsum operand") for t in operands])


def _parse(equation: str, n: int) -> tuple[list[str], str]:
    """The operands' indices and the output's (implicit: the indices met once, sorted)."""
    eq = equation.replace(" ", "")
    if "." in eq:
        raise UnsupportedGraph(f"einsum {equation!r}: an ellipsis is not covered", op="einsum")
    lhs, arrow, out = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != n:
        raise UnsupportedGraph(f"einsum {equation!r} names {len(inputs)} operands; {n} given", op="einsum")
    if not arrow:
        counts = {c: sum(s.count(c) for s in inputs) for c in set(lhs) - {","}}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    for s in (*inputs, out):
        if not all(c.isalpha() for c in s) or len(set(s)) != len(s):
            raise UnsupportedGraph(
                f"einsum {equation!r}: an index repeated within one operand (a diagonal) is not covered", op="einsum"
            )
    if set(out) - set(lhs):
        raise UnsupportedGraph(f"einsum {equation!r}: an output index is in no operand", op="einsum")
    return inputs, out


def contract(lw: LowerContext, equation: str, operands: list[NodeRef]) -> NodeRef:
    """``torch.einsum(equation, *operands)`` as reductions, products and permutes."""
    inputs, out = _parse(equation, len(operands))
    sizes: dict[str, int] = {}
    for ref, idx in zip(operands, inputs, strict=True):
        shape = lw.shape(ref)
        if lw.node(ref).dtype != "float32" or len(shape) != len(idx):
            raise UnsupportedGraph(
                f"einsum {equation!r} of a {lw.node(ref).dtype} operand of shape {shape} is not covered", op="einsum"
            )
        for c, n in zip(idx, shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise UnsupportedGraph(f"einsum {equation!r}: index {c!r} has sizes {sizes[c]} and {n}", op="einsum")
    terms = [_sum_own(lw, ref, idx, out, inputs, k) for k, (ref, idx) in enumerate(zip(operands, inputs, strict=True))]
    while len(terms) > 1:
        i, j = _cheapest(terms, out, sizes)
        rest = [t for k, t in enumerate(terms) if k not in (i, j)]
        merged = _pair(lw, terms[i], terms[j], _needed(out, [t[1] for t in rest]), out if not rest else "", sizes)
        terms = [merged, *rest]
    ref, idx = terms[0]
    return _arranged(lw, ref, idx, out)


def _needed(out: str, others: list[str]) -> set[str]:
    """The indices the output or any of ``others`` (operands' indices) still reads."""
    return set(out).union(*others)


def _sum_own(lw: LowerContext, ref: NodeRef, idx: str, out: str, inputs: list[str], k: int) -> Term:
    """The operand with its own indices (in no other operand, not in the output) summed away."""
    own = [c for c in idx if c not in _needed(out, inputs[:k] + inputs[k + 1 :])]
    if not own:
        return ref, idx
    kept = "".join(c for c in idx if c not in own)
    moved = _arranged(lw, ref, idx, kept + "".join(own))
    rank = len(idx)
    return lw.red("sum", moved, (len(kept), rank), False), kept


def _result(a: str, b: str, needed: set[str]) -> str:
    return "".join(dict.fromkeys(c for c in a + b if c in needed))


def _cheapest(terms: list[Term], out: str, sizes: dict[str, int]) -> tuple[int, int]:
    """The pair whose contraction gives the smallest result; ties: the one sharing most indices."""

    def cost(pair: tuple[int, int]) -> tuple[int, int]:
        i, j = pair
        needed = _needed(out, [t[1] for k, t in enumerate(terms) if k not in pair])
        result = _result(terms[i][1], terms[j][1], needed)
        return math.prod(sizes[c] for c in result), -len(set(terms[i][1]) & set(terms[j][1]))

    return min(itertools.combinations(range(len(terms)), 2), key=cost)


def _pair(lw: LowerContext, a: Term, w: Term, needed: set[str], out: str, sizes: dict[str, int]) -> Term:
    """Two operands contracted into one; ``out`` (the last pair's) orders the result's indices."""
    (ra, ia), (rw, iw) = a, w
    free = [c for c in out if (c in ia) != (c in iw)]
    if free and free[0] in iw:  # the last pair: the left operand's free indices come first in the output
        (ra, ia), (rw, iw) = (rw, iw), (ra, ia)
    order = out or ia + iw

    def ranked(chars: set[str]) -> str:
        return "".join(sorted(chars, key=lambda c: (order.find(c) if c in order else len(order), ia.find(c))))

    batch = ranked(set(ia) & set(iw) & needed)
    summed = "".join(c for c in ia if c in iw and c not in needed)
    rows, cols = ranked(set(ia) - set(iw)), ranked(set(iw) - set(ia))
    if not summed:  # nothing contracted: an elementwise product, each side broadcast
        left = lw.view(_arranged(lw, ra, ia, batch + rows), _sized(batch + rows, sizes) + (1,) * len(cols))
        right = _arranged(lw, rw, iw, batch + cols)
        right = lw.view(right, _sized(batch, sizes) + (1,) * len(rows) + _sized(cols, sizes))
        return lw.ew("mul", left, right), batch + rows + cols
    nb, nm, nk, nn = (math.prod(_sized(s, sizes)) for s in (batch, rows, summed, cols))
    lead = (nb,) if batch else ()
    left = _operand(lw, ra, ia, batch, rows, summed, (*lead, nm, nk))
    right = _operand(lw, rw, iw, batch, summed, cols, (*lead, nk, nn))
    result = product(lw, left, right)
    return lw.view(result, _sized(batch + rows + cols, sizes)), batch + rows + cols


def _operand(
    lw: LowerContext, ref: NodeRef, idx: str, batch: str, first: str, second: str, shape: tuple[int, ...]
) -> NodeRef:
    """``ref`` as a product operand of ``shape`` (batch, first, second): reshaped as it stands,
    read transposed where it holds (batch, second, first), else permuted first."""
    if idx == batch + second + first and first and second:
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return lw.perm(lw.view(ref, swapped))
    return lw.view(_arranged(lw, ref, idx, batch + first + second), shape)


def _sized(idx: str, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[c] for c in idx)


def _arranged(lw: LowerContext, ref: NodeRef, idx: str, order: str) -> NodeRef:
    """``ref`` (indices ``idx``) with its dims in ``order``: itself, or a PyTorch permute."""
    if idx == order:
        return ref
    dims = tuple(idx.index(c) for c in order)
    shape = tuple(lw.shape(ref)[d] for d in dims)
    return lw.add(NodeKind.TORCH, shape, dtype="float32", args=(ref.id,), path=f"{{0}}.permute{dims!r}")
