"""Lowering the losses into the plan's primitive nodes (elementwise terms and a reduction).

``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``kl_div`` and
``triplet_margin_loss`` (functions and their ``nn`` modules), with ``reduction`` ``mean``,
``sum``, ``none`` (and ``batchmean`` for ``kl_div``); the reduction to a scalar is a row
reduction over every dim. Smooth L1 and Huber are written without a select: with
``m = min(|d|, beta)`` the loss is ``0.5 m^2 / beta + (|d| - m)`` (Huber: ``0.5 m^2 + delta (|d| - m)``),
equal to PyTorch's two branches. ``kl_div`` uses ``xlogy(t, t) - t * input`` (0 where ``t`` is
0). ``cross_entropy`` and ``nll_loss`` over ``(N, C)`` read each row's target class with a
``take_last`` node (int64 class indices; ``ignore_index`` rows count 0 and leave the mean) or,
for cross entropy, weigh the log-probabilities by class probabilities. Binary cross entropy
(``binary_cross_entropy_with_logits`` and ``binary_cross_entropy``, functions and modules) is
written as ATen computes it: of logits ``(1 - t) x - w_p logsigmoid(x)`` with ``w_p = 1 + (p - 1) t``
for a ``pos_weight`` p (1 without one); of probabilities ``(t - 1) max(log(1 - x), -100) - t
max(log x, -100)``; either times ``weight`` where one is given (both broadcast as PyTorch does).
Cross entropy's ``label_smoothing`` e is PyTorch's: ``(1 - e)`` times the loss plus ``e / C`` times
the row's ``-sum_j log p_j`` (ignored rows count 0 in both and leave the mean), or class
probabilities mixed with the uniform ``e / C``.
Declined, with the reason: other reductions, ``swap`` and p other than 2 in the triplet loss,
class weights of the other losses and inputs of other than two dims.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import param_or_arg
from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, index_input, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

LOSSES = (
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "triplet_margin_loss", "cross_entropy", "nll_loss"
)  # fmt: skip
"""The canonical loss ops lowered here."""
index_input("cross_entropy", "target")  # int64 class indices
index_input("nll_loss", "target")
_BCE = (("input", REQUIRED), ("target", REQUIRED), ("weight", None), ("size_average", None), ("reduce", None))
spell(
    Spec("bce_logits", (*_BCE, ("reduction", "mean"), ("pos_weight", None))),
    functions=(F.binary_cross_entropy_with_logits,),
)
spell(Spec("bce", (*_BCE, ("reduction", "mean"))), functions=(F.binary_cross_entropy,))
MODULES[nn.BCEWithLogitsLoss] = Spec(
    "bce_logits", (("input", REQUIRED), ("target", REQUIRED)), module_attrs=(("reduction", "reduction"),)
)
MODULES[nn.BCELoss] = Spec(
    "bce", (("input", REQUIRED), ("target", REQUIRED)), module_attrs=(("reduction", "reduction"),)
)


def reduce_loss(lw: LowerContext, loss: NodeRef, reduction: object, batch: int | None = None) -> NodeRef:
    """``loss`` reduced as a loss function's ``reduction`` says (``batchmean``: by ``batch``)."""
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


