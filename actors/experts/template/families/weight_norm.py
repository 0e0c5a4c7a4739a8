"""Weight normalisation: ``torch.nn.utils.parametrizations.weight_norm(module)``, whose weight
PyTorch computes in every forward as
``torch._weight_norm(v, g, dim)``: ``v * (g / ||v||)``, the L2 norm over every dim but ``dim``
(over all of ``v`` where ``dim`` is -1). The tracer traces parametrized modules through
(``trace.py``), so the graph reads ``v`` and ``g`` as parameters, computes the weight with these
elementwise ops and a reduction, and hands it to the module's own op (a convolution, a linear
layer) like any computed operand. ``ModelNew`` keeps the parametrization: its state has the same
``parametrizations.weight.original0/1`` as the reference's.

The deprecated ``torch.nn.utils.weight_norm`` sets a plain ``weight`` attribute from ``weight_v``
and ``weight_g`` in a forward pre-hook: the lowerer computes a read of that attribute the same way
(``lower.py``, ``_hooked_weight_norm``).

Declined, with the reason: a ``dim`` whose other dims are not contiguous (a middle dim of a
weight of three dims or more).
"""

from __future__ import annotations

from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

spell(Spec("weight_norm", (("v", REQUIRED), ("g", REQUIRED), ("dim", 0))), functions=(torch._weight_norm,))


@lowering("weight_norm")
def _weight_norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    v = lw.tensor(b.get("v"), "the direction of weight_norm")
    g = lw.tensor(b.get("g"), "the magnitude of weight_norm")
    shape = lw.shape(v)
    rank = len(shape)
    dim = lw.arg(b.get("dim"))
    if not isinstance(dim, int) or isinstance(dim, bool) or not -1 <= dim < max(rank, 1):
        raise UnsupportedGraph(f"weight_norm along dim {dim!r} of a {rank}-dim weight is not covered", op=canon)
    if dim == -1 or rank == 1:
        dims = (0, rank)
    elif dim == 0:
        dims = (1, rank)
    elif dim == rank - 1:
        dims = (0, rank - 1)
    else:
        raise UnsupportedGraph(
            f"weight_norm along dim {dim} of a {rank}-dim weight is not covered (the first or last dim)", op=canon
        )
    squares = lw.ew("mul", v, v)
    norm = lw.ew("sqrt", lw.red("sum", squares, dims, True, split_rows=False))
    return lw.ew("mul", v, lw.ew("div", g, norm))
