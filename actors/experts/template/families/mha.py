"""``nn.MultiheadAttention`` lowered onto the templates' own parts.

The module's forward is an input projection (one ``(3E, E)`` weight), attention per head and an
output projection. Lowered: the projection is a matrix product with its bias added (one product
for self-attention, where query, key and value are the same tensor; a product per operand with
the weight's rows sliced otherwise), the heads are split out and merged back by PyTorch view and
copy ops (data movement only, admitted under every run policy), attention is the flash-style
``ATTN`` node and the output projection another product. The averaged attention weights the
module also returns are not computed: a forward that reads them declines.

An ``attn_mask`` ((L, S) or (N * heads, L, S)) and a ``key_padding_mask`` ((N, S)), bool (true:
the key is dropped) or float (added to the scores), make attention unfused
(``attention.masked_attention``): the scores as a product, the masks applied, a row softmax, the
product with the values.

Declined, with the reason: dropout in training, ``add_bias_kv``, ``add_zero_attn``, separate
key/value widths (``kdim``/``vdim``) and causal attention asked by ``is_causal`` without a mask
(PyTorch refuses it).
"""

from __future__ import annotations

import math
from typing import Any

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.attention import Mask, lower_sdpa, masked_attention
from actors.experts.template.ir import Absent, NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.products import product

_WEIGHTS = "the averaged attention weights that MultiheadAttention returns are not computed by the templates"


def _refuse(b: dict[str, Any]) -> str | None:
    """Why this call is not covered (``None``: it is)."""
    if b.get("dropout") and b.get("training"):
        return "MultiheadAttention with dropout in training mode is random; not covered"
    if b.get("bias_k") is not None or b.get("add_zero_attn"):
        return "MultiheadAttention with add_bias_kv or add_zero_attn is not covered"
    if not b.get("_qkv_same_embed_dim"):
        return "MultiheadAttention with kdim or vdim other than embed_dim is not covered"
    if b.get("is_causal") and b.get("attn_mask") is None:
        return "MultiheadAttention with is_causal and no mask is not covered"
    return None


def _masks(lw: LowerContext, b: dict[str, Any], n: int, h: int, length: int, keys: int) -> list[Mask]:
    """The call's ``attn_mask`` ((L, S), or (N * heads, L, S)) and ``key_padding_mask`` ((N, S)) as
    masks of the (N, heads, L, S) scores: bool ones drop the scores where they are true, float ones
    are added (PyTorch's rule for this module, the opposite of ``scaled_dot_product_attention``'s
    bool masks)."""
    masks: list[Mask] = []
    attn_mask, padding = b.get("attn_mask"), b.get("key_padding_mask")
    if attn_mask is not None:
        m = _mask_tensor(lw, attn_mask, "a MultiheadAttention attn_mask")
        shape = lw.shape(m)
        if shape == (n * h, length, keys):
            m = lw.view(lw.in_order(m), (n, h, length, keys))
        elif shape != (length, keys):
            raise UnsupportedGraph(f"a MultiheadAttention attn_mask of shape {shape} is not valid here")
        masks.append(Mask(m, masked_where=True))
    if padding is not None:
        m = _mask_tensor(lw, padding, "a key_padding_mask")
        if lw.shape(m) != (n, keys):
            raise UnsupportedGraph(f"a key_padding_mask of shape {lw.shape(m)} is not valid here (N, S)")
        masks.append(Mask(lw.view(lw.in_order(m), (n, 1, 1, keys)), masked_where=True))
    return masks


def _mask_tensor(lw: LowerContext, value: object, what: str) -> NodeRef:
    """A bool mask as it is, or a float one (``lw.tensor`` takes float tensors only)."""
    if isinstance(value, NodeRef) and lw.node(value).dtype == "bool":
        return value
    return lw.tensor(value, what)


def _layout(lw: LowerContext, src: NodeRef, shape: tuple[int, ...], expr: str) -> NodeRef:
    """A PyTorch data-movement op of ``src`` (``{0}`` in ``expr``), copied contiguous."""
    return lw.add(NodeKind.TORCH, shape, dtype="float32", args=(src.id,), path=expr)


