"""``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer`` and
``nn.TransformerDecoder`` (and ``nn.Transformer``, an encoder then a decoder over its memory) lowered
onto the templates' own parts.

A layer is self-attention (``families/mha.py``: the input projection as one product, flash-style
attention, the output projection), a feed-forward block (two products with the activation between
them) and two layer norms with their residual additions, in PyTorch's order: post-norm
``norm1(x + attn(x))`` then ``norm2(x + ff(x))``, or pre-norm ``x + attn(norm1(x))`` then
``x + ff(norm2(x))`` when ``norm_first``. An encoder is its layers in turn and its final norm if it
has one. A decoder layer adds attention over the memory between the two (``norm2``; the
feed-forward block's norm is ``norm3``), and a decoder is its layers, each over the same memory.
The elementwise parts (bias, activation, residual) fuse into the kernels around them as anywhere
else; nothing of PyTorch's fused fast path (``torch._transformer_encoder_layer_fwd``) is used,
which computes the same function.

Masks (``src_mask``/``mask``, ``src_key_padding_mask``; a decoder's ``tgt_*`` and ``memory_*``
ones) reach each layer's attention as ``MultiheadAttention``'s own (``families/mha.py``).

Declined, with the reason: ``is_causal`` (``tgt_is_causal``, ``memory_is_causal``) without its
mask, a key padding mask on the encoder's nested-tensor path (``enable_nested_tensor``: PyTorch
zeroes the padded positions there), dropout with ``p > 0`` in training mode (random), and
activations other than ReLU and GELU (as a function or a module).
"""

from __future__ import annotations

from collections.abc import Callable
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
_DECODER_CALL = (
    ("tgt", REQUIRED),
    ("memory", REQUIRED),
    ("tgt_mask", None),
    ("memory_mask", None),
    ("tgt_key_padding_mask", None),
    ("memory_key_padding_mask", None),
)
MODULES[nn.TransformerDecoderLayer] = Spec(
    "decoder_layer", (*_DECODER_CALL, ("tgt_is_causal", False), ("memory_is_causal", False))
)
MODULES[nn.TransformerDecoder] = Spec("decoder", (*_DECODER_CALL, ("tgt_is_causal", None), ("memory_is_causal", False)))
MODULES[nn.Transformer] = Spec(
    "transformer",
    (
        ("src", REQUIRED),
        ("tgt", REQUIRED),
        ("src_mask", None),
        ("tgt_mask", None),
        ("memory_mask", None),
        ("src_key_padding_mask", None),
        ("tgt_key_padding_mask", None),
        ("memory_key_padding_mask", None),
        ("src_is_causal", None),
        ("tgt_is_causal", None),
        ("memory_is_causal", False),
    ),
)


def _masks(b: dict[str, Any], what: str, mask: str) -> tuple[object, object]:
    """The call's attention mask and key padding mask (``None`` where absent); ``is_causal``
    alone (no mask to apply) declines."""
    attn_mask, padding = b.get(mask), b.get("src_key_padding_mask")
    if b.get("is_causal") and attn_mask is None:
        raise UnsupportedGraph(f"{what} with is_causal and no {mask} is not covered", op=what)
    return attn_mask, padding


def _dropout(module: nn.Module, path: str) -> None:
    """A dropout that is the identity (``p == 0`` or eval mode); a random one declines."""
    p = float(getattr(module, "p", 0.0))
    if p > 0.0 and module.training:
        raise UnsupportedGraph(
            f"dropout {path} with p={p} in training mode is random; not covered", op="TransformerEncoderLayer"
        )


def _activation(lw: LowerContext, layer: nn.Module, path: str, x: NodeRef) -> NodeRef:
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


