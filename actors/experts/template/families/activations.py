"""Activations beside the elementwise core's: ``nn.CELU`` / ``F.celu`` (``alpha * elu(x / alpha)``)
``nn.Threshold`` / ``F.threshold`` (``x`` where it is above the threshold, else the value),
``nn.RReLU`` / ``F.rrelu`` outside training (a leaky ReLU whose slope is the mean of ``lower`` and
``upper``, as PyTorch computes it then), each an elementwise op that fuses like any other, and
``nn.Softmin`` / ``F.softmin`` (the softmax of ``-x``, ``families/norm.py``).

Declined, with the reason: a CELU ``alpha`` of 0, RReLU in training mode (its slopes are drawn at
random on every call: no two runs agree), arguments that are not numbers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lower_fn, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

spell(Spec("celu", (("input", REQUIRED), ("alpha", 1.0), ("inplace", False))), functions=(F.celu, torch.celu))
MODULES[nn.CELU] = Spec("celu", (("input", REQUIRED),), module_attrs=(("alpha", "alpha"),))
_THRESHOLD = (("input", REQUIRED), ("threshold", REQUIRED), ("value", REQUIRED), ("inplace", False))
spell(Spec("threshold", _THRESHOLD), functions=(F.threshold, torch.threshold))
spell(
    Spec("softmin", (("input", REQUIRED), ("dim", None), ("_stacklevel", 3), ("dtype", None))), functions=(F.softmin,)
)
MODULES[nn.Softmin] = Spec("softmin", (("input", REQUIRED),), module_attrs=(("dim", "dim"),))
spell(
    Spec(
        "rrelu", (("input", REQUIRED), ("lower", 1.0 / 8), ("upper", 1.0 / 3), ("training", False), ("inplace", False))
    ),
    functions=(F.rrelu, torch.rrelu),
)
MODULES[nn.RReLU] = Spec(
    "rrelu", (("input", REQUIRED),), module_attrs=(("lower", "lower"), ("upper", "upper"), ("training", "training"))
)
MODULES[nn.Threshold] = Spec(
    "threshold", (("input", REQUIRED),), module_attrs=(("threshold", "threshold"), ("value", "value"))
)


@lowering("celu")
def _celu(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of celu")
    alpha = number(lw.arg(b.get("alpha")), "celu's alpha")
    if alpha == 0:
        raise UnsupportedGraph("celu with alpha 0 is not valid", op=canon)
    return lw.ew("mul", lw.ew("elu", lw.ew("mul", x, 1.0 / alpha), attrs=(1.0,)), alpha)


@lowering("threshold")
def _threshold(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of threshold")
    limit = number(lw.arg(b.get("threshold")), "threshold's threshold")
    value = number(lw.arg(b.get("value")), "threshold's value")
    return lw.ew("where", lw.ew("gt", x, limit), x, value)


@lowering("rrelu")
def _rrelu(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of rrelu")
    if lw.arg(b.get("training")):
        raise UnsupportedGraph(
            "rrelu in training mode draws a random slope per element on every call (the reference's own "
            "outputs differ from run to run); covered after .eval(), where the slope is (lower + upper) / 2",
            op=canon,
        )
    lower = number(lw.arg(b.get("lower")), "rrelu's lower")
    upper = number(lw.arg(b.get("upper")), "rrelu's upper")
    return lw.ew("leaky_relu", x, attrs=((lower + upper) / 2,))


@lowering("softmin")
def _softmin(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    softmax = lower_fn("softmax")
    assert softmax is not None
    x = lw.tensor(b.get("input"), "the input of softmin")
    return softmax(lw, "softmax", {**b, "input": lw.ew("neg", x)}, traced)
