"""Lowering pooling (``nn.MaxPoolNd``, ``nn.AvgPoolNd``, adaptive and ``F.*_pool*d``) into nodes.

Window pooling becomes one ``POOL`` node (``op`` ``max`` or ``avg``) whose spec holds kernel,
stride, padding, dilation and the averaging rules; ``ceil_mode`` shows in the traced output
shape. Adaptive average pooling to size 1 is a mean over the spatial dims (a row reduction), and
adaptive pooling whose output size divides the input is plain window pooling. A float16 or
bfloat16 input gives a node of its type: the kernel reads it as float32, takes the maximum (exact)
or sums in float32, and rounds once where it stores. Declined, with the reason: ``return_indices``,
adaptive pooling with uneven windows.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.families.conv import int_tuple
from actors.experts.template.ir import NodeKind, NodeRef, PoolSpec
from actors.experts.template.lowering import LowerContext, lowering

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _out(traced: Any, dtype: str) -> tuple[int, ...]:
    if not isinstance(traced, torch.Tensor) or traced.dtype not in _FLOATS:
        raise UnsupportedGraph("a pooling whose output is not one floating tensor (return_indices?) is not covered")
    if str(traced.dtype).removeprefix("torch.") != dtype:
        raise UnsupportedGraph(f"a pooling of a {dtype} tensor to {traced.dtype} is not covered")
    return tuple(int(s) for s in traced.shape)


@lowering("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool")
def lower_pool(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """The nodes of one pooling op; ``b["nd"]`` is its spatial rank."""
    x = lw.tensor(b["input"], canon)
    nd = int(b["nd"])
    xs = lw.shape(x)
    if len(xs) not in (nd + 1, nd + 2):
        raise UnsupportedGraph(f"a {nd}d pooling of shape {xs} is not covered")
    if b.get("return_indices"):
        raise UnsupportedGraph("pooling with return_indices is not covered")
    out = _out(traced, lw.node(x).dtype)
    sin, sout = xs[-nd:], out[-nd:]
    if canon.startswith("adaptive"):
        if all(o == 1 for o in sout) and canon == "adaptive_avg_pool":
            dims = (len(xs) - nd, len(xs))
            total = lw.red("sum", x, dims, True)
            return lw.ew("div", total, float(math.prod(sin)))
        if any(i % o for i, o in zip(sin, sout, strict=True)):
            raise UnsupportedGraph(f"adaptive pooling from {sin} to {sout} with uneven windows is not covered")
        kernel = tuple(i // o for i, o in zip(sin, sout, strict=True))
        spec = PoolSpec(True, 0, kernel, kernel, (0,) * nd, (1,) * nd)
        op = "avg" if canon == "adaptive_avg_pool" else "max"
    else:
        kernel = int_tuple(b["kernel_size"], nd, "kernel_size")
        stride_arg = b.get("stride")
        stride = (
            kernel
            if stride_arg is None or stride_arg == [] or stride_arg == ()
            else int_tuple(stride_arg, nd, "stride")
        )
        padding = int_tuple(b.get("padding", 0), nd, "padding")
        if canon == "max_pool":
            dilation = int_tuple(b.get("dilation", 1), nd, "dilation")
            spec = PoolSpec(True, 0, kernel, stride, padding, dilation)
            op = "max"
        else:
            override = b.get("divisor_override")
            if override is not None and (not isinstance(override, int) or override <= 0):
                raise UnsupportedGraph(f"avg pooling divisor_override={override!r} is not covered")
            spec = PoolSpec(bool(b.get("count_include_pad", True)), override or 0, kernel, stride, padding, (1,) * nd)
            op = "avg"
    if out[:-nd] != xs[:-nd] or math.prod(out) == 0:
        raise UnsupportedGraph(f"a pooling from {xs} to {out} is not covered")
    return lw.add(NodeKind.POOL, out, op=op, args=(x.id,), attrs=spec.attrs(), dtype=lw.node(x).dtype)
