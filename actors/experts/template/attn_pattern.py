"""The explicit attention pattern in a traced graph: ``softmax(Q @ K^T * scale [masked causally]) @ V``.

Matched at the final product's FX node, walking its operands back: a softmax over the last
dimension, optionally of a ``masked_fill(mask, -inf)`` whose mask is the causal one (a buffer
registered as ``torch.tril(torch.ones(...))``, sliced ``[..., :L, :L]`` and compared ``== 0``),
optionally of a product or quotient by a number, of ``Q @ K.transpose(-2, -1)``. A match becomes
one flash-style ``ATTN`` node; the intermediate score matrix is never materialised (its nodes
are left dead). Anything else returns ``None`` and the ops lower one by one as before.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any

import torch
from torch import fx

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lower_fn
from schemas.task import parse_module

_TRIL = re.compile(r"^torch\.tril\(torch\.ones\([^()]*\)\)(\.view\([^()]*\)|\.reshape\([^()]*\))?$")


def _canon(lw: LowerContext, node: Any) -> tuple[str, dict[str, Any]] | None:
    """The canonical op of an FX call node with its bound arguments (FX nodes, not lowered), or ``None``."""
    from actors.experts.template.spellings import bind, resolve

    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method", "call_module"):
        return None
    module = lw.traced.root.get_submodule(str(node.target)) if node.op == "call_module" else None
    spec = resolve(node, module)
    if spec is None:
        return None
    try:
        bound = bind(spec, list(node.args), dict(node.kwargs), module)
    except UnsupportedGraph:
        return None
    return spec.canon, bound


def _shape(lw: LowerContext, node: Any) -> tuple[int, ...]:
    """The traced shape of an FX node's tensor value (empty when it is not a tensor)."""
    value = lw.traced.values.get(node) if isinstance(node, fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


def _tril_buffers(source: str | None) -> set[str]:
    """Names of buffers ``Model.__init__`` registers as ``torch.tril(torch.ones(...))`` (a causal mask)."""
    if source is None:
        return set()
    names: set[str] = set()
    for node in ast.walk(parse_module(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_buffer"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _TRIL.match(ast.unparse(node.args[1]).replace("torch.nn.", "torch."))
        ):
            names.add(node.args[0].value)
    return names


def _causal_mask(lw: LowerContext, mask: Any, lq: int, lk: int) -> bool:
    """Whether ``mask`` is ``<tril buffer>[..., :lq, :lk] == 0`` with ``lq == lk``."""
    if not isinstance(mask, fx.Node) or mask.target is not operator.eq or mask.args[1] != 0 or lq != lk:
        return False
    sliced = mask.args[0]
    if not isinstance(sliced, fx.Node) or sliced.target is not operator.getitem:
        return False
    buffer, index = sliced.args
    if not isinstance(buffer, fx.Node) or buffer.op != "get_attr":
        return False
    if str(buffer.target) not in _tril_buffers(lw.traced.source):
        return False
    if not isinstance(index, tuple) or len(index) < 2:
        return False
    tail = index[-2:]
    return all(isinstance(s, slice) and s.start in (None, 0) and s.step in (None, 1) for s in tail) and all(
        isinstance(s, slice) for s in index[:-2]
    )


def explicit_attention(lw: LowerContext, fxn: fx.Node) -> NodeRef | None:
    """One ``ATTN`` node when ``fxn`` (a matrix product) closes the explicit attention pattern."""
    if len(fxn.args) != 2 or fxn.kwargs:
        return None
    probs, v = fxn.args
    dropout = _canon(lw, probs)
    while dropout is not None and dropout[0] == "dropout" and isinstance(probs, fx.Node):
        if dropout[1].get("p") not in (0, 0.0) and dropout[1].get("training") is not False:
            return None  # a random dropout between softmax and product: not attention as SDPA computes it
        probs = probs.args[0] if probs.args else probs.kwargs.get("input")
        dropout = _canon(lw, probs)
    soft = dropout
    if soft is None or soft[0] != "softmax" or soft[1].get("dtype") is not None:
        return None
    node: Any = soft[1]["input"]
    shape = _shape(lw, node)
    rank = len(shape)
    if rank < 2 or int(soft[1]["dim"]) % rank != rank - 1:
        return None
    causal = False
    if isinstance(node, fx.Node) and node.op == "call_method" and node.target == "masked_fill":
        value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
        if not (isinstance(value, float) and math.isinf(value) and value < 0):
            return None
        if not _causal_mask(lw, node.args[1] if len(node.args) > 1 else node.kwargs.get("mask"), *shape[-2:]):
            return None
        causal, node = True, node.args[0]
    scale = 1.0
    scaled = _canon(lw, node)
    if scaled is not None and scaled[0] in ("mul", "div"):
        a, b = scaled[1]["input"], scaled[1]["other"]
        number = b if isinstance(b, int | float) and not isinstance(b, bool) else None
        if scaled[0] == "mul" and number is None and isinstance(a, int | float) and not isinstance(a, bool):
            number, b = a, None
            node = node.args[1]
        elif number is not None:
            node = node.args[0]
        if number is None or (scaled[0] == "div" and (number == 0 or b is None)):
            return None
        scale = float(number) if scaled[0] == "mul" else 1.0 / float(number)
    product = _canon(lw, node)
    if product is None or product[0] != "matmul":
        return None
    q, kt = node.args[0], node.args[1]
    perm = _canon(lw, kt)
    if perm is None or perm[0] != "perm" or not isinstance(kt, fx.Node):
        return None
    k = kt.args[0]
    ranks = len(_shape(lw, k))
    swap = {int(perm[1]["dim0"]) % max(ranks, 1), int(perm[1]["dim1"]) % max(ranks, 1)}
    if ranks < 2 or swap != {ranks - 2, ranks - 1}:
        return None
    if not (isinstance(q, fx.Node) and isinstance(k, fx.Node) and isinstance(v, fx.Node)):
        return None
    values = {"query": lw.env.get(q), "key": lw.env.get(k), "value": lw.env.get(v)}
    if not all(isinstance(t, NodeRef) for t in values.values()):
        return None
    sdpa = lower_fn("sdpa")  # the attention family's lowering, as ``F.scaled_dot_product_attention``
    if sdpa is None:
        return None
    try:
        out = sdpa(lw, "sdpa", {**values, "scale": scale, "is_causal": causal}, None)
    except UnsupportedGraph:
        return None
    return out if isinstance(out, NodeRef) else None
