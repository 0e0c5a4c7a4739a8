"""The worker's ``measure`` op: the reference's working set in bytes, without running it for real.

The model and ``get_inputs()`` are built on PyTorch's ``meta`` device (tensors with shapes and
dtypes but no storage), and one forward gives the outputs' sizes; where an operation has no meta
kernel, a fake-tensor mode tries again. A 6 GB input costs nothing either way, so the plan
(:mod:`gpu_runner.memplan`) is known before any spare allocates. Runs in a worker that never
sees a candidate; it reports the device's free memory as this process sees it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from gpu_runner.errors import REFERENCE_FILENAME
from gpu_runner.frames import MeasureOp
from gpu_runner.sandboxed.common import flatten_outputs
from gpu_runner.sandboxed.held_out import DeclarationError, derive
from gpu_runner.sandboxed.reference import load_module


def _nbytes(values: list[Any]) -> tuple[int, int]:
    """(total bytes, largest tensor's bytes) of the tensors among ``values``."""
    total = largest = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            n = v.numel() * v.element_size()
            total += n
            largest = max(largest, n)
    return total, largest


@contextlib.contextmanager
def _meta() -> Iterator[None]:
    with torch.device("meta"):
        yield


@contextlib.contextmanager
def _fake() -> Iterator[None]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def measured_sizes(ns: dict[str, Any], mode: str) -> tuple[dict[str, Any], list[Any], Any]:
    """Bytes of one trial's inputs and outputs, the parameters and the largest tensor, by ``mode``;
    the inputs themselves (storage-less tensors: their shapes, strides and dtypes); and the model."""
    init_args = list(ns["get_init_inputs"]())
    with _meta() if mode == "meta" else _fake():
        model = ns["Model"](*init_args)
        inputs = list(ns["get_inputs"]())
        if mode == "meta":
            inputs = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in inputs]
        with torch.no_grad():
            out = model(*inputs)
    in_bytes, in_big = _nbytes(inputs)
    out_bytes, out_big = _nbytes(flatten_outputs(out))
    params = sum(p.numel() * p.element_size() for p in list(model.parameters()) + list(model.buffers()))
    sizes = {
        "input_bytes": in_bytes,
        "output_bytes": out_bytes,
        "param_bytes": params,
        "largest_tensor_bytes": max(in_big, out_big),
        "method": mode,
    }
    return sizes, inputs, model


class KernelOnMeta(RuntimeError):
    """The reference launched a Triton kernel while it ran on meta or fake tensors."""


@contextlib.contextmanager
def _no_kernel_launches() -> Iterator[None]:
    """Triton launches refused while the reference runs on meta or fake tensors: their pointers
    are null, and on a GPU such a launch is an illegal memory access that leaves this process's
    CUDA context unusable (the measuring worker then died at its next CUDA call: a reference that
    is itself a Triton kernel, the A/A test's). The mode fails instead and the next is tried."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing to guard
        yield
        return
    real = JITFunction.run

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self, "__name__", "a kernel")
        raise KernelOnMeta(f"the reference launches the Triton kernel {name}, which cannot run without data")

    JITFunction.run = refuse
    try:
        yield
    finally:
        JITFunction.run = real


def measure(msg: MeasureOp, device: torch.device) -> dict[str, Any]:
    """The ``measured`` frame's fields: sizes (or ``method: unknown: why``) and the device's free memory."""
    # A reference that never returns (a loop in its forward, a sleep at its top): the parent, giving
    # up on it, sends SIGUSR1 and reads the line it is stuck on from the stack written to the log.
    # (A watchdog thread's dump, faulthandler.dump_traceback_later, read the running thread's frames
    # unsynchronised: a worker crashed so, and the parent saw a worker die instead of a task hang.)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        with _no_kernel_launches():
            info = _measured(msg)
    finally:
        faulthandler.unregister(signal.SIGUSR1)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        info.update(device_free=int(free), device_total=int(total))
    return info


def _measured(msg: MeasureOp) -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        ns = load_module(msg["reference_source"], REFERENCE_FILENAME, "kf_reference_measure")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the preparation reports the reference's own fault
        info = {"method": f"unknown: the reference failed to load: {type(exc).__name__}: {exc}"[:300]}
    else:
        errors = []
        forward_s = 0.0
        model: Any = None
        inputs: list[Any] = []
        for mode in ("meta", "fake"):
            try:
                t0 = time.monotonic()
                info, inputs, model = measured_sizes(ns, mode)
                forward_s = time.monotonic() - t0
                break
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the next mode, or an unknown size, recorded
                errors.append(f"{mode}: {type(exc).__name__}: {exc}"[:200])
        else:
            info = {"method": "unknown: " + "; ".join(errors)}
        if msg.get("held_out_shapes", 0) and info.get("method") != "meta":
            info.update(variants=[], variants_note=f"none drawn: the reference measures by {info.get('method')}")
        elif msg.get("held_out_shapes", 0):
            try:
                base = int(info["input_bytes"]) + int(info["output_bytes"])
                variants, note = derive(ns, base_bytes=base, forward_s=forward_s, model=model, base_inputs=inputs)
            except DeclarationError as exc:  # the task's own mistake: the parent refuses the task
                variants, note = [], ""
                info["variants_error"] = str(exc)[:500]
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - no held-out shapes, and why
                variants, note = [], f"none drawn: {type(exc).__name__}: {exc}"[:300]
            info.update(variants=variants[: int(msg.get("held_out_shapes", 0))], variants_note=note)
    return info