def _project(lw: LowerContext, x: NodeRef, weight: NodeRef, bias: NodeRef | None) -> NodeRef:
    out = product(lw, x, lw.perm(weight))
    return lw.ew("add", out, bias) if bias is not None else out


@lowering("mha")
def _mha(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> TupleRef:
    return lower_mha(lw, b)


def lower_mha(lw: LowerContext, b: dict[str, Any]) -> TupleRef:
    """``(output, Absent weights)`` for a ``MultiheadAttention`` module call."""
    why = _refuse(b)
    if why is not None:
        raise UnsupportedGraph(why, op="MultiheadAttention")
    path = str(b["__path__"])
    module = lw.traced.root.get_submodule(path)
    q, k, v = (lw.tensor(b[n], "a MultiheadAttention operand") for n in ("query", "key", "value"))
    e, h = int(b["embed_dim"]), int(b["num_heads"])
    hd = e // h
    first = bool(b["batch_first"])
    shapes = [lw.shape(t) for t in (q, k, v)]
    if any(len(s) != 3 or s[-1] != e for s in shapes):
        raise UnsupportedGraph(f"MultiheadAttention of shapes {shapes} (batched 3-D inputs are covered)")
    if shapes[1] != shapes[2] or shapes[0][0 if first else 1] != shapes[1][0 if first else 1]:
        raise UnsupportedGraph(f"MultiheadAttention of shapes {shapes} does not match")
    weight = lw.param(f"{path}.in_proj_weight")
    bias = lw.param(f"{path}.in_proj_bias") if getattr(module, "in_proj_bias", None) is not None else None
    # (L, N, E) or (N, L, E) -> (N, H, L, hd): the heads as attention's batch dims.
    split = "({0}).permute(0, 2, 1, 3)" if first else "({0}).permute(1, 2, 0, 3)"

    def heads(src: NodeRef, parts: int, i: int) -> NodeRef:
        a, c = lw.shape(src)[:2]
        n, length = (a, c) if first else (c, a)
        picked = f"{{0}}.view({a}, {c}, {parts}, {h}, {hd})[:, :, {i}]"
        return _layout(lw, src, (n, h, length, hd), split.replace("{0}", picked))

    if q == k == v:  # self-attention: one projection, three head views of it
        qkv = _project(lw, q, weight, bias)
        hq, hk, hv = (heads(qkv, 3, i) for i in range(3))
    else:
        projected = []
        for i, x in enumerate((q, k, v)):
            w_i = _layout(lw, weight, (e, e), f"{{0}}[{i * e}:{(i + 1) * e}]")
            b_i = None if bias is None else _layout(lw, bias, (e,), f"{{0}}[{i * e}:{(i + 1) * e}]")
            projected.append(heads(_project(lw, x, w_i, b_i), 1, 0))
        hq, hk, hv = projected
    masks = _masks(lw, b, lw.shape(hq)[0], h, lw.shape(hq)[2], lw.shape(hk)[2])
    if masks:
        attn = masked_attention(lw, hq, hk, hv, 1.0 / math.sqrt(hd), masks)
    else:
        attn = lower_sdpa(lw, {"query": hq, "key": hk, "value": hv, "scale": None, "is_causal": False})
    n, _, length, _ = lw.shape(attn)
    merged_shape = (n, length, e) if first else (length, n, e)
    merge = "{0}.permute(0, 2, 1, 3)" if first else "{0}.permute(2, 0, 1, 3)"
    merged = _layout(lw, attn, merged_shape, f"{merge}.reshape{merged_shape!r}")
    out_w = lw.param(f"{path}.out_proj.weight")
    has_bias = getattr(getattr(module, "out_proj", None), "bias", None) is not None
    out_b = lw.param(f"{path}.out_proj.bias") if has_bias else None
    out = _project(lw, merged, out_w, out_b)
    weights = Absent(_WEIGHTS) if b.get("need_weights", True) else Absent("MultiheadAttention returned no weights")
    return TupleRef((out, weights))
