"""Lowering a convolution (``nn.ConvNd``, ``nn.ConvTransposeNd``, ``F.conv*``) into a ``CONV`` node.

The node carries the geometry (:class:`~actors.experts.template.ir.ConvSpec`); a bias becomes an
elementwise add of the bias viewed as ``(C_out, 1, ...)``, so it fuses into the kernel's epilogue
with whatever elementwise ops follow. Declined, with the reason: non-zero padding modes,
``padding="same"`` that PyTorch pads asymmetrically, unbatched inputs, and an explicit
``output_size``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.pad import padded
from actors.experts.template.ir import ConvSpec, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext, lowering, one_float_type


def int_tuple(value: object, nd: int, what: str) -> tuple[int, ...]:
    """An int-or-sequence geometry argument as ``nd`` ints, or decline naming it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * nd
    if isinstance(value, tuple | list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if len(value) == 1:
            return (int(value[0]),) * nd
        if len(value) == nd:
            return tuple(int(v) for v in value)
    raise UnsupportedGraph(f"convolution {what}={value!r} is not covered")


def _padding(value: object, nd: int, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    if value == "valid":
        return (0,) * nd
    if value == "same":
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        if any(t % 2 for t in totals):
            raise UnsupportedGraph("padding='same' with an odd total padding (asymmetric) is not covered")
        return tuple(t // 2 for t in totals)
    return int_tuple(value, nd, "padding")


def _weight_and_bias(lw: LowerContext, b: dict[str, Any]) -> tuple[NodeRef, NodeRef | None]:
    if "__path__" in b:
        module = lw.traced.root.get_submodule(b["__path__"])
        weight = lw.param(f"{b['__path__']}.weight")
        bias = lw.param(f"{b['__path__']}.bias") if getattr(module, "bias", None) is not None else None
        return weight, bias
    weight = lw.tensor(b["weight"], "convolution weight")
    bias = lw.tensor(b["bias"], "convolution bias") if b.get("bias") is not None else None
    return weight, bias


@lowering("conv", "conv_transpose")
def lower_conv(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """The nodes of one convolution; ``traced`` is its output on meta tensors."""
    transposed = canon == "conv_transpose"
    x = lw.tensor(b["input"], canon)
    weight, bias = _weight_and_bias(lw, b)
    xs, ws = lw.shape(x), lw.shape(weight)
    nd = len(ws) - 2
    if nd not in (1, 2, 3):
        raise UnsupportedGraph(f"a {nd}-dimensional convolution is not covered")
    if len(xs) != nd + 2:
        raise UnsupportedGraph(f"a convolution of an unbatched input of shape {xs} is not covered")
    mode = b.get("padding_mode", "zeros")
    if mode != "zeros":
        # PyTorch pads the input in that mode, then convolves without padding (``_ConvNd``).
        given = b.get("padding", 0)
        if transposed or mode not in ("reflect", "replicate", "circular") or isinstance(given, str):
            raise UnsupportedGraph(f"convolution padding_mode={mode!r} with padding={given!r} is not covered")
        amounts = int_tuple(given, nd, "padding")
        x = padded(lw, x, [a for p in reversed(amounts) for a in (p, p)], mode=mode)
        xs = lw.shape(x)
        b = {**b, "input": x, "padding": 0, "padding_mode": "zeros"}
    if b.get("output_size") is not None:
        raise UnsupportedGraph("a transposed convolution called with output_size is not covered")
    dtype = one_float_type(lw, [x, weight], "a convolution")
    if not isinstance(traced, torch.Tensor):
        raise UnsupportedGraph("a convolution whose output is not a tensor")
    groups = b.get("groups", 1)
    if not isinstance(groups, int) or groups < 1 or xs[1] % groups:
        raise UnsupportedGraph(f"convolution groups={groups!r} with {xs[1]} input channels")
    stride = int_tuple(b.get("stride", 1), nd, "stride")
    dilation = int_tuple(b.get("dilation", 1), nd, "dilation")
    padding = _padding(b.get("padding", 0), nd, ws[2:], dilation)
    if transposed and padding != int_tuple(b.get("padding", 0), nd, "padding"):
        raise UnsupportedGraph("a transposed convolution with string padding is not covered")
    cout = ws[1] * groups if transposed else ws[0]
    out = tuple(int(s) for s in traced.shape)
    if len(out) != nd + 2 or out[:2] != (xs[0], cout) or math.prod(out) == 0:
        raise UnsupportedGraph(f"a convolution from {xs} by {ws} to {out} is not covered")
    spec = ConvSpec(transposed, groups, stride, padding, dilation)
    ref = lw.add(NodeKind.CONV, out, args=(x.id, weight.id), attrs=spec.attrs(), dtype=dtype)
    if bias is None:
        return ref
    return lw.ew("add", ref, lw.view(bias, (cout, *([1] * nd))))