def lower_encoder_layer(
    lw: LowerContext, path: str, x: NodeRef, attn_mask: object = None, padding: object = None
) -> NodeRef:
    """One ``TransformerEncoderLayer`` at ``path`` applied to ``x``, its self-attention masked by
    ``attn_mask`` and ``padding`` (the key padding mask) where given, as ``MultiheadAttention``
    masks them."""
    layer = lw.traced.root.get_submodule(path)
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise UnsupportedGraph(f"{path} is a {type(layer).__name__}", op="TransformerEncoderLayer")
    for name in ("dropout", "dropout1", "dropout2"):
        _dropout(getattr(layer, name), f"{path}.{name}")

    blocks = (
        lambda h: _attention(lw, f"{path}.self_attn", h, h, attn_mask, padding),
        lambda h: _feed_forward(lw, layer, path, h),
    )
    return _residuals(lw, layer, path, x, blocks)


def _attention(lw: LowerContext, path: str, h: NodeRef, kv: NodeRef, attn_mask: object, padding: object) -> NodeRef:
    """The ``MultiheadAttention`` at ``path`` of queries ``h`` over keys and values ``kv``."""
    mha = lw.traced.root.get_submodule(path)
    kwargs = {"need_weights": False, "attn_mask": attn_mask, "key_padding_mask": padding}
    bound = bind(MODULES[nn.MultiheadAttention], [h, kv, kv], kwargs, mha)
    bound["__path__"] = path
    first = lower_mha(lw, bound).items[0]
    assert isinstance(first, NodeRef)
    return first


def _feed_forward(lw: LowerContext, layer: nn.Module, path: str, h: NodeRef) -> NodeRef:
    hidden = _activation(lw, layer, path, _linear(lw, f"{path}.linear1", h))
    return _linear(lw, f"{path}.linear2", hidden)


def _residuals(
    lw: LowerContext, layer: nn.Module, path: str, x: NodeRef, blocks: tuple[Callable[[NodeRef], NodeRef], ...]
) -> NodeRef:
    """``x`` through ``blocks`` in turn, each with its residual and its norm (``norm1``, ``norm2``,
    ...): ``x + block(norm(x))`` when the layer's ``norm_first``, else ``norm(x + block(x))``."""
    for i, block in enumerate(blocks, start=1):
        norm_path = f"{path}.norm{i}"
        norm = getattr(layer, f"norm{i}")
        if layer.norm_first:
            x = lw.ew("add", x, block(_layer_norm(lw, norm, norm_path, x)))
        else:
            x = _layer_norm(lw, norm, norm_path, lw.ew("add", x, block(x)))
    return x


def lower_decoder_layer(lw: LowerContext, path: str, x: NodeRef, memory: NodeRef, masks: tuple[object, ...]) -> NodeRef:
    """One ``TransformerDecoderLayer`` at ``path``: self-attention of ``x`` (``masks[0]``, the
    target mask, and ``masks[1]``, its key padding mask), attention over ``memory`` (``masks[2]``
    and ``masks[3]``), the feed-forward block; each with its residual and norm."""
    layer = lw.traced.root.get_submodule(path)
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise UnsupportedGraph(f"{path} is a {type(layer).__name__}", op="TransformerDecoderLayer")
    for name in ("dropout", "dropout1", "dropout2", "dropout3"):
        _dropout(getattr(layer, name), f"{path}.{name}")
    tgt_mask, tgt_padding, memory_mask, memory_padding = masks
    blocks = (
        lambda h: _attention(lw, f"{path}.self_attn", h, h, tgt_mask, tgt_padding),
        lambda h: _attention(lw, f"{path}.multihead_attn", h, memory, memory_mask, memory_padding),
        lambda h: _feed_forward(lw, layer, path, h),
    )
    return _residuals(lw, layer, path, x, blocks)


def _decoder_masks(b: dict[str, Any], what: str) -> tuple[object, ...]:
    """The target and memory masks and key padding masks of a decoder call; an ``is_causal`` hint
    without its mask declines (PyTorch's attention refuses it)."""
    for flag, mask in (("tgt_is_causal", "tgt_mask"), ("memory_is_causal", "memory_mask")):
        if b.get(flag) and b.get(mask) is None:
            raise UnsupportedGraph(f"{what} with {flag} and no {mask} is not covered", op=what)
    return tuple(b.get(n) for n in ("tgt_mask", "tgt_key_padding_mask", "memory_mask", "memory_key_padding_mask"))