@lowering(*LOSSES)
def _loss(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    return lower_loss(lw, canon, b)


def lower_loss(lw: LowerContext, canon: str, b: dict[str, Any]) -> NodeRef:
    """The nodes of one loss op."""
    for name in ("size_average", "reduce", "weight"):
        if b.get(name) is not None:
            raise UnsupportedGraph(f"{canon} with {name} is not covered")
    if canon == "triplet_margin_loss":
        return _triplet(lw, b)
    if canon in ("cross_entropy", "nll_loss"):
        return _classes(lw, canon, b)
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
        return reduce_loss(lw, loss, reduction, batch)
    if reduction == "batchmean":
        raise UnsupportedGraph(f"{canon} with reduction='batchmean' is not covered")
    d = lw.ew("sub", x, t)
    if canon == "mse_loss":
        loss = lw.ew("mul", d, d)
    elif canon == "l1_loss":
        loss = lw.ew("abs", d)
    else:
        limit = number(b.get("beta" if canon == "smooth_l1_loss" else "delta", 1.0), "beta/delta")
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
    return reduce_loss(lw, loss, reduction)


@lowering("bce_logits", "bce")
def _bce(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """Binary cross entropy of logits (``bce_logits``) or of probabilities (``bce``)."""
    for name in ("size_average", "reduce"):
        if b.get(name) is not None:
            raise UnsupportedGraph(f"{canon} with the deprecated {name} is not covered", op=canon)
    x = lw.tensor(b["input"], canon)
    t = lw.tensor(b["target"], canon)
    if lw.shape(x) != lw.shape(t):
        # PyTorch refuses other shapes (``Target size must be the same as input size``).
        raise UnsupportedGraph(f"{canon} of shapes {lw.shape(x)} and {lw.shape(t)}", op=canon)
    one_minus_t = lw.ew("add", lw.ew("neg", t), 1.0)
    if canon == "bce_logits":
        log_sig = lw.ew("logsigmoid", x)
        pos_weight = param_or_arg(lw, b, "pos_weight")
        if pos_weight is not None:
            log_sig = lw.ew("mul", log_sig, lw.ew("add", lw.ew("mul", lw.ew("sub", pos_weight, 1.0), t), 1.0))
        loss = lw.ew("sub", lw.ew("mul", one_minus_t, x), log_sig)
    else:
        log_p = lw.ew("maximum", lw.ew("log", x), -100.0)
        log_q = lw.ew("maximum", lw.ew("log", lw.ew("add", lw.ew("neg", x), 1.0)), -100.0)
        loss = lw.ew("sub", lw.ew("mul", lw.ew("neg", one_minus_t), log_q), lw.ew("mul", t, log_p))
    weight = param_or_arg(lw, b, "weight")
    if weight is not None:
        loss = lw.ew("mul", loss, weight)
    if lw.shape(loss) != lw.shape(x):
        raise UnsupportedGraph(f"{canon} whose weights broadcast the loss beyond the input's shape", op=canon)
    return reduce_loss(lw, loss, b.get("reduction", "mean"))


def _triplet(lw: LowerContext, b: dict[str, Any]) -> NodeRef:
    a, p, n = (lw.tensor(b[k], "triplet_margin_loss") for k in ("anchor", "positive", "negative"))
    shape = lw.shape(a)
    if lw.shape(p) != shape or lw.shape(n) != shape or len(shape) != 2:
        raise UnsupportedGraph("triplet_margin_loss of other than three (N, D) tensors is not covered")
    if number(b.get("p", 2.0), "p") != 2.0 or b.get("swap"):
        raise UnsupportedGraph("triplet_margin_loss with p != 2 or swap=True is not covered")
    eps = number(b.get("eps", 1e-6), "eps")
    margin = number(b.get("margin", 1.0), "margin")

    def distance(u: NodeRef, v: NodeRef) -> NodeRef:
        diff = lw.ew("add", lw.ew("sub", u, v), eps)
        return lw.ew("sqrt", lw.red("sum", lw.ew("mul", diff, diff), (1, 2), False))

    gap = lw.ew("add", lw.ew("sub", distance(a, p), distance(a, n)), margin)
    return reduce_loss(lw, lw.ew("clamp_min", gap, attrs=(0.0,)), b.get("reduction", "mean"))


def _classes(lw: LowerContext, canon: str, b: dict[str, Any]) -> NodeRef:
    """``cross_entropy`` (of logits) and ``nll_loss`` (of log-probabilities) over ``(N, C)``.

    With int64 class indices ``t`` the per-row loss is ``logsumexp(x_i) - x_i[t_i]`` (cross
    entropy) or ``-x_i[t_i]``; rows whose target is ``ignore_index`` count 0 and leave the mean's
    denominator. With float class probabilities of ``x``'s shape (cross entropy only) it is
    ``-sum_j t_ij (x_ij - logsumexp(x_i))``.
    """
    smoothing = number(b.get("label_smoothing", 0.0), "label_smoothing")
    if not 0.0 <= smoothing <= 1.0:
        raise UnsupportedGraph(f"{canon} with label_smoothing={smoothing} (PyTorch takes 0 to 1)")
    x = lw.tensor(b["input"], canon)
    target = b["target"]
    if len(lw.shape(x)) != 2:
        raise UnsupportedGraph(f"{canon} of a {len(lw.shape(x))}-D input (only (N, C)) is not covered")
    reduction = b.get("reduction", "mean")
    if reduction not in ("mean", "sum", "none"):
        raise UnsupportedGraph(f"{canon} reduction={reduction!r} is not covered")
    lse: NodeRef | None = None
    if canon == "cross_entropy":  # logsumexp over the classes, as the reductions lower it
        peak = lw.red("amax", x, (1, 2), True)
        total = lw.red("sum", lw.ew("exp", lw.ew("sub", x, peak)), (1, 2), True)
        lse = lw.view(lw.ew("add", lw.ew("log", total), peak), (lw.shape(x)[0],))
    if isinstance(target, NodeRef) and lw.node(target).dtype == "float32":
        if lse is None:
            raise UnsupportedGraph("nll_loss with class probabilities is not a PyTorch op")
        if lw.shape(target) != lw.shape(x):
            raise UnsupportedGraph(f"class probabilities of shape {lw.shape(target)} for {lw.shape(x)}")
        logp = lw.ew("sub", x, lw.view(lse, (lw.shape(x)[0], 1)))
        if smoothing:
            target = lw.ew("add", lw.ew("mul", target, 1.0 - smoothing), smoothing / lw.shape(x)[1])
        loss = lw.ew("neg", lw.red("sum", lw.ew("mul", target, logp), (1, 2), False))
        return reduce_loss(lw, loss, reduction)
    picked = lw.ew("take_last", x, target)
    loss = lw.ew("neg", picked) if lse is None else lw.ew("sub", lse, picked)
    if smoothing and lse is not None:
        # (1 - e) * nll + e / C * (-sum_j log p_j), each row's log-probabilities x_j - lse
        logp = lw.ew("sub", x, lw.view(lse, (lw.shape(x)[0], 1)))
        spread = lw.ew("neg", lw.red("sum", logp, (1, 2), False))
        loss = lw.ew("add", lw.ew("mul", loss, 1.0 - smoothing), lw.ew("mul", spread, smoothing / lw.shape(x)[1]))
    ignore = b.get("ignore_index", -100)
    if isinstance(ignore, bool) or not isinstance(ignore, int):
        raise UnsupportedGraph(f"ignore_index={ignore!r} is not an integer")
    valid = lw.ew("ne", target, float(ignore))
    loss = lw.ew("mul", loss, valid)
    if reduction == "none":
        return loss
    total = lw.red("sum", loss, (0, 1), False)
    if reduction == "sum":
        return total
    return lw.ew("div", total, lw.red("sum", valid, (0, 1), False))
