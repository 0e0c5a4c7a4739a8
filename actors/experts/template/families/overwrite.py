"""Whole overwrites: ``dst.copy_(src)``.

The op's result, which later reads of ``dst`` see (the lowerer's in-place machinery; for a plain
tensor attribute ``tensor_attrs.py``), is ``src`` as ``dst``'s shape: ``src`` itself, or a view of
it where the shapes differ only by leading dims of one. Declined, with the reason: a source of
another dtype (a conversion) and a source broadcast along a dim of more than one (no node of the
plan repeats a tensor without computing on it).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import METHODS, REQUIRED, Spec

METHODS["copy_"] = Spec("copy", (("input", REQUIRED), ("src", REQUIRED), ("non_blocking", False)), inplace=True)


@lowering("copy")
def _copy(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    if not isinstance(traced, torch.Tensor):
        raise UnsupportedGraph("copy_ into something that is not a tensor is not covered")
    src = lw.tensor(b["src"], "the source of copy_")
    shape, dtype = tuple(traced.shape), str(traced.dtype).removeprefix("torch.")
    if lw.node(src).dtype != dtype:
        raise UnsupportedGraph(
            f"copy_ of a {lw.node(src).dtype} tensor into a {dtype} one (a conversion) is not covered"
        )
    have = lw.shape(src)
    if have == shape:
        return src
    if math.prod(have) == math.prod(shape) and _trimmed(have) == _trimmed(shape) and len(have) <= len(shape):
        return lw.view(src, shape)
    raise UnsupportedGraph(f"copy_ of shape {have} into shape {shape} (a broadcast) is not covered")


def _trimmed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its leading dims of one."""
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]