@lowering("decoder_layer", "decoder")
def _decoder(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    what = "TransformerDecoderLayer" if canon == "decoder_layer" else "TransformerDecoder"
    masks = _decoder_masks(b, what)
    x = lw.tensor(b["tgt"], f"a {what} target")
    memory = lw.tensor(b["memory"], f"a {what} memory")
    lower = lower_decoder_layer if canon == "decoder_layer" else lower_decoder
    return lower(lw, str(b["__path__"]), x, memory, masks)


def lower_decoder(lw: LowerContext, path: str, x: NodeRef, memory: NodeRef, masks: tuple[object, ...]) -> NodeRef:
    """The ``TransformerDecoder`` at ``path`` over ``memory``: its layers in turn, then its norm."""
    decoder = lw.traced.root.get_submodule(path)
    if not isinstance(decoder, nn.TransformerDecoder):
        raise UnsupportedGraph(f"{path} is a {type(decoder).__name__}", op="TransformerDecoder")
    for i in range(len(decoder.layers)):
        x = lower_decoder_layer(lw, f"{path}.layers.{i}", x, memory, masks)
    if isinstance(decoder.norm, nn.Module):
        x = _layer_norm(lw, decoder.norm, f"{path}.norm", x)
    return x


@lowering("encoder_layer")
def _encoder_layer(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    attn_mask, padding = _masks(b, "TransformerEncoderLayer", "src_mask")
    x = lw.tensor(b["src"], "a TransformerEncoderLayer input")
    return lower_encoder_layer(lw, str(b["__path__"]), x, attn_mask, padding)


@lowering("encoder")
def _encoder(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef | TupleRef:
    attn_mask, padding = _masks(b, "TransformerEncoder", "mask")
    x = lw.tensor(b["src"], "a TransformerEncoder input")
    return lower_encoder(lw, str(b["__path__"]), x, attn_mask, padding)


def lower_encoder(lw: LowerContext, path: str, x: NodeRef, attn_mask: object, padding: object) -> NodeRef:
    """The ``TransformerEncoder`` at ``path``: its layers in turn, each with the masks, then its norm."""
    encoder = lw.traced.root.get_submodule(path)
    if not isinstance(encoder, nn.TransformerEncoder):
        raise UnsupportedGraph(f"{path} is a {type(encoder).__name__}", op="TransformerEncoder")
    if padding is not None and attn_mask is None and getattr(encoder, "use_nested_tensor", False):
        raise UnsupportedGraph(
            "TransformerEncoder with a src_key_padding_mask on PyTorch's nested-tensor path is not covered"
            " (it zeroes the padded positions; enable_nested_tensor=False computes them)",
            op="TransformerEncoder",
        )
    for i in range(len(encoder.layers)):
        x = lower_encoder_layer(lw, f"{path}.layers.{i}", x, attn_mask, padding)
    if isinstance(encoder.norm, nn.Module):
        x = _layer_norm(lw, encoder.norm, f"{path}.norm", x)
    return x


@lowering("transformer")
def _transformer(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``nn.Transformer``: its encoder over ``src`` (``src_mask``, ``src_key_padding_mask``), then its
    decoder over ``tgt`` and that memory, as the module's forward does."""
    path = str(b["__path__"])
    model = lw.traced.root.get_submodule(path)
    if not isinstance(model, nn.Transformer):
        raise UnsupportedGraph(f"{path} is a {type(model).__name__}", op="Transformer")
    if b.get("src_is_causal") and b.get("src_mask") is None:
        raise UnsupportedGraph("Transformer with src_is_causal and no src_mask is not covered", op="Transformer")
    src = lw.tensor(b["src"], "a Transformer source")
    tgt = lw.tensor(b["tgt"], "a Transformer target")
    padding = b.get("src_key_padding_mask")
    memory = lower_encoder(lw, f"{path}.encoder", src, b.get("src_mask"), padding)
    return lower_decoder(lw, f"{path}.decoder", tgt, memory, _decoder_masks(b, "Transformer"))
