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
    Computed again, the later kernel reads ``x`` and the small mean instead (the same bytes
    as the stored difference), and nothing else changes where one kernel does it all (its last
    pass over the row computes the difference anyway). Batch norm of (64, 64, 512, 512): 16 GB
    moved per call instead of 24 GB in the rendered kernels (counted from them, not timed).
    """
    return lw.ew("sub", x, mean)


def _moments(lw: Lowerer, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef, int]:
    """``(mean, M2, n)`` of ``x`` over ``dims`` (keepdim): ``M2 = sum((x - mean)^2)`` about the
    row's own mean, in one reduction stage (the row template reads such a row once; see
    ``emit_row.RowWriter._welford_pairs``)."""
    count = math.prod(lw.shape(x)[dims[0] : dims[1]])
    mean = lw.ew("div", lw.red("sum", x, dims, True, split_rows=False), float(count))
    d = lw.ew("sub", x, mean)
    return mean, lw.red("sum", lw.ew("mul", d, d), dims, True, split_rows=False), count


def _combine(lw: Lowerer, mean: NodeRef, m2: NodeRef, count: int, dim: int) -> tuple[NodeRef, NodeRef, int]:
    """The moments of ``k`` groups of ``count`` elements each, along ``dim`` (keepdim), merged:
    ``mean = sum(mean_i) / k`` and ``M2 = sum(M2_i) + count * sum((mean_i - mean)^2)`` (Chan et al.;
    no difference of large sums, so as accurate as two passes over the data)."""
    k = lw.shape(mean)[dim]
    if k == 1:
        return mean, m2, count
    dims = (dim, dim + 1)
    merged = lw.ew("div", lw.red("sum", mean, dims, True), float(k))
    dm = lw.ew("sub", mean, merged)
    spread = lw.ew("mul", lw.red("sum", lw.ew("mul", dm, dm), dims, True), float(count))
    return merged, lw.ew("add", lw.red("sum", m2, dims, True), spread), count * k


def moments(lw: Lowerer, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef, int]:
    """``(mean, M2, n)`` of ``x`` over ``dims`` (keepdim), reading ``x`` once.

    Where a reduction over few huge rows is split in parts for parallelism (``Lowerer.split_parts``),
    each part takes its own mean and ``M2`` and :func:`_combine` merges them: splitting the sum and
    then the sum of squared deviations about the full mean, as before, read ``x`` once for each
    (batch norm of (64, 64, 512, 512): 16 GB moved per call with the output's read and write, 12 GB
    now, counted from the rendered kernels).
    """
    shape = lw.shape(x)
    d0, d1 = dims
    parts = lw.split_parts("sum", x, dims)
    if parts is None:
        return _moments(lw, x, dims)
    rows = shape[:d0]
    mean, m2, count = _moments(lw, lw.view(x, (*rows, parts, math.prod(shape[d0:]) // parts)), (d0 + 1, d0 + 2))
    mean, m2, count = _combine(lw, mean, m2, count, d0)
    keep = (*rows, *([1] * (d1 - d0)))
    return lw.view(mean, keep), lw.view(m2, keep), count


def mean_var(lw: Lowerer, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef]:
    """``(x - mean, var)`` over ``dims`` (keepdim, biased variance) from :func:`moments`."""
    mean, m2, count = moments(lw, x, dims)
    return recentred(lw, x, mean), lw.ew("div", m2, float(count))


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
        mean, var = _channel_moments(lw, x)
        centred = recentred(lw, x, mean)
    else:
        assert mean_ref is not None
        assert var_ref is not None
        centred = lw.ew("sub", x, lw.view(mean_ref, per_channel))
        var = lw.view(var_ref, per_channel)
    y = lw.ew("mul", centred, lw.ew("rsqrt", lw.ew("add", var, eps)))
    return _affine(lw, y, b, shape[1], rank)


def _channel_moments(lw: Lowerer, x: NodeRef) -> tuple[NodeRef, NodeRef]:
    """Per-channel ``(mean, var)`` of ``(N, C, *spatial)``, shaped ``(C, 1, ...)``: each sample's
    spatial moments (:func:`moments`), merged over the batch."""
    shape = lw.shape(x)
    rank, channels = len(shape), shape[1]
    if rank > 2:
        mean, m2, count = moments(lw, x, (2, rank))
        mean, m2 = lw.view(mean, shape[:2]), lw.view(m2, shape[:2])
        mean, m2, count = _combine(lw, mean, m2, count, 0)
    else:
        mean, m2, count = _moments(lw, x, (0, 1))
    per_channel = (channels, *([1] * (rank - 2)))
    return lw.view(mean, per_channel), lw.ew("div", lw.view(m2, per_channel), float(count))


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
    centred, var = mean_var(lw, x, (2, rank))
    y = lw.ew("mul", centred, lw.ew("rsqrt", lw.ew("add", var, _eps(b))))
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
