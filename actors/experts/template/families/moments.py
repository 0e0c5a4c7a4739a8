"""Variance and standard deviation: ``torch.var``/``torch.std`` and their methods, with ``dim``,
``keepdim`` and Bessel's correction (``unbiased`` or ``correction``, PyTorch's default 1); and
pairwise distances, ``torch.cdist(x1, x2, p)`` for ``p`` of 1, 2 or infinity, and the distance
of paired rows, ``F.pairwise_distance(x1, x2, p, eps, keepdim)`` (``nn.PairwiseDistance``): the
``p``-norm of ``x1 - x2 + eps`` over the last dim, as PyTorch computes it, for ``p`` of 1, 2,
infinity or any other positive number (``(sum |d|^p)^(1/p)``).

The variance is the sum of squared deviations from the mean that the norms compute
(``families/norm.moments``), divided by the count less the correction (a count at or below the
correction divides by zero or less, giving ``inf``/``nan`` as PyTorch does); the standard
deviation is its square root.

``cdist`` is the rows' differences broadcast against each other, reduced over the features in
one row kernel (``(|d|^2 summed)^0.5``, ``|d|`` summed, or its largest): the direct formula, never
less accurate than PyTorch's matrix-product form for many rows (``compute_mode`` changes nothing).

Declined, with the reason: dims that are not one contiguous run, a non-number correction;
``cdist`` with another ``p`` or of other than 2- or 3-dim operands with the same leading dims;
``pairwise_distance`` with ``p`` of 0 or below.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from actors.experts.template.composites import power, reduce_dims
from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.families.norm import moments
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

_MOMENT = (("input", REQUIRED), ("dim", None), ("unbiased", None), ("keepdim", False), ("correction", None))
spell(Spec("var", _MOMENT), functions=(torch.var,), methods=("var",))
spell(Spec("std", _MOMENT), functions=(torch.std,), methods=("std",))


@lowering("var", "std")
def _moment(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), f"the input of {canon}")
    shape = lw.shape(x)
    dim = lw.arg(b.get("dim"))
    unbiased, correction = lw.arg(b.get("unbiased")), lw.arg(b.get("correction"))
    if isinstance(dim, bool):  # ``x.var(False)``: the old ``var(input, unbiased)`` spelling
        dim, unbiased = None, dim
    if correction is None:
        correction = 1.0 if unbiased is None or unbiased else 0.0
    c = number(correction, f"{canon}'s correction")
    dims = reduce_dims(shape, dim)
    _, squares, count = moments(lw, x, dims)  # the norms' statistics: the same kernels
    out = lw.ew("div", squares, float(count) - c)
    if canon == "std":
        out = lw.ew("sqrt", out)
    if not isinstance(traced, torch.Tensor):
        raise UnsupportedGraph(f"{canon}: the traced result is not a tensor", op=canon)
    final = tuple(int(s) for s in traced.shape)
    return out if final == lw.shape(out) else lw.view(out, final)


spell(
    Spec("cdist", (("x1", REQUIRED), ("x2", REQUIRED), ("p", 2.0), ("compute_mode", None))),
    functions=(torch.cdist,),
)


@lowering("cdist")
def _cdist(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x1, x2 = lw.tensor(b.get("x1"), "the first input of cdist"), lw.tensor(b.get("x2"), "the second input of cdist")
    s1, s2 = lw.shape(x1), lw.shape(x2)
    p = number(lw.arg(b.get("p")), "cdist's p")
    if len(s1) not in (2, 3) or len(s1) != len(s2) or s1[:-2] != s2[:-2] or s1[-1] != s2[-1]:
        raise UnsupportedGraph(f"cdist of {s1} and {s2} is not covered (2- or 3-dim, the same leading dims)", op=canon)
    if p not in (1.0, 2.0, math.inf):
        raise UnsupportedGraph(f"cdist with p={p} is not covered (1, 2 or inf)", op=canon)
    lead, rows, cols, width = s1[:-2], s1[-2], s2[-2], s1[-1]
    diff = lw.ew("sub", lw.view(x1, (*lead, rows, 1, width)), lw.view(x2, (*lead, 1, cols, width)))
    rank = len(lead) + 3
    if p == 2.0:
        return lw.ew("sqrt", lw.red("sum", lw.ew("mul", diff, diff), (rank - 1, rank), False, split_rows=False))
    size = lw.ew("abs", diff)
    return lw.red("sum" if p == 1.0 else "amax", size, (rank - 1, rank), False, split_rows=False)


_PAIRWISE = (("p", 2.0), ("eps", 1e-6), ("keepdim", False))
spell(
    Spec("pairwise_distance", (("x1", REQUIRED), ("x2", REQUIRED), *_PAIRWISE)),
    functions=(torch.nn.functional.pairwise_distance, torch.pairwise_distance),
)
MODULES[nn.PairwiseDistance] = Spec(
    "pairwise_distance",
    (("x1", REQUIRED), ("x2", REQUIRED)),
    module_attrs=(("p", "norm"), ("eps", "eps"), ("keepdim", "keepdim")),
)


@lowering("pairwise_distance")
def _pairwise(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x1 = lw.tensor(b.get("x1"), "the first input of pairwise_distance")
    x2 = lw.tensor(b.get("x2"), "the second input of pairwise_distance")
    p = number(lw.arg(b.get("p")), "pairwise_distance's p")
    eps = number(lw.arg(b.get("eps")), "pairwise_distance's eps")
    if not p > 0:
        raise UnsupportedGraph(f"pairwise_distance with p={p} is not covered (above 0)", op=canon)
    diff = lw.ew("add", lw.ew("sub", x1, x2), eps)
    rank = len(lw.shape(diff))
    if rank == 0:
        raise UnsupportedGraph("pairwise_distance of 0-dim tensors is not covered", op=canon)
    keep = bool(lw.arg(b.get("keepdim")))
    last = (rank - 1, rank)
    if p == 2.0:
        out = lw.ew("sqrt", lw.red("sum", lw.ew("mul", diff, diff), last, keep, split_rows=False))
    elif p == math.inf:
        out = lw.red("amax", lw.ew("abs", diff), last, keep, split_rows=False)
    elif p == 1.0:
        out = lw.red("sum", lw.ew("abs", diff), last, keep, split_rows=False)
    else:
        out = power(lw, lw.red("sum", power(lw, lw.ew("abs", diff), p), last, keep, split_rows=False), 1.0 / p)
    final = tuple(int(s) for s in traced.shape)
    return out if final == lw.shape(out) else lw.view(out, final)
