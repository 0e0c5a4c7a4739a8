"""``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` lowered onto the templates' own parts.

A layer is self-attention (``families/mha.py``: the input projection as one product, flash-style
attention, the output projection), a feed-forward block (two products with the activation between
them) and two layer norms with their residual additions, in PyTorch's order: post-norm
``norm1(x + attn(x))`` then ``norm2(x + ff(x))``, or pre-norm ``x + attn(norm1(x))`` then
``x + ff(norm2(x))`` when ``norm_first``. An encoder is its layers in turn and its final norm if it
has one. The elementwise parts (bias, activation, residual) fuse into the kernels around them as
anywhere else; nothing of PyTorch's fused fast path (``torch._transformer_encoder_layer_fwd``) is
used, which computes the same function.

Declined, with the reason: masks of any kind (``src_mask``, ``src_key_padding_mask``, ``mask``),
``is_causal``, dropout with ``p > 0`` in training mode (random), and activations other than ReLU
and GELU (as a function or a module).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from actors.experts.template.composites import apply
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.mha import lower_mha
from actors.experts.template.ir import NodeRef, TupleRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import MODULES, REQUIRED, Spec, bind

MODULES[nn.TransformerEncoderLayer] = Spec(
    "encoder_layer", (("src", REQUIRED), ("src_mask", None), ("src_key_padding_mask", None), ("is_causal", False))
)
MODULES[nn.TransformerEncoder] = Spec(
    "encoder", (("src", REQUIRED), ("mask", None), ("src_key_padding_mask", None), ("is_causal", None))
)


def _no_masks(b: dict[str, Any], what: str) -> None:
    for name in ("src_mask", "mask", "src_key_padding_mask"):
        if b.get(name) is not None:
            raise UnsupportedGraph(f"{what} with a {name} is not covered", op=what)
    if b.get("is_causal"):
        raise UnsupportedGraph(f"{what} with is_causal is not covered", op=what)


def _dropout(module: nn.Module, path: str) -> None:
    """A dropout that is the identity (``p == 0`` or eval mode); a random one declines."""
    p = float(getattr(module, "p", 0.0))
    if p > 0.0 and module.training:
        raise UnsupportedGraph(
            f"dropout {path} with p={p} in training mode is random; not covered", op="TransformerEncoderLayer"
        )


def _activation(lw: LowerContext, layer: nn.TransformerEncoderLayer, path: str, x: NodeRef) -> NodeRef:
    act: Any = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return lw.ew("relu", x)
    approximate = "none"
    if isinstance(act, nn.GELU):
        approximate = act.approximate
    elif act is not F.gelu:
        name = getattr(act, "__name__", type(act).__name__)
        raise UnsupportedGraph(
            f"TransformerEncoderLayer {path} with activation {name} (ReLU and GELU are covered)",
            op="TransformerEncoderLayer",
        )
    if approximate not in ("none", "tanh"):
        raise UnsupportedGraph(f"gelu(approximate={approximate!r}) is not covered")
    return lw.ew("gelu" if approximate == "none" else "gelu_tanh", x)


def _linear(lw: LowerContext, path: str, x: NodeRef) -> NodeRef:
    out = apply(lw, "linear", {"input": x, "__path__": path}, None)
    assert isinstance(out, NodeRef)
    return out


def _layer_norm(lw: LowerContext, norm: nn.Module, path: str, x: NodeRef) -> NodeRef:
    if not isinstance(norm, nn.LayerNorm):
        raise UnsupportedGraph(f"{path} is a {type(norm).__name__}, not a LayerNorm", op="TransformerEncoderLayer")
    bound = {"input": x, "normalized_shape": norm.normalized_shape, "eps": norm.eps, "__path__": path}
    out = apply(lw, "layer_norm", bound, None)
    assert isinstance(out, NodeRef)
    return out


def lower_encoder_layer(lw: LowerContext, path: str, x: NodeRef) -> NodeRef:
    """One ``TransformerEncoderLayer`` at ``path`` applied to ``x`` (no masks)."""
    layer = lw.traced.root.get_submodule(path)
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise UnsupportedGraph(f"{path} is a {type(layer).__name__}", op="TransformerEncoderLayer")
    for name in ("dropout", "dropout1", "dropout2"):
        _dropout(getattr(layer, name), f"{path}.{name}")

    def attention(h: NodeRef) -> NodeRef:
        mha_path = f"{path}.self_attn"
        mha = layer.self_attn
        bound = bind(MODULES[nn.MultiheadAttention], [h, h, h], {"need_weights": False}, mha)
        bound["__path__"] = mha_path
        out = lower_mha(lw, bound)
        first = out.items[0]
        assert isinstance(first, NodeRef)
        return first

    def feed_forward(h: NodeRef) -> NodeRef:
        hidden = _activation(lw, layer, path, _linear(lw, f"{path}.linear1", h))
        return _linear(lw, f"{path}.linear2", hidden)

    norm1, norm2 = f"{path}.norm1", f"{path}.norm2"
    if layer.norm_first:
        x = lw.ew("add", x, attention(_layer_norm(lw, layer.norm1, norm1, x)))
        return lw.ew("add", x, feed_forward(_layer_norm(lw, layer.norm2, norm2, x)))
    x = _layer_norm(lw, layer.norm1, norm1, lw.ew("add", x, attention(x)))
    return _layer_norm(lw, layer.norm2, norm2, lw.ew("add", x, feed_forward(x)))


@lowering("encoder_layer")
def _encoder_layer(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    _no_masks(b, "TransformerEncoderLayer")
    return lower_encoder_layer(lw, str(b["__path__"]), lw.tensor(b["src"], "a TransformerEncoderLayer input"))


@lowering("encoder")
def _encoder(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef | TupleRef:
    _no_masks(b, "TransformerEncoder")
    path = str(b["__path__"])
    encoder = lw.traced.root.get_submodule(path)
    if not isinstance(encoder, nn.TransformerEncoder):
        raise UnsupportedGraph(f"{path} is a {type(encoder).__name__}", op="TransformerEncoder")
    x = lw.tensor(b["src"], "a TransformerEncoder input")
    for i in range(len(encoder.layers)):
        x = lower_encoder_layer(lw, f"{path}.layers.{i}", x)
    if isinstance(encoder.norm, nn.Module):
        x = _layer_norm(lw, encoder.norm, f"{path}.norm", x)
    return x
