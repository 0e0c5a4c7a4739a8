"""Products with an added term: ``torch.addmm`` / ``Tensor.addmm`` and ``torch.baddbmm`` /
``Tensor.baddbmm``: ``beta * input + alpha * (a @ b)``.

The product is the products family's (``products.product``: an ``MM`` node, batched for
``baddbmm``); the scaling by ``alpha``, the added ``input`` (broadcast as PyTorch broadcasts it)
and its ``beta`` are elementwise ops that fuse into the product's epilogue. With ``beta == 0``
the input is not read at all, as PyTorch ignores it then (NaN and inf in it included).

Declined, with the reason: ``alpha`` or ``beta`` that are not numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.products import product
from actors.experts.template.spellings import REQUIRED, Spec, spell

for _name, _a, _b in (("addmm", "mat1", "mat2"), ("baddbmm", "batch1", "batch2")):
    spell(
        Spec(_name, (("input", REQUIRED), (_a, REQUIRED), (_b, REQUIRED), ("beta", 1), ("alpha", 1))),
        functions=(getattr(torch, _name),),
        methods=(_name,),
    )


def _number(lw: LowerContext, value: object, what: str, op: str) -> float:
    value = lw.arg(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnsupportedGraph(f"{op} with {what}={value!r} is not covered (a number)", op=op)
    return float(value)


@lowering("addmm", "baddbmm")
def _addmm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    first, second = ("mat1", "mat2") if canon == "addmm" else ("batch1", "batch2")
    a = lw.tensor(b[first], f"the {first} of {canon}")
    w = lw.tensor(b[second], f"the {second} of {canon}")
    beta, alpha = _number(lw, b["beta"], "beta", canon), _number(lw, b["alpha"], "alpha", canon)
    out = product(lw, a, w)
    if alpha != 1.0:
        out = lw.ew("mul", out, alpha)
    if beta == 0.0:
        return out
    added = lw.tensor(b["input"], f"the input of {canon}")
    return lw.ew("add", out, added if beta == 1.0 else lw.ew("mul", added, beta))
