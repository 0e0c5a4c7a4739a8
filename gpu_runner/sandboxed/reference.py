"""The reference's side: load it, draw its inputs, build its model, compute its outputs and the
float64 truth, and its ``torch.compile`` baseline.

Everything here that computes with the reference (:func:`truth`, :func:`count_flops`,
:func:`build_compiled`) runs only in processes that never import a candidate: the referee
(:mod:`gpu_runner.sandboxed.referee`), the judge and the compile stage. A spare uses
:func:`load_module`, :func:`make_inputs` and :func:`build_model` too, before its candidate exists,
to draw the trials' inputs and build the candidate's model under the task's seed
(:mod:`gpu_runner.sandboxed.spare`): it never builds the reference's model nor sees its outputs.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import math
import time
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from gpu_runner.errors import REFERENCE_FILENAME, missing_hint
from gpu_runner.frames import Report
from gpu_runner.sandboxed.common import (
    TORCH_DTYPES,
    Channel,
    Laps,
    OutputSlots,
    flatten_outputs,
    log,
    pack,
    register_host,
    sync,
)
from gpu_runner.sandboxed.held_out import sized


class ReferenceFault(Exception):
    """The reference itself failed (the user's task, not a candidate)."""


def load_module(source: str, filename: str, name: str) -> dict[str, Any]:
    """Execute a source file into a fresh module namespace (not registered in ``sys.modules``)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)  # the user's trusted reference, in the worker (never the parent)
    return module.__dict__


def load_reference(source: str) -> dict[str, Any]:
    """The user's reference loaded, with its ``Model``, ``get_inputs`` and ``get_init_inputs``;
    raises :class:`ReferenceFault` (the task, not a candidate, is at fault)."""
    try:
        ns = load_module(source, REFERENCE_FILENAME, "kf_reference")
    except Exception as exc:
        raise ReferenceFault(f"the reference failed to load: {type(exc).__name__}: {exc}{missing_hint(exc)}") from exc
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in ns:
            raise ReferenceFault(f"the reference defines no {name}")
    return ns


def to_device(values: list[Any], device: torch.device, non_blocking: bool = False) -> list[Any]:
    """Tensors moved to ``device``; other values as they are."""
    return [v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for v in values]


LOCK_MIN_BYTES = 1 << 20
"""Host tensors smaller than this are copied as they are (a small copy gains little from page-locking;
the threshold is a judgement, not a measurement)."""


def lock_host(trials: list[list[Any]]) -> list[torch.Tensor]:
    """Page-lock the large host tensors among the trials' inputs, each storage once; those locked."""
    locked: list[torch.Tensor] = []
    seen: set[int] = set()
    for values in trials:
        for v in values:
            if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
                continue
            storage = v.untyped_storage()
            if storage.nbytes() < LOCK_MIN_BYTES or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            if register_host(whole):
                locked.append(whole)
    return locked


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """The reference's outputs in IEEE float32: TF32 off for cuDNN and for matmuls while inside.

    PyTorch runs cuDNN convolutions in TF32 by default. Outputs made that way sit 1e-4..1e-3 from
    the float32 result, so an exact float32 kernel failed the 1e-4 tolerance around them (on the
    H100, every exact convolution of the level-1 dev subset: 4-22% of elements outside). The
    eager baseline is still timed with PyTorch's defaults (what a user's model runs); only the
    outputs the candidate is compared with are exact.
    """
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    try:
        saved = (cudnn.allow_tf32, matmul.allow_tf32)
        cudnn.allow_tf32, matmul.allow_tf32 = False, False
    except RuntimeError as exc:  # a reference that set the newer precision API itself: left as it chose
        log(f"TF32 left as the reference set it: {exc}")
        yield
        return
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


def clone_inputs(values: list[Any]) -> list[Any]:
    """Fresh copies of the tensors among ``values``."""
    return [v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for v in values]


def as_double(values: list[Any]) -> list[Any]:
    """Fresh copies of ``values``, floating tensors widened to float64 (the widening is the copy)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone())
        else:
            out.append(copy.deepcopy(v))
    return out


def make_inputs(
    ns: dict[str, Any],
    seed: int,
    device: torch.device,
    on_device: bool = False,
    scale: float = 1.0,
    skip: int = 0,
    overrides: Mapping[str, int] | None = None,
) -> list[Any]:
    """The reference's ``get_inputs()`` under ``seed``, on ``device`` (floating inputs times
    ``scale``): the draw after ``skip`` others from the same seed (a timed batch's call ``skip``);
    with ``overrides``, the task's module-level sizes set so (a held-out shape, :func:`sized`).

    With ``on_device`` the factory functions it calls allocate on ``device`` directly (a 6 GB
    ``torch.randn`` takes milliseconds on a GPU and many seconds and gigabytes of the host's
    memory on the CPU); tensors it places explicitly are moved after. A ``get_inputs`` that fails
    so (one that calls ``.numpy()``, say) is drawn again on the CPU under the same seed: it fails
    the same way wherever the same inputs are drawn (the spare, the referee, the judge), so they agree.
    Out of device memory is raised, never drawn on the CPU instead (it need not happen everywhere).
    """
    with sized(ns, overrides):
        return scale_inputs(make_batch_inputs(ns, seed, skip + 1, device, on_device)[-1], scale)


def seed_generators(seed: int) -> None:
    """What ``torch.manual_seed`` does to the generators a ``get_inputs`` can draw from here (the
    CPU's and every visible GPU's), without its look at other backends: on an H200 host that took
    ~600 us, once per timed batch in every process, and the cover spin queued before each batch's
    draws is sized at 1.5 times it (``gpu_runner.timing_session``)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for generator in torch.cuda.default_generators:
            generator.manual_seed(seed)
    elif torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # seeded when CUDA starts, as torch.manual_seed does


def make_batch_inputs(
    ns: dict[str, Any],
    seed: int,
    count: int,
    device: torch.device,
    on_device: bool,
    laps: dict[str, float] | None = None,
    overrides: Mapping[str, int] | None = None,
) -> list[list[Any]]:
    """``count`` draws of ``get_inputs()`` one after another from ``seed`` (one seeding for a whole
    timed batch: seeding the generators is most of a small draw's host time), on ``device``;
    ``laps`` gets the host seconds of the seeding (``seed_s``) and of the draws (``draws_s``);
    ``overrides``: at a held-out shape (:func:`sized`)."""

    def draws() -> list[Any]:
        t0 = time.perf_counter()
        seed_generators(seed)
        t1 = time.perf_counter()
        out = []
        with sized(ns, overrides):
            for _ in range(count):
                values = ns["get_inputs"]()
                if not isinstance(values, list | tuple):
                    raise ReferenceFault(f"get_inputs() returned {type(values).__name__}, not a list")
                out.append(list(values))
        if laps is not None:
            laps["seed_s"], laps["draws_s"] = t1 - t0, time.perf_counter() - t1
        return out

    if on_device:
        try:
            with torch.device(device):
                drawn = draws()
        except (ReferenceFault, torch.OutOfMemoryError):
            # Out of memory is the device's state, not the draw's need: the CPU's generator would
            # draw other numbers than the GPU's that the judge and the referee draw (on an 80 GB
            # H100 two spares' inputs so differed from the judge's for KernelBench L1-57).
            raise
        except Exception as exc:  # noqa: BLE001 - a get_inputs that needs the CPU: drawn there instead
            log(f"get_inputs() failed drawing on {device} ({type(exc).__name__}: {exc}); drawn on the CPU")
            drawn = draws()
    else:
        drawn = draws()
    return [to_device(values, device) for values in drawn]


def init_inputs(ns: dict[str, Any]) -> list[Any]:
    """The reference's ``get_init_inputs()`` as a list; :class:`ReferenceFault` where it returns
    something else (an ``int`` was reported as ``TypeError: 'int' object is not iterable``)."""
    values = ns["get_init_inputs"]()
    if not isinstance(values, list | tuple):
        raise ReferenceFault(f"get_init_inputs() returned {type(values).__name__}, not a list")
    return list(values)


def build_model(factory: Any, init_args: list[Any], seed: int, device: torch.device, on_device: bool) -> Any:
    """``factory(*init_args)`` under ``seed``, moved to ``device``.

    With ``on_device`` its parameters are created and initialised on ``device`` itself: an MLP of
    8 GB of weights took 11.4 s to initialise on the CPU of an H200 host and 0.39 s on the GPU.
    The device's random generator draws other values than the CPU's, so the reference, the
    candidate and the judge of one task are all built the same way (the plan decides, per task).
    """
    torch.manual_seed(seed)
    if on_device:
        with torch.device(device):
            model = factory(*init_args)
    else:
        model = factory(*init_args)
    return model.to(device) if isinstance(model, torch.nn.Module) else model


def tensors(out: object, what: str) -> list[torch.Tensor]:
    """A forward's outputs as detached tensors; :class:`ReferenceFault` unless it returned tensors."""
    items = flatten_outputs(out)
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        got = type(out).__name__ if not items else ", ".join(sorted({type(t).__name__ for t in items}))
        raise ReferenceFault(f"{what} did not return a tensor or a tuple of tensors (it returned {got})")
    for i, t in enumerate(items):
        if isinstance(t, torch.Tensor) and str(t.dtype).removeprefix("torch.") not in TORCH_DTYPES:
            # refused here, where the task is checked: a spare found it only when a candidate came
            raise ReferenceFault(f"{what} returns a {t.dtype} tensor (output {i}), which cannot be compared")
    return [t.detach() for t in items if isinstance(t, torch.Tensor)]


def scale_inputs(values: list[Any], scale: float) -> list[Any]:
    """A range trial's inputs: every floating tensor multiplied by ``scale`` in place (1.0: as drawn).

    The same draw and the same multiplication in every process that makes a trial's inputs (the
    spare, the referee, the judge), so they agree bit for bit."""
    if scale != 1.0:
        for v in values:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.mul_(scale)
    return values


ERROR_CHUNK = 1 << 22
"""Elements per step of :func:`error_sums` (a float64 copy of that many at a time)."""


def error_sums(truth: torch.Tensor, out: torch.Tensor) -> tuple[float, float, float]:
    """(sum of truth², sum of (out - truth)², largest |out - truth|) in float64, over chunks."""
    tf, of = truth.reshape(-1), out.reshape(-1)
    sq_t = sq_d = worst = 0.0
    for lo in range(0, tf.numel(), ERROR_CHUNK):
        tc = tf[lo : lo + ERROR_CHUNK].double()
        d = of[lo : lo + ERROR_CHUNK].double() - tc
        sq_t += float(torch.dot(tc, tc))
        sq_d += float(torch.dot(d, d))
        worst = max(worst, float(d.abs().max())) if d.numel() else worst
    return sq_t, sq_d, worst


def error_at_defaults(truth: torch.Tensor, out: torch.Tensor) -> dict[str, float] | None:
    """An output's error against its float64 ``truth``: relative L2 (``rel_l2``) and the largest
    error over the truth's RMS (``max_rms``); None where it cannot be said (non-finite, zero truth)."""
    sq_t, sq_d, worst = error_sums(truth, out)
    if not all(math.isfinite(v) for v in (sq_t, sq_d, worst)) or sq_t <= 0:
        return None
    return {"rel_l2": math.sqrt(sq_d / sq_t), "max_rms": worst / math.sqrt(sq_t / truth.numel())}


def trial_defaults(
    model: Any, inputs: list[Any], outs64: list[torch.Tensor], parity: list[bool]
) -> list[dict[str, float] | None] | None:
    """The reference's error against float64 on one trial's ``inputs`` when it runs with PyTorch's
    defaults, per output where the task grants precision parity (``parity``; None elsewhere): the
    precision its user's model has on exactly these inputs, which the trial's rule then uses
    (:meth:`gpu_runner.compare.PrecisionRule.on_trial`). None where nothing is measured: no output
    has parity, or the device lacks the room for a second set of outputs (the task's calibration
    stands)."""
    if not any(parity):
        return None
    device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))
    if device.type == "cuda":
        need = 2 * sum(o.numel() * 4 for o in outs64)
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        if need > free:
            log(f"no room for the defaults' run of a trial ({need >> 20} MiB, {free >> 20} MiB free)")
            return None
    try:
        with torch.no_grad():
            outs = tensors(model(*clone_inputs(inputs)), "Model.forward (PyTorch's defaults)")
    except Exception as exc:  # noqa: BLE001 - the task's calibration stands for this trial
        log(f"no defaults' run of a trial: {type(exc).__name__}: {exc}")
        return None
    found: list[dict[str, float] | None] = []
    for i, t in enumerate(outs64):
        o = outs[i] if i < len(outs) and i < len(parity) and parity[i] else None
        usable = o is not None and o.is_floating_point() and o.shape == t.shape
        found.append(error_at_defaults(t, o) if o is not None and usable else None)
    del outs
    return found


