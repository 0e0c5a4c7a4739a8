"""Lowering the losses into the plan's primitive nodes (elementwise terms and a reduction).

``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``kl_div`` and
``triplet_margin_loss`` (functions and their ``nn`` modules), with ``reduction`` ``mean``,
``sum``, ``none`` (and ``batchmean`` for ``kl_div``); the reduction to a scalar is a row
reduction over every dim. Smooth L1 and Huber are written without a select: with
``m = min(|d|, beta)`` the loss is ``0.5 m^2 / beta + (|d| - m)`` (Huber: ``0.5 m^2 + delta (|d| - m)``),
equal to PyTorch's two branches. ``kl_div`` uses ``xlogy(t, t) - t * input`` (0 where ``t`` is
0). Declined, with the reason: other reductions, ``swap`` and p other than 2 in the triplet loss.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef

if TYPE_CHECKING:
    from actors.experts.template.lower import Lowerer

LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "triplet_margin_loss")
"""The canonical loss ops lowered here."""


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnsupportedGraph(f"{what} must be a number, got {value!r}")
    return float(value)


def _reduce(lw: Lowerer, loss: NodeRef, reduction: object, batch: int | None = None) -> NodeRef:
    shape = lw.shape(loss)
    if reduction == "none":
        return loss
    if reduction not in ("mean", "sum", "batchmean") or (reduction == "batchmean" and batch is None):
        raise UnsupportedGraph(f"loss reduction={reduction!r} is not covered")
    if not shape:
        return loss if reduction == "sum" else lw.ew("div", loss, 1.0)
    total = lw.red("sum", loss, (0, len(shape)), False)
    if reduction == "sum":
        return total
    count = batch if reduction == "batchmean" and batch is not None else math.prod(shape)
    return lw.ew("div", total, float(count))


def lower_loss(lw: Lowerer, canon: str, b: dict[str, Any]) -> NodeRef:
    """The nodes of one loss op."""
    for name in ("size_average", "reduce", "weight"):
        if b.get(name) is not None:
            raise UnsupportedGraph(f"{canon} with {name} is not covered")
    if canon == "triplet_margin_loss":
        return _triplet(lw, b)
    x = lw.tensor(b["input"], canon)
    t = lw.tensor(b["target"], canon)
    if lw.shape(x) != lw.shape(t):
        raise UnsupportedGraph(f"{canon} of shapes {lw.shape(x)} and {lw.shape(t)} (broadcasting) is not covered")
    reduction = b.get("reduction", "mean")
    if canon == "kl_div":
        if b.get("log_target"):
            loss = lw.ew("mul", lw.ew("exp", t), lw.ew("sub", t, x))
        else:
            loss = lw.ew("sub", lw.ew("xlogx", t), lw.ew("mul", t, x))
        batch = lw.shape(x)[0] if lw.shape(x) else 1
        return _reduce(lw, loss, reduction, batch)
    if reduction == "batchmean":
        raise UnsupportedGraph(f"{canon} with reduction='batchmean' is not covered")
    d = lw.ew("sub", x, t)
    if canon == "mse_loss":
        loss = lw.ew("mul", d, d)
    elif canon == "l1_loss":
        loss = lw.ew("abs", d)
    else:
        limit = _number(b.get("beta" if canon == "smooth_l1_loss" else "delta", 1.0), "beta/delta")
        ad = lw.ew("abs", d)
        if limit <= 0.0:
            if canon == "huber_loss":
                raise UnsupportedGraph("huber_loss with delta <= 0 is not covered")
            loss = ad
        else:
            m = lw.ew("minimum", ad, limit)
            square = lw.ew("mul", lw.ew("mul", m, m), 0.5)
            linear = lw.ew("sub", ad, m)
            if canon == "smooth_l1_loss":
                loss = lw.ew("add", lw.ew("div", square, limit), linear)
            else:
                loss = lw.ew("add", square, lw.ew("mul", linear, limit))
    return _reduce(lw, loss, reduction)


def _triplet(lw: Lowerer, b: dict[str, Any]) -> NodeRef:
    a, p, n = (lw.tensor(b[k], "triplet_margin_loss") for k in ("anchor", "positive", "negative"))
    shape = lw.shape(a)
    if lw.shape(p) != shape or lw.shape(n) != shape or len(shape) != 2:
        raise UnsupportedGraph("triplet_margin_loss of other than three (N, D) tensors is not covered")
    if _number(b.get("p", 2.0), "p") != 2.0 or b.get("swap"):
        raise UnsupportedGraph("triplet_margin_loss with p != 2 or swap=True is not covered")
    eps = _number(b.get("eps", 1e-6), "eps")
    margin = _number(b.get("margin", 1.0), "margin")

    def distance(u: NodeRef, v: NodeRef) -> NodeRef:
        diff = lw.ew("add", lw.ew("sub", u, v), eps)
        return lw.ew("sqrt", lw.red("sum", lw.ew("mul", diff, diff), (1, 2), False))

    gap = lw.ew("add", lw.ew("sub", distance(a, p), distance(a, n)), margin)
    return _reduce(lw, lw.ew("clamp_min", gap, attrs=(0.0,)), b.get("reduction", "mean"))
