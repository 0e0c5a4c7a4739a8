"""Local response normalisation: ``nn.LocalResponseNorm(size, alpha, beta, k)`` and
``F.local_response_norm``, over the channels (dim 1) of a tensor of three dims or more:

    out = x / (k + alpha / size * sum of x² over the channel window) ** beta

The window of channel ``c`` is ``c - size // 2`` to ``c + (size - 1) // 2``, zeros outside the
channels (PyTorch pads and averages with ``size`` as the divisor at every channel). Lowered as
the squares padded along the channels (a ``pad`` gather, ``families/pad.py``), ``size`` slices of
them summed (``families/slicing.py``), and the rest elementwise: ``** beta`` as ``torch.pow``
lowers it (``composites.power``). The slices and the
division read in place in one elementwise kernel after the padded squares.

Declined, with the reason: fewer than three dims, a size below 1, and arguments that are not
numbers.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import power
from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.families.pad import padded
from actors.experts.template.families.slicing import part
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

spell(
    Spec(
        "local_response_norm",
        (("input", REQUIRED), ("size", REQUIRED), ("alpha", 1e-4), ("beta", 0.75), ("k", 1.0)),
    ),
    functions=(F.local_response_norm,),
)
MODULES[nn.LocalResponseNorm] = Spec(
    "local_response_norm",
    (("input", REQUIRED),),
    module_attrs=(("size", "size"), ("alpha", "alpha"), ("beta", "beta"), ("k", "k")),
)


@lowering("local_response_norm")
def _local_response_norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of local_response_norm")
    shape = lw.shape(x)
    if len(shape) < 3:
        raise UnsupportedGraph(
            f"local_response_norm of a {len(shape)}-dim tensor is not valid (3 dims or more)", op=canon
        )
    size = lw.arg(b.get("size"))
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise UnsupportedGraph(f"local_response_norm with size {size!r} is not covered (an int >= 1)", op=canon)
    alpha, beta, k = (number(lw.arg(b.get(name)), f"local_response_norm's {name}") for name in ("alpha", "beta", "k"))
    channels = shape[1]
    squares = lw.ew("mul", x, x)
    window = padded(lw, squares, [0, 0] * (len(shape) - 2) + [size // 2, (size - 1) // 2])
    total = part(lw, window, 1, 0, channels)
    for j in range(1, size):
        total = lw.ew("add", total, part(lw, window, 1, j, channels))
    base = lw.ew("add", lw.ew("mul", total, alpha / size), k)
    return lw.ew("div", x, power(lw, base, beta))