def truth(
    model: Any, model64: Any, inputs: list[Any], parity: list[bool] | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], str | None, list[dict[str, float] | None] | None]:
    """The reference's outputs in IEEE fp32 for ``inputs``, their float64 residuals (the float64
    outputs minus them, as float32; empty where there is no float64 run), why not (or None), and
    the reference's error at PyTorch's defaults on these inputs, per output with ``parity``
    (:func:`trial_defaults`; None where not measured)."""
    with torch.no_grad():
        try:
            with exact_fp32():
                outs = tensors(model(*clone_inputs(inputs)), "Model.forward")
        except ReferenceFault:
            raise
        except Exception as exc:
            raise ReferenceFault(f"the reference's forward failed: {type(exc).__name__}: {exc}") from exc
        fp64_error = None
        try:
            if model64 is None:
                raise RuntimeError("no float64 copy of the model")
            outs64 = tensors(model64(*as_double(inputs)), "Model.forward (float64)")
        except Exception as exc:  # noqa: BLE001 - some references cannot run in float64: recorded
            outs64, fp64_error = [], f"{type(exc).__name__}: {exc}"[:500]
        measured = trial_defaults(model, inputs, outs64, parity or []) if outs64 else None
        # The float64 truth travels as its difference from the reference's own output: float32
        # holds that difference to ~1e-7 of itself, at half the bytes of the float64 values. In
        # place on the float64 output: no float64 copy of the reference's output.
        residuals = [
            o64.sub_(o).float() if o.is_floating_point() and o64.shape == o.shape else o.new_empty(0)
            for o, o64 in zip(outs, outs64, strict=False)
        ]
        del outs64
    return outs, residuals, fp64_error, measured


