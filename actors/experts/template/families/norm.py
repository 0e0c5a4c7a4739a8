"""Lowering batch norm, instance norm and vector norms into the plan's primitive nodes.

``batch_norm`` with batch statistics (a module in training mode, or without running stats)
reduces over every dim but the channel: the spatial dims first, then the batch dim, two adjacent
reductions the row template covers; in eval mode with running stats it is an affine map of
the buffers. ``instance_norm`` reduces over the spatial dims. Both use the biased variance and
``1 / sqrt(var + eps)`` like PyTorch. ``torch.norm`` / ``torch.linalg.vector_norm`` with p = 1, 2,
``"fro"`` or infinity are sums (or a maximum) of ``|x|`` powers; ``F.normalize`` divides by such a
norm (at least ``eps``). The running statistics that
PyTorch updates in training mode are not updated (only the output is computed).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from actors.experts.template.composites import param_or_arg, reduce_dims
from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.ir import NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

spell(Spec("normalize", (("input", REQUIRED), ("p", 2.0), ("dim", 1), ("eps", 1e-12), ("out", None))), (F.normalize,))


def recentred(lw: LowerContext, x: NodeRef, mean: NodeRef) -> NodeRef:
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


def _moments(lw: LowerContext, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef, int]:
    """``(mean, M2, n)`` of ``x`` over ``dims`` (keepdim): ``M2 = sum((x - mean)^2)`` about the
    row's own mean, in one reduction stage (the row template reads such a row once; see
    ``emit_row.RowWriter._welford_pairs``)."""
    count = math.prod(lw.shape(x)[dims[0] : dims[1]])
    mean = lw.ew("div", lw.red("sum", x, dims, True, split_rows=False), float(count))
    d = lw.ew("sub", x, mean)
    return mean, lw.red("sum", lw.ew("mul", d, d), dims, True, split_rows=False), count


def _combine(lw: LowerContext, mean: NodeRef, m2: NodeRef, count: int, dim: int) -> tuple[NodeRef, NodeRef, int]:
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


def moments(lw: LowerContext, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef, int]:
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


def mean_var(lw: LowerContext, x: NodeRef, dims: tuple[int, int]) -> tuple[NodeRef, NodeRef]:
    """``(x - mean, var)`` over ``dims`` (keepdim, biased variance) from :func:`moments`."""
    mean, m2, count = moments(lw, x, dims)
    return recentred(lw, x, mean), lw.ew("div", m2, float(count))


def _affine(lw: LowerContext, y: NodeRef, b: dict[str, Any], channels: int, rank: int) -> NodeRef:
    per_channel = (channels, *([1] * (rank - 2)))
    for name, op in (("weight", "mul"), ("bias", "add")):
        p = param_or_arg(lw, b, name)
        if p is not None:
            y = lw.ew(op, y, lw.view(p, per_channel))
    return y


def _eps(b: dict[str, Any]) -> float:
    eps = b.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise UnsupportedGraph(f"norm eps={eps!r} is not a number")
    return float(eps)


def lower_batch_norm(lw: LowerContext, b: dict[str, Any]) -> NodeRef:
    """``batch_norm`` over ``(N, C, *spatial)``."""
    x = lw.tensor(b["input"], "batch_norm")
    shape = lw.shape(x)
    rank = len(shape)
    if rank < 2:
        raise UnsupportedGraph(f"batch_norm of shape {shape} is not covered")
    if "__path__" in b:
        module = lw.traced.root.get_submodule(b["__path__"])
        batch_stats = bool(module.training) or not bool(module.track_running_stats)
        mean_ref = param_or_arg(lw, b, "running_mean") if not batch_stats else None
        var_ref = param_or_arg(lw, b, "running_var") if not batch_stats else None
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


SPLIT_COLUMN_ROWS = 16384
"""Fewest rows of a column reduction that is split in parts (:func:`_row_parts`): fewer are
reduced whole, where the row template keeps a column in registers and fuses the normalisation
(KernelBench L2-33's 1024 rows: one kernel after the product instead of four)."""
PART_ROWS = 256
"""Fewest rows of a part when a column reduction's rows are split (:func:`_row_parts`)."""
MOST_PARTS = 1024
"""Most parts a column reduction's rows are split into."""


def _row_parts(rows: int) -> int:
    """Parts (a power of two dividing ``rows``, at most :data:`MOST_PARTS`, each of at least
    :data:`PART_ROWS` rows) to split the rows of a reduction over dim 0 into, where there are
    :data:`SPLIT_COLUMN_ROWS` or more; 1 keeps it whole."""
    parts = 1
    if rows < SPLIT_COLUMN_ROWS:
        return parts
    while parts * 2 <= MOST_PARTS and rows % (parts * 2) == 0 and rows // (parts * 2) >= PART_ROWS:
        parts *= 2
    return parts


def _channel_moments(lw: LowerContext, x: NodeRef) -> tuple[NodeRef, NodeRef]:
    """Per-channel ``(mean, var)`` of ``(N, C, *spatial)``, shaped ``(C, 1, ...)``: each sample's
    spatial moments (:func:`moments`), merged over the batch."""
    shape = lw.shape(x)
    rank, channels = len(shape), shape[1]
    if rank > 2:
        mean, m2, count = moments(lw, x, (2, rank))
        mean, m2 = lw.view(mean, shape[:2]), lw.view(m2, shape[:2])
        mean, m2, count = _combine(lw, mean, m2, count, 0)
    else:
        parts = lw.column_parts(x, _row_parts(shape[0]))
        if parts > 1:
            # (N, C) reduced over N is a column reduction: one program per block of channels
            # walked every row (KernelBench L3-46's (204800, 48): one program, 7 ms on an H100,
            # where PyTorch's takes 30 us). In parts of rows, each with its moments, merged; a
            # choice by size, so not in a plan for any size (``Lowerer.split``).
            part = lw.view(x, (parts, shape[0] // parts, channels))
            mean, m2, count = _moments(lw, part, (1, 2))
            mean, m2 = lw.view(mean, (parts, channels)), lw.view(m2, (parts, channels))
            mean, m2, count = _combine(lw, mean, m2, count, 0)
        else:
            mean, m2, count = _moments(lw, x, (0, 1))
    per_channel = (channels, *([1] * (rank - 2)))
    return lw.view(mean, per_channel), lw.ew("div", lw.view(m2, per_channel), float(count))


def lower_instance_norm(lw: LowerContext, b: dict[str, Any]) -> NodeRef:
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


def lower_vector_norm(lw: LowerContext, b: dict[str, Any], dims: tuple[int, int]) -> NodeRef:
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


@lowering("normalize")
def _normalize(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """``F.normalize``: ``x / max(norm_p(x, dim, keepdim), eps)``, as PyTorch computes it."""
    if b.get("out") is not None:
        raise UnsupportedGraph("F.normalize with out= is not covered")
    x = lw.tensor(b["input"], canon)
    dim = b.get("dim", 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise UnsupportedGraph(f"F.normalize over dim {dim!r} is not covered (one dim)")
    norm = lower_vector_norm(lw, {"input": x, "p": b.get("p", 2.0), "keepdim": True}, reduce_dims(lw.shape(x), dim))
    return lw.ew("div", x, lw.ew("clamp_min", norm, attrs=(number(b.get("eps", 1e-12), "eps"),)))


@lowering("batch_norm")
def _batch_norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    return lower_batch_norm(lw, b)


@lowering("instance_norm")
def _instance_norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    return lower_instance_norm(lw, b)


@lowering("norm")
def _vector_norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    x = lw.tensor(b["input"], canon)
    return lower_vector_norm(lw, b, reduce_dims(lw.shape(x), b.get("dim")))


@lowering("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm")
def _norm(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    """Softmax and log-softmax (the row maximum subtracted first), layer, RMS and group norms."""
    x = lw.tensor(b["input"], canon)
    shape = lw.shape(x)
    rank = len(shape)
    if canon in ("softmax", "log_softmax"):
        if b.get("dim") is None or b.get("dtype") is not None:
            raise UnsupportedGraph(f"{canon} without an explicit dim (or with a dtype) is not covered")
        dims = reduce_dims(shape, b["dim"])
        m = lw.red("amax", x, dims, True)
        shifted = lw.ew("sub", x, m)
        e = lw.ew("exp", shifted)
        s = lw.red("sum", e, dims, True)
        return lw.ew("div", e, s) if canon == "softmax" else lw.ew("sub", shifted, lw.ew("log", s))
    if canon == "group_norm":
        groups = int(number(b["num_groups"], "num_groups"))
        if rank < 2 or shape[1] % groups != 0:
            raise UnsupportedGraph(f"group_norm of shape {shape} with {groups} groups")
        spatial = math.prod(shape[2:])
        grouped = lw.view(x, (shape[0], groups, shape[1] // groups * spatial))
        centred, var = mean_var(lw, grouped, (2, 3))
        y = lw.view(lw.ew("mul", centred, lw.ew("rsqrt", lw.ew("add", var, number(b["eps"], "eps")))), shape)
        per_channel = (shape[1], *([1] * (rank - 2)))
        for name, op in (("weight", "mul"), ("bias", "add")):
            p = param_or_arg(lw, b, name)
            if p is not None:
                y = lw.ew(op, y, lw.view(p, per_channel))
        return y
    ns = b["normalized_shape"]
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    if not ns or tuple(shape[rank - len(ns) :]) != ns:
        raise UnsupportedGraph(f"{canon} over {ns} of shape {shape}")
    dims = (rank - len(ns), rank)
    if canon == "layer_norm":
        centred, var = mean_var(lw, x, dims)
        y = lw.ew("mul", centred, lw.ew("rsqrt", lw.ew("add", var, number(b["eps"], "eps"))))
    else:
        eps = b["eps"] if b["eps"] is not None else torch.finfo(torch.float32).eps
        count = float(math.prod(ns))
        ms = lw.ew("div", lw.red("sum", lw.ew("mul", x, x), dims, True), count)
        y = lw.ew("mul", x, lw.ew("rsqrt", lw.ew("add", ms, number(eps, "eps"))))
    weight = param_or_arg(lw, b, "weight")
    if weight is not None:
        y = lw.ew("mul", y, weight)
    bias = param_or_arg(lw, b, "bias") if canon == "layer_norm" else None
    if bias is not None:
        y = lw.ew("add", y, bias)
    return y
