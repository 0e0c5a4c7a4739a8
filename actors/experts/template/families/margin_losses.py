"""Margin, embedding and likelihood losses (functions and their ``nn`` modules), each written as
ATen computes it and reduced by ``reduction`` (``mean``, ``sum``, ``none``) as ``families/loss.py``
reduces:

- ``margin_ranking_loss(x1, x2, y, margin)``: ``max(0, -y (x1 - x2) + margin)``;
- ``soft_margin_loss(x, y)``: ``log(1 + exp(-y x))`` (a softplus, infinite where PyTorch's
  ``exp`` overflows);
- ``cosine_embedding_loss(x1, x2, y, margin)``: ``1 - cos`` where ``y`` is 1, ``max(0, cos -
  margin)`` where it is -1, 0 elsewhere, the cosine over the last dim with 1e-12 added to each
  squared norm;
- ``hinge_embedding_loss(x, y, margin)``: ``max(0, margin - x)`` where ``y`` is not 1 plus ``x``
  where it is not -1;
- ``poisson_nll_loss(x, target, log_input, eps)``: ``exp(x) - target x``, or ``x - target
  log(x + eps)``;
- ``multilabel_soft_margin_loss(x, y, weight)``: ``-(y logsigmoid(x) + (1 - y) logsigmoid(-x))``
  (times ``weight``) averaged over the classes, then reduced over the batch.

Declined, with the reason: the deprecated ``size_average``/``reduce``, ``poisson_nll_loss`` with
``full`` (its Stirling term), inputs of other than 1 or 2 dims where the loss sums over the last.
``gaussian_nll_loss`` cannot be traced: PyTorch checks its variances' values (``.item()``) before
it computes, which meta tensors refuse; the analysis says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import param_or_arg
from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.families.loss import reduce_loss
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

_OLD = (("size_average", None), ("reduce", None), ("reduction", "mean"))
_SPECS = {
    "margin_ranking_loss": (("input1", REQUIRED), ("input2", REQUIRED), ("target", REQUIRED), ("margin", 0.0), *_OLD),
    "soft_margin_loss": (("input", REQUIRED), ("target", REQUIRED), *_OLD),
    "cosine_embedding_loss": (("input1", REQUIRED), ("input2", REQUIRED), ("target", REQUIRED), ("margin", 0.0), *_OLD),
    "hinge_embedding_loss": (("input", REQUIRED), ("target", REQUIRED), ("margin", 1.0), *_OLD),
    "poisson_nll_loss": (
        ("input", REQUIRED),
        ("target", REQUIRED),
        ("log_input", True),
        ("full", False),
        ("size_average", None),
        ("eps", 1e-8),
        ("reduce", None),
        ("reduction", "mean"),
    ),
    "multilabel_soft_margin_loss": (("input", REQUIRED), ("target", REQUIRED), ("weight", None), *_OLD),
}
_MODULES = {
    "margin_ranking_loss": (nn.MarginRankingLoss, ("input1", "input2", "target"), ("margin",)),
    "soft_margin_loss": (nn.SoftMarginLoss, ("input", "target"), ()),
    "cosine_embedding_loss": (nn.CosineEmbeddingLoss, ("input1", "input2", "target"), ("margin",)),
    "hinge_embedding_loss": (nn.HingeEmbeddingLoss, ("input", "target"), ("margin",)),
    "poisson_nll_loss": (nn.PoissonNLLLoss, ("input", "target"), ("log_input", "full", "eps")),
    "multilabel_soft_margin_loss": (nn.MultiLabelSoftMarginLoss, ("input", "target"), ()),
}
for _name, _params in _SPECS.items():
    spell(Spec(_name, _params), functions=(getattr(F, _name),))
    _cls, _args, _attrs = _MODULES[_name]
    MODULES[_cls] = Spec(
        _name,
        tuple((a, REQUIRED) for a in _args),
        module_attrs=(*((a, a) for a in _attrs), ("reduction", "reduction")),
    )

_EXP_OVERFLOW = 88.7228
"""Above this, float32's ``exp`` is infinite (and so is PyTorch's ``log1p(exp(z))``)."""


def _sum_last(lw: LowerContext, x: NodeRef, what: str) -> NodeRef:
    rank = len(lw.shape(x))
    if rank not in (1, 2):
        raise UnsupportedGraph(f"{what} of a {rank}-dim input (1 or 2 dims) is not covered", op=what)
    return lw.red("sum", x, (rank - 1, rank), False, split_rows=False)


@lowering(*_SPECS)
def _margin_loss(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    for name in ("size_average", "reduce"):
        if b.get(name) is not None:
            raise UnsupportedGraph(f"{canon} with the deprecated {name} is not covered", op=canon)
    reduction = b.get("reduction", "mean")
    if canon in ("margin_ranking_loss", "cosine_embedding_loss"):
        x1 = lw.tensor(b["input1"], canon)
        x2 = lw.tensor(b["input2"], canon)
        y = lw.tensor(b["target"], canon)
        margin = number(lw.arg(b.get("margin")), f"{canon}'s margin")
        if canon == "margin_ranking_loss":
            gap = lw.ew("add", lw.ew("mul", lw.ew("neg", y), lw.ew("sub", x1, x2)), margin)
            loss = lw.ew("clamp_min", gap, attrs=(0.0,))
            return reduce_loss(lw, loss, reduction)
        dot = _sum_last(lw, lw.ew("mul", x1, x2), canon)
        norms = lw.ew(
            "mul",
            lw.ew("add", _sum_last(lw, lw.ew("mul", x1, x1), canon), 1e-12),
            lw.ew("add", _sum_last(lw, lw.ew("mul", x2, x2), canon), 1e-12),
        )
        cos = lw.ew("div", dot, lw.ew("sqrt", norms))
        pos = lw.ew("where", lw.ew("eq", y, 1.0), lw.ew("sub", 1.0, cos), 0.0)
        neg = lw.ew("where", lw.ew("eq", y, -1.0), lw.ew("clamp_min", lw.ew("sub", cos, margin), attrs=(0.0,)), 0.0)
        return reduce_loss(lw, lw.ew("add", pos, neg), reduction)
    x = lw.tensor(b["input"], canon)
    t = lw.tensor(b["target"], canon)
    if canon == "soft_margin_loss":
        z = lw.ew("neg", lw.ew("mul", t, x))
        soft = lw.ew("softplus", z, attrs=(1.0, 20.0))
        return reduce_loss(lw, lw.ew("where", lw.ew("gt", z, _EXP_OVERFLOW), math.inf, soft), reduction)
    if canon == "hinge_embedding_loss":
        margin = number(lw.arg(b.get("margin")), "hinge_embedding_loss's margin")
        below = lw.ew("where", lw.ew("ne", t, 1.0), lw.ew("clamp_min", lw.ew("sub", margin, x), attrs=(0.0,)), 0.0)
        return reduce_loss(lw, lw.ew("add", below, lw.ew("where", lw.ew("ne", t, -1.0), x, 0.0)), reduction)
    if canon == "poisson_nll_loss":
        if lw.arg(b.get("full")):
            raise UnsupportedGraph("poisson_nll_loss with full=True (its Stirling term) is not covered", op=canon)
        if lw.arg(b.get("log_input")):
            loss = lw.ew("sub", lw.ew("exp", x), lw.ew("mul", t, x))
        else:
            eps = number(lw.arg(b.get("eps")), "poisson_nll_loss's eps")
            loss = lw.ew("sub", x, lw.ew("mul", t, lw.ew("log", lw.ew("add", x, eps))))
        return reduce_loss(lw, loss, reduction)
    # multilabel_soft_margin_loss
    terms = lw.ew(
        "add",
        lw.ew("mul", t, lw.ew("logsigmoid", x)),
        lw.ew("mul", lw.ew("sub", 1.0, t), lw.ew("logsigmoid", lw.ew("neg", x))),
    )
    loss = lw.ew("neg", terms)
    weight = param_or_arg(lw, b, "weight")
    if weight is not None:
        loss = lw.ew("mul", loss, weight)
    classes = lw.shape(x)[-1] if lw.shape(x) else 1
    return reduce_loss(lw, lw.ew("div", _sum_last(lw, loss, canon), float(classes)), reduction)