Shipment = tuple[int, list[torch.Tensor], int, str | None, list[dict[str, float] | None] | None]
"""A trial's truth to ship: (trial, outputs then residuals, number of outputs, why no float64
run, the reference's error at PyTorch's defaults on its inputs)."""


def ship(
    shipments: list[Shipment],
    device: torch.device,
    channel: Channel,
    laps: Laps,
) -> None:
    """Send each trial's reference outputs and residuals to the parent, one ``reference`` frame per
    :data:`Shipment`.

    They go through page-locked host files made outside the lease (:class:`OutputSlots`), so the
    lease covers only the DMA copies; without a bulk directory, or for tensors the files cannot
    hold, they are copied to host memory and packed under it.
    """
    slots = None
    if channel.bulk_dir:
        try:
            slots = OutputSlots(channel.bulk_dir, [shipment[1] for shipment in shipments], device, prefix="ref")
        except (OSError, RuntimeError, ValueError) as exc:
            log(f"reference slots unavailable: {type(exc).__name__}: {exc}")
    laps.lap("ship_slots_s")
    frames: list[tuple[dict[str, Any], Any, Any]] = []
    with channel.gpu_lease(device):
        for k, (t, tensors_, n_outputs, fp64_error, measured) in enumerate(shipments):
            filled = slots.fill(k, tensors_) if slots is not None else None
            fields = {"trial": t, "n_outputs": n_outputs, "fp64_error": fp64_error, "default_errors": measured}
            frames.append((fields, filled, None if filled else [x.to("cpu") for x in tensors_]))
    laps.lap("d2h_s")
    for fields, filled, host in frames:
        if filled is not None:
            metas, refs = filled
            channel.send_bulk(Report.REFERENCE, refs, tensors=metas, **fields)
        else:
            metas, blobs = pack(host)
            channel.send(Report.REFERENCE, blobs=blobs, tensors=metas, **fields)
    if slots is not None:
        slots.release()
    laps.lap("ship_s")


