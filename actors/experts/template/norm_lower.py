"""Lowering batch norm, instance norm and vector norms into the plan's primitive nodes.

``batch_norm`` with batch statistics (a module in training mode, or without running stats)
reduces over every dim but the channel: the spatial dims first, then the batch dim, two adjacent
reductions the row template covers; in eval mode with running stats it is an affine map of
the buffers. ``instance_norm`` reduces over the spatial dims. Both use the biased variance and
``1 / sqrt(var + eps)`` like PyTorch. ``torch.norm`` / ``torch.linalg.vector_norm`` with p = 1, 2,
``"fro"`` or infinity are sums (or a maximum) of ``|x|`` powers. The running statistics that
PyTorch updates in training mode are not updated (only the output is computed).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import NodeRef

if TYPE_CHECKING:
    from actors.experts.template.lower import Lowerer


def recentred(lw: Lowerer, x: NodeRef, mean: NodeRef) -> NodeRef:
    """``x - mean`` again, as a node of its own for the normalised output.

    The variance's ``x - mean`` lives in the kernel that reduces it; when the output is computed
    in a later kernel (the statistics reduced in two stages: batch norm, group norm over few
    huge rows), reusing that node made the reducing kernel store it for the later one: an extra
    write and read of the whole tensor, and a second pass over it in the reducing kernel.
    Computed again, the later kernel reads ``x`` and the small ``mean`` instead (the same bytes
    as the stored difference), and nothing else changes where one kernel does it all (its last
    pass over the row computes the difference anyway). Batch norm of (64, 64, 512, 512): 16 GB
    moved per call instead of 24 GB in the rendered kernels (counted from them, not timed).
    """
    return lw.ew("sub", x, mean)


def _sum_per_channel(lw: Lowerer, t: NodeRef) -> NodeRef:
    """Sum over every dim but dim 1, keepdim (spatial first, then batch)."""
    rank = len(lw.shape(t))
    if rank > 2:
        t = lw.red("sum", t, (2, rank), True)
    return lw.red("sum", t, (0, 1), True)


def _affine(lw: Lowerer, y: NodeRef, b: dict[str, Any], channels: int, rank: int) -> NodeRef:
    per_channel = (channels, *([1] * (rank - 2)))
    for name, op in (("weight", "mul"), ("bias", "add")):
        p = _param(lw, b, name)
        if p is not None:
            y = lw.ew(op, y, lw.view(p, per_channel))
    return y


def _param(lw: Lowerer, b: dict[str, Any], name: str) -> NodeRef | None:
    if "__path__" in b:
        module = lw.traced.root.get_submodule(b["__path__"])
        if getattr(module, name, None) is None:
            return None
        return lw.param(f"{b['__path__']}.{name}")
    value = b.get(name)
    return None if value is None else lw.tensor(value, name)


def _eps(b: dict[str, Any]) -> float:
    eps = b.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise UnsupportedGraph(f"norm eps={eps!r} is not a number")
    return float(eps)


def lower_batch_norm(lw: Lowerer, b: dict[str, Any]) -> NodeRef:
    """``batch_norm`` over ``(N, C, *spatial)``."""
    x = lw.tensor(b["input"], "batch_norm")
    shape = lw.shape(x)
    rank = len(shape)
    if rank < 2:
        raise UnsupportedGraph(f"batch_norm of shape {shape} is not covered")
    if "__path__" in b:
        module = lw.traced.root.get_submodule(b["__path__"])
        batch_stats = bool(module.training) or not bool(module.track_running_stats)
        mean_ref = _param(lw, b, "running_mean") if not batch_stats else None
        var_ref = _param(lw, b, "running_var") if not batch_stats else None
    else:
        batch_stats = bool(b.get("training"))
        has_running = b.get("running_mean") is not None and b.get("running_var") is not None
        if not batch_stats and not has_running:
            raise UnsupportedGraph("batch_norm in eval mode without running statistics")
        batch_stats = batch_stats or not has_running
        mean_ref = None if batch_stats else lw.tensor(b["running_mean"], "running_mean")
        var_ref = None if batch_stats else lw.tensor(b["running_var"], "running_var")
    eps = _eps(b)
    per_channel = (shape[1], *([1] * (rank - 2)))
    if batch_stats:
        count = float(math.prod(shape) // shape[1])
        mean = lw.ew("div", _sum_per_channel(lw, x), count)
        centred = lw.ew("sub", x, mean)
        var = lw.ew("div", _sum_per_channel(lw, lw.ew("mul", centred, centred)), count)
        centred = recentred(lw, x, mean)
    else:
        assert mean_ref is not None
        assert var_ref is not None
        centred = lw.ew("sub", x, lw.view(mean_ref, per_channel))
        var = lw.view(var_ref, per_channel)
    y = lw.ew("mul", centred, lw.ew("rsqrt", lw.ew("add", var, eps)))
    return _affine(lw, y, b, shape[1], rank)


def lower_instance_norm(lw: Lowerer, b: dict[str, Any]) -> NodeRef:
    """``instance_norm`` over ``(N, C, *spatial)`` with the instance's own statistics."""
    x = lw.tensor(b["input"], "instance_norm")
    shape = lw.shape(x)
    rank = len(shape)
    if rank < 3:
        raise UnsupportedGraph(f"instance_norm of shape {shape} is not covered")
    if "__path__" in b:
        module = lw.traced.root.get_submodule(b["__path__"])
        if module.track_running_stats and not module.training:
            raise UnsupportedGraph("instance_norm with running statistics in eval mode is not covered")
    elif not b.get("use_input_stats", True):
        raise UnsupportedGraph("instance_norm without input statistics is not covered")
    dims = (2, rank)
    count = float(math.prod(shape[2:]))
    mean = lw.ew("div", lw.red("sum", x, dims, True), count)
    centred = lw.ew("sub", x, mean)
    var = lw.ew("div", lw.red("sum", lw.ew("mul", centred, centred), dims, True), count)
    y = lw.ew("mul", recentred(lw, x, mean), lw.ew("rsqrt", lw.ew("add", var, _eps(b))))
    return _affine(lw, y, b, shape[1], rank)


def lower_vector_norm(lw: Lowerer, b: dict[str, Any], dims: tuple[int, int]) -> NodeRef:
    """``torch.norm`` / ``vector_norm`` over ``dims`` for p in 1, 2, ``"fro"``, inf."""
    x = lw.tensor(b["input"], "norm")
    p = b["ord"] if "ord" in b else b.get("p")
    p = "fro" if p is None else p
    if b.get("dtype") is not None:
        raise UnsupportedGraph("norm with a dtype is not covered")
    keep = bool(b.get("keepdim", False))
    if p in ("fro", 2, 2.0):
        return lw.ew("sqrt", lw.red("sum", lw.ew("mul", x, x), dims, keep))
    if p in (1, 1.0):
        return lw.red("sum", lw.ew("abs", x), dims, keep)
    if p == math.inf:
        return lw.red("amax", lw.ew("abs", x), dims, keep)
    raise UnsupportedGraph(f"norm with p={p!r} is not covered")
