"""``nn.PReLU`` / ``F.prelu``: ``x`` where it is positive, else ``weight * x``, with one learned slope
(``num_parameters=1``) or one per channel (dim 1 of the input, as PyTorch reads it).

An elementwise ``where`` over the input and the slope viewed to broadcast along the channels: it
fuses into the kernel before it (a convolution's epilogue) like any activation.

Declined, with the reason: a weight whose size is neither 1 nor the input's channels.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import param_or_arg
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, spell

spell(Spec("prelu", (("input", REQUIRED), ("weight", REQUIRED))), functions=(F.prelu,))
MODULES[nn.PReLU] = Spec("prelu", (("input", REQUIRED),))


@lowering("prelu")
def _prelu(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b.get("input"), "the input of prelu")
    weight = param_or_arg(lw, b, "weight")
    if weight is None:
        raise UnsupportedGraph("prelu without a weight is not covered", op=canon)
    shape, slopes = lw.shape(x), lw.shape(weight)
    count = slopes[0] if len(slopes) == 1 else -1
    if count == 1:
        slope = lw.view(weight, ())
    elif len(shape) >= 2 and count == shape[1]:
        slope = lw.view(weight, (count, *(1,) * (len(shape) - 2)))
    else:
        raise UnsupportedGraph(
            f"prelu with a weight of shape {slopes} for an input of {shape} is not covered", op=canon
        )
    return lw.ew("where", lw.ew("gt", x, 0.0), x, lw.ew("mul", x, slope))