def count_flops(model: torch.nn.Module, inputs: list[Any]) -> int | None:
    """FLOPs of one forward as torch's flop counter sees them (matmul/conv/attention)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*clone_inputs(inputs))
        return int(counter.get_total_flops())
    except Exception as exc:  # noqa: BLE001 - a missing count leaves the bound to bytes alone
        log(f"flop count failed: {type(exc).__name__}: {exc}")
        return None


COMPILE_ATTEMPTS = 2
"""Tries at the baseline (a transient failure once cost a spare its baseline in CI; the error was
not kept); the referee builds it once per task, so a second try costs a failing task one more
compilation."""


def build_compiled(model: Any, sample: list[Any], device: torch.device, channel: Channel) -> tuple[Any, str | None]:
    """``torch.compile`` of the reference's model, warmed on ``sample``: (compiled, None) or (None, why).

    Dynamo and inductor compile on the CPU; the compiled graph's runs (and the autotuning of
    kernel configs they may do) use the GPU. So the GPU lease is taken when a compilation ends
    and given back when one starts (dynamo's compile callbacks), and held whenever the compiled
    model runs. Without those callbacks the whole warm-up holds the lease.
    """

    def on_start(*_args: object) -> None:
        channel.release_gpu(device)

    def on_end(*_args: object) -> None:
        channel.acquire_gpu(device)

    error: str | None = None
    try:
        for attempt in range(COMPILE_ATTEMPTS):
            try:
                with _compile_hooks(on_start, on_end):
                    compiled = torch.compile(model)
                    with torch.no_grad():
                        for _ in range(2):
                            # every call runs under the lease; a compilation inside it gives the lease back meanwhile
                            on_end()
                            compiled(*clone_inputs(sample))  # type: ignore[no-untyped-call]
                    sync(device)
                return compiled, None
            except Exception as exc:  # noqa: BLE001 - the baseline is optional; the reason is reported
                error = f"torch.compile failed: {type(exc).__name__}: {exc}"[:1000]
                log(f"{error} (attempt {attempt + 1} of {COMPILE_ATTEMPTS})")
                torch._dynamo.reset()  # the next attempt traces afresh (this also drops the callbacks)
    finally:
        on_start()
    return None, error


@contextlib.contextmanager
def _compile_hooks(on_start: Callable[..., None], on_end: Callable[..., None]) -> Iterator[None]:
    """Dynamo's compile start/end callbacks for one attempt (none where this torch lacks them)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # pragma: no cover - every torch this project admits has them
        yield
        return
    callback_handler.register_start_callback(on_start)
    callback_handler.register_end_callback(on_end)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # already gone (a reset clears them)
            callback_handler.remove_start_callback(on_start)
            callback_handler.remove_end_callback(on_end)
