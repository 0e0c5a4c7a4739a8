"""Where the reference's time goes: its forward timed op by op, in the referee.

A ``TorchDispatchMode`` times every aten op the forward dispatches (a pair of CUDA events around
it on the GPU, the CPU clock on the CPU), and global forward hooks keep a stack of the submodules
being called, so each op is charged to the innermost one (``""``: ``Model.forward``'s own code).
The forward runs at PyTorch's defaults, as the eager baseline is timed. Each (module, op) pair's
time is the median over a few forwards; the shares are fractions of all the ops' time together.

This runs only in the referee, a process no candidate ever runs in: a candidate cannot change
what the run says its kernels are worth (Amdahl's law: a kernel can gain the run at most what
its ops take of the reference).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PROFILE_OPS_KEPT = 40
"""(module, op) pairs a profile lists; the rest are counted in ``more_ops`` (families count all)."""
PROFILE_REPEATS = 3
"""Forwards timed op by op, while they take less than :data:`PROFILE_SLOW_S` together (else one)."""
PROFILE_SLOW_S = 0.5

_CONV = ("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose", "cudnn_convolution", "mkldnn_convolution")
_MM = frozenset(
    {
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "matmul",
        "linear",
        "_addmm_activation",
        "dot",
        "vdot",
        "mv",
        "addmv",
        "einsum",
        "bilinear",
        "_int_mm",
        "_scaled_mm",
    }
)
_ATTN = ("scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
_REC = ("lstm", "gru", "rnn_tanh", "rnn_relu", "_cudnn_rnn", "_thnn_fused", "miopen_rnn", "mkldnn_rnn")
_ROW = frozenset(
    {
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "softmin",
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "native_group_norm",
        "instance_norm",
        "rms_norm",
        "_fused_rms_norm",
        "sum",
        "mean",
        "nansum",
        "amax",
        "amin",
        "max",
        "min",
        "aminmax",
        "argmax",
        "argmin",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "norm",
        "linalg_vector_norm",
        "logsumexp",
        "prod",
        "all",
        "any",
        "cosine_similarity",
        "kl_div",
        "cross_entropy",
        "binary_cross_entropy",
        "_weight_norm_interface",
    }
)
_SCAN = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "_cummax_helper", "_cummin_helper"})
_LAYOUT = frozenset(
    {
        "cat",
        "stack",
        "copy_",
        "clone",
        "contiguous",
        "_to_copy",
        "index",
        "index_select",
        "gather",
        "scatter",
        "scatter_add",
        "index_put",
        "index_put_",
        "constant_pad_nd",
        "reflection_pad1d",
        "reflection_pad2d",
        "reflection_pad3d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "roll",
        "flip",
        "repeat",
        "repeat_interleave",
        "slice_scatter",
        "select_scatter",
        "narrow_copy",
        "pixel_shuffle",
        "pixel_unshuffle",
        "channel_shuffle",
        "native_channel_shuffle",
        "embedding",
        "fill_",
        "zero_",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "new_zeros",
        "new_empty",
        "new_full",
        "new_ones",
        "empty",
        "zeros",
        "ones",
        "full",
        "arange",
        "lift_fresh",
        "lift_fresh_copy",
        "_local_scalar_dense",
        "upsample_nearest1d",
        "upsample_nearest2d",
        "upsample_nearest3d",
        "split_with_sizes_copy",
        "unbind_copy",
    }
)


_ALLOCATIONS = frozenset(
    {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided"}
)
"""Ops that only allocate (no kernel runs; their host time is not work of the model's)."""


def family_of(op: str, out_numel: int | None = None, in_numel: int | None = None) -> str:
    """The ``OpFamily`` value of an aten op (``aten::convolution`` or ``convolution``): by name, and
    for a name no table knows, elementwise (``pw``) where its output has as many elements as its
    largest input (a broadcast or a map), else ``other``. Views launch nothing and are ``layout``."""
    name = op.split("::")[-1].split(".")[0]
    if name.endswith("_backward"):
        return "other"
    if any(name.startswith(p) or p in name for p in _CONV):
        return "conv"
    if name in _MM:
        return "mm"
    if any(p in name for p in _ATTN):
        return "attn"
    if any(name.startswith(p) for p in _REC):
        return "rec"
    if name in _ROW or "batch_norm" in name or name.endswith("_loss") or "_loss_" in name:
        return "row"
    if "pool" in name:
        return "pool"
    if name in _SCAN:
        return "scan"
    if name in _LAYOUT or "upsample" in name:
        return "layout"
    if out_numel is None or in_numel is None:
        return "other"
    return "pw" if out_numel == in_numel else "other"


def _numel(values: Any) -> int | None:
    """The largest element count among the tensors of ``values`` (flat or nested)."""
    best: int | None = None
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            best = v.numel() if best is None else max(best, v.numel())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return best


class _OpTimer(TorchDispatchMode):
    """Times each op dispatched under it, charged to the innermost module on ``modules``."""

    def __init__(self, device: torch.device, modules: list[str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cuda = device.type == "cuda"
        self.modules = modules
        self.spans: list[tuple[str, str, str, Any, Any]] = []
        """(module, op, family, start, end): events on the GPU, ``perf_counter`` seconds on the CPU."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        where = self.modules[-1] if self.modules else ""
        name = str(func.name()).split(".")[0]
        if _is_view(func) or name in _ALLOCATIONS:
            return func(*args, **kwargs)
        start: Any
        end: Any
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            out = func(*args, **kwargs)
            end.record()
        else:
            start = time.perf_counter()
            out = func(*args, **kwargs)
            end = time.perf_counter()
        family = family_of(name, _numel(out), _numel((args, kwargs)))
        self.spans.append((where, name, family, start, end))
        return out


def _is_view(func: Any) -> bool:
    """Whether an op only makes a view (it launches nothing: not worth two events)."""
    try:
        return bool(func.is_view)
    except AttributeError:
        return False


@contextmanager
def _module_stack(model: torch.nn.Module) -> Iterator[list[str]]:
    """A stack of the dotted paths of the submodules of ``model`` being called (global hooks,
    removed on exit; modules outside ``model`` are not named)."""
    names = {id(m): n for n, m in model.named_modules() if n}
    stack: list[str] = []

    def pre(module: torch.nn.Module, args: Any) -> None:
        name = names.get(id(module))
        stack.append(name if name is not None else (stack[-1] if stack else ""))

    def post(module: torch.nn.Module, args: Any, out: Any) -> None:
        if stack:
            stack.pop()

    handles = [
        torch.nn.modules.module.register_module_forward_pre_hook(pre),
        torch.nn.modules.module.register_module_forward_hook(post),
    ]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


def _forward_us(call: Callable[[], object], device: torch.device) -> float:
    """One plain forward's time in microseconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e3
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1e6


Times = dict[tuple[str, str, str], list[float]]
"""(module, op, family) → the times of its calls in one forward, microseconds."""


def _one(model: torch.nn.Module, call: Callable[[], object], device: torch.device) -> Times:
    """The ops of one forward, timed."""
    with _module_stack(model) as stack:
        timer = _OpTimer(device, stack)
        with timer:
            call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times: Times = {}
    for module, op, family, start, end in timer.spans:
        us = float(start.elapsed_time(end)) * 1e3 if device.type == "cuda" else (end - start) * 1e6
        times.setdefault((module, op, family), []).append(max(0.0, us))
    return times


def profile_ops(model: torch.nn.Module, make_args: Callable[[], list[Any]], device: torch.device) -> dict[str, Any]:
    """The reference's profile as ``ReferenceProfile``'s fields (plain data for the wire): its
    forward timed whole and op by op, at PyTorch's defaults, without gradients."""
    inputs = make_args()

    def call() -> object:
        return model(*inputs)

    with torch.no_grad():
        forward_us = _forward_us(call, device)
        fast = forward_us < PROFILE_SLOW_S * 1e6
        if fast:  # the first call may have paid for warm-up
            forward_us = min(forward_us, _forward_us(call, device))
        runs: list[Times] = []
        started = time.perf_counter()
        while len(runs) < (PROFILE_REPEATS if fast else 1):
            runs.append(_one(model, call, device))
            if time.perf_counter() - started > PROFILE_SLOW_S:
                break  # the timers cost more than the forward (an op-by-op CPU fallback): once is enough
    inputs.clear()
    keys = list(dict.fromkeys(k for run in runs for k in run))
    pairs: list[tuple[str, str, str, int, float]] = []
    for key in keys:
        totals = [sum(run.get(key, [])) for run in runs]
        calls = max(len(run.get(key, [])) for run in runs)
        pairs.append((*key, calls, statistics.median(totals)))
    ops_us = sum(p[4] for p in pairs)
    pairs.sort(key=lambda p: -p[4])
    families: dict[str, float] = {}
    for _, _, family, _, us in pairs:
        families[family] = families.get(family, 0.0) + us

    def share(us: float) -> float:
        return min(1.0, us / ops_us) if ops_us > 0 else 0.0

    timed = [p for p in pairs if p[4] > 0]
    return {
        "timer": "cuda events per op" if device.type == "cuda" else "cpu clock per op",
        "forward_us": forward_us,
        "ops_us": ops_us,
        "families": [
            {"family": f, "time_us": us, "share": share(us)}
            for f, us in sorted(families.items(), key=lambda kv: -kv[1])
            if us > 0
        ],
        "ops": [
            {"module": m, "op": op, "family": f, "calls": n, "time_us": us, "share": share(us)}
            for m, op, f, n, us in timed[:PROFILE_OPS_KEPT]
        ],
        "more_ops": max(0, len(timed) - PROFILE_OPS_KEPT),
    }
