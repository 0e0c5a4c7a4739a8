"""The worker's trusted stage: load the reference, make inputs, compute the reference outputs.

Everything here runs before any candidate code is imported into the process. The outputs (in
the reference's dtype and in float64) are shipped to the parent at once, so nothing the
candidate later does can change what it is compared against.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_runner.frames import PrepareOp, Report
from gpu_runner.memplan import LARGE_BYTES
from gpu_runner.sandboxed.common import (
    Channel,
    Laps,
    OutputSlots,
    checksum,
    flatten_outputs,
    log,
    pack,
    register_host,
    sync,
    unregister_host,
)
from gpu_runner.sandboxed.shared_slots import SharedSlots

REFERENCE_FILENAME = "<kfoundry-reference>"


class ReferenceFault(Exception):
    """The reference itself failed (the user's task, not a candidate)."""


@dataclass
class Prepared:
    """A task made ready in this process: the reference model, inputs and outputs of every trial."""

    device: torch.device
    namespace: dict[str, Any]
    model: torch.nn.Module
    init_seed: int
    candidate_init_args: list[Any]
    trials: list[list[Any]]
    ref_outputs: list[list[torch.Tensor]]
    compiled: Any = None
    compiled_error: str | None = None
    out_nbytes: int = 0
    in_nbytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    slots: OutputSlots | None = None
    """Host buffers the candidate's trial outputs are copied into (None: they are packed and sent)."""
    shared: SharedSlots | None = None
    """Shared buffers (device memory on CUDA) the trial outputs are copied into for the judge."""
    init_on_device: bool = False
    """The models of this task are built on the device itself (:func:`build_model`)."""
    ref_noise: list[list[float]] = field(default_factory=list)
    """Per trial and output, the reference's largest error against float64 (empty: not known here,
    the judge computes the truth); widens the worker's quick checks as the parent's verdict allows
    (``gpu_runner.stats.NOISE_FACTOR``)."""

    def noise(self, trial: int) -> list[float]:
        """The reference's largest error against float64 per output of ``trial`` (0 where unknown)."""
        return self.ref_noise[trial] if self.ref_noise else [0.0] * len(self.ref_outputs[trial])


def load_module(source: str, filename: str, name: str) -> dict[str, Any]:
    """Execute a source file into a fresh module namespace (not registered in ``sys.modules``)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)  # the user's trusted reference, in the worker (never the parent)
    return module.__dict__


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


def ship(
    shipments: list[tuple[list[torch.Tensor], int, str | None]], device: torch.device, channel: Channel, laps: Laps
) -> None:
    """Send each trial's reference outputs and residuals to the parent.

    They go through page-locked host files made outside the lease (:class:`OutputSlots`), so the
    lease covers only the DMA copies; without a bulk directory, or for tensors the files cannot
    hold, they are copied to host memory and packed under it.
    """
    slots = None
    if channel.bulk_dir:
        try:
            slots = OutputSlots(channel.bulk_dir, [tensors for tensors, _, _ in shipments], device, prefix="ref")
        except (OSError, RuntimeError, ValueError) as exc:
            log(f"reference slots unavailable: {type(exc).__name__}: {exc}")
    laps.lap("ship_slots_s")
    frames: list[tuple[int, int, str | None, Any, Any]] = []
    with channel.gpu_lease(device):
        for t, (tensors, n_outputs, fp64_error) in enumerate(shipments):
            filled = slots.fill(t, tensors) if slots is not None else None
            frames.append((t, n_outputs, fp64_error, filled, None if filled else [x.to("cpu") for x in tensors]))
    laps.lap("d2h_s")
    for t, n_outputs, fp64_error, filled, host in frames:
        if filled is not None:
            metas, refs = filled
            channel.send_bulk(
                Report.REFERENCE, refs, trial=t, n_outputs=n_outputs, tensors=metas, fp64_error=fp64_error
            )
        else:
            metas, blobs = pack(host)
            channel.send(
                Report.REFERENCE, blobs=blobs, trial=t, n_outputs=n_outputs, tensors=metas, fp64_error=fp64_error
            )
    if slots is not None:
        slots.release()
    laps.lap("ship_s")


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


def make_inputs(ns: dict[str, Any], seed: int, device: torch.device, on_device: bool = False) -> list[Any]:
    """The reference's ``get_inputs()`` under ``seed``, on ``device``.

    With ``on_device`` the factory functions it calls allocate on ``device`` directly (a 6 GB
    ``torch.randn`` takes milliseconds on a GPU and many seconds and gigabytes of the host's
    memory on the CPU); tensors it places explicitly are moved after. A ``get_inputs`` that fails
    so (one that calls ``.numpy()``, say) is drawn again on the CPU under the same seed: it fails
    the same way wherever the same inputs are drawn (the spare, the judge), so they agree.
    """
    torch.manual_seed(seed)
    if on_device:
        try:
            with torch.device(device):
                values = ns["get_inputs"]()
        except Exception as exc:  # noqa: BLE001 - a get_inputs that needs the CPU: drawn there instead
            log(f"get_inputs() failed drawing on {device} ({type(exc).__name__}: {exc}); drawn on the CPU")
            torch.manual_seed(seed)
            values = ns["get_inputs"]()
    else:
        values = ns["get_inputs"]()
    if not isinstance(values, list | tuple):
        raise ReferenceFault(f"get_inputs() returned {type(values).__name__}, not a list")
    return to_device(list(values), device)


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


def _tensors(out: object, what: str) -> list[torch.Tensor]:
    items = flatten_outputs(out)
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise ReferenceFault(f"{what} did not return a tensor or a tuple of tensors")
    return [t.detach() for t in items if isinstance(t, torch.Tensor)]


def prepare(msg: PrepareOp, device: torch.device, channel: Channel) -> Prepared:
    """Build the reference for ``msg``'s seeds and ship its outputs; raises :class:`ReferenceFault`."""
    try:
        ns = load_module(msg["reference_source"], REFERENCE_FILENAME, "kf_reference")
    except Exception as exc:
        raise ReferenceFault(f"the reference failed to load: {type(exc).__name__}: {exc}") from exc
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in ns:
            raise ReferenceFault(f"the reference defines no {name}")
    init_seed = int(msg["init_seed"])
    laps = Laps()
    try:
        init_args = list(ns["get_init_inputs"]())
        candidate_init_args = copy.deepcopy(init_args)
        # Large models are built on the device, under the lease below (their initialisation runs there).
        init_on_device = device.type == "cuda" and bool(msg.get("init_on_device"))
        model = None if init_on_device else build_model(ns["Model"], init_args, init_seed, torch.device("cpu"), False)
        # Inputs of a MiB and more are drawn on the device itself, under the lease below
        # (``memplan.INPUTS_ON_DEVICE_BYTES``); tiny ones on the host, then copied up.
        on_device = device.type == "cuda" and bool(msg.get("inputs_on_device"))
        # Outputs the judge compares: no float64 run and nothing shipped here; the judge draws
        # the same inputs from the same seeds (their checksums prove it) and computes the truth.
        judged = bool(msg.get("device_verdict"))
        host_trials = (
            [] if on_device else [make_inputs(ns, int(seed), torch.device("cpu")) for seed in msg["trial_seeds"]]
        )
    except ReferenceFault:
        raise
    except Exception as exc:
        raise ReferenceFault(f"building the reference failed: {type(exc).__name__}: {exc}") from exc
    laps.lap("build_s")
    # The inputs' host memory is page-locked in place (outside the lease), so their copies to the
    # device under it are DMA: pageable copies of 640 MB held the lease ~0.1 s (bench/prep_probe.py).
    locked = lock_host(host_trials) if device.type == "cuda" else []
    laps.lap("lock_s")
    ref_outputs: list[list[torch.Tensor]] = []
    ref_noise: list[list[float]] = []
    shipments: list[tuple[list[torch.Tensor], int, str | None]] = []
    """Per trial: its outputs then their float64 residuals, on the device; how many outputs; the float64 error."""
    # Every GPU step runs under the parent's GPU lease, so it never overlaps a candidate's timing
    # (copies and allocations in another process do disturb one); what only needs the CPU
    # (building inputs and the host files before, shipping after) happens outside it.
    flops = msg.get("flops")
    with channel.gpu_lease(device):
        laps.lap("lease_wait_s")
        try:
            if model is None:
                try:
                    model = build_model(ns["Model"], init_args, init_seed, device, True)
                except Exception as exc:  # noqa: BLE001 - a constructor that needs the CPU (e.g. .numpy()): as before
                    log(f"building the model on the device failed, on the CPU instead: {type(exc).__name__}: {exc}")
                    init_on_device = False
                    model = build_model(ns["Model"], init_args, init_seed, torch.device("cpu"), False)
            model = model.to(device)
            if on_device:
                trials = [make_inputs(ns, int(seed), device, on_device=True) for seed in msg["trial_seeds"]]
            else:
                trials = [to_device(values, device, non_blocking=bool(locked)) for values in host_trials]
            model64 = None if judged else copy.deepcopy(model).to(torch.float64)
        except ReferenceFault:
            raise
        except Exception as exc:
            raise ReferenceFault(f"building the reference failed: {type(exc).__name__}: {exc}") from exc
        laps.lap("to_device_s")
        with torch.no_grad():
            for inputs in trials:
                try:
                    with exact_fp32():
                        outs = _tensors(model(*clone_inputs(inputs)), "Model.forward")
                except ReferenceFault:
                    raise
                except Exception as exc:
                    raise ReferenceFault(f"the reference's forward failed: {type(exc).__name__}: {exc}") from exc
                ref_outputs.append(outs)
                if judged:  # the judge computes the float64 truth itself, after the candidate
                    continue
                fp64_error = None
                try:
                    assert model64 is not None
                    outs64 = _tensors(model64(*as_double(inputs)), "Model.forward (float64)")
                except Exception as exc:  # noqa: BLE001 - some references cannot run in float64: recorded
                    outs64, fp64_error = [], f"{type(exc).__name__}: {exc}"[:500]
                # The float64 truth travels as its difference from the reference's own output: float32
                # holds that difference to ~1e-7 of itself, at half the bytes of the float64 values.
                # In place on the float64 output: no float64 copy of the reference's output (at 6 GB
                # outputs each copy is 12 GB of device memory).
                residuals = [
                    o64.sub_(o).float() if o.is_floating_point() and o64.shape == o.shape else o.new_empty(0)
                    for o, o64 in zip(outs, outs64, strict=False)
                ]
                del outs64
                ref_noise.append([float(r.abs().max()) if r.numel() else 0.0 for r in residuals])
                shipments.append(([o.detach() for o in outs + residuals], len(outs), fp64_error))
        del model64
        input_sums = (  # under the lease: a pass over every input on the device
            [[checksum(v) if isinstance(v, torch.Tensor) else None for v in values] for values in trials]
            if judged
            else None
        )
        laps.lap("forward_s")
        if flops is None:  # the parent passes it on once a spare of this task has counted it
            flops = count_flops(model, trials[0])
            laps.lap("flops_s")
    for t in locked:  # the lease's end synchronised the copies
        unregister_host(t)
    del host_trials, locked
    prepared = Prepared(
        device=device,
        namespace=ns,
        model=model,
        init_seed=init_seed,
        init_on_device=init_on_device,
        candidate_init_args=candidate_init_args,
        trials=trials,
        ref_outputs=ref_outputs,
        ref_noise=ref_noise,
        out_nbytes=sum(o.numel() * o.element_size() for o in ref_outputs[0]),
        in_nbytes=sum(v.numel() * v.element_size() for v in trials[0] if isinstance(v, torch.Tensor)),
    )
    if not judged:
        ship(shipments, device, channel, laps)
    del shipments
    # The preparation's transient memory is gone (the float64 residuals shipped): the parent may let
    # the next spare prepare while this one builds its compiled baseline (mostly CPU: 1.1-1.5 s of
    # dynamo with warm caches on an H200 host, which one-at-a-time preparations queued behind).
    channel.send(Report.REFERENCE_DONE)
    if msg.get("compiled_baseline"):
        build_compiled(prepared, channel)
        laps.lap("compiled_s")

    if judged and msg.get("shared_outputs") and channel.share_fd >= 0:
        # The judge reads the trials' outputs where the worker copies them (no host files): the
        # buffers and their descriptors are made now, before any candidate code exists here.
        share_fd, channel.share_fd = channel.share_fd, -1
        try:
            with channel.gpu_lease(device):  # device allocations and their zeroing: not beside a timing
                prepared.shared = SharedSlots(ref_outputs, device, share_fd)
        except (OSError, RuntimeError, ValueError) as exc:  # DevShareError included: host files then
            log(f"shared outputs unavailable: {type(exc).__name__}: {exc}")
        laps.lap("shared_s")
    channel.close_share()
    if channel.bulk_dir and prepared.shared is None:  # pre-faulted and page-locked now, while the spare waits
        # ... unless they are gigabytes: then page-locking costs more than the pageable copy it
        # saves (an 8 GB-output spare spent 14 s making its two slots, on the critical path when
        # the plan allows no spare ahead), so the files are only mapped.
        large = prepared.out_nbytes > int(msg.get("in_place_bytes", LARGE_BYTES))
        try:
            prepared.slots = OutputSlots(channel.bulk_dir, ref_outputs, device, prefault=not large)
        except (OSError, RuntimeError, ValueError) as exc:  # the trials then pack and send as before
            log(f"output slots unavailable: {type(exc).__name__}: {exc}")
        laps.lap("slots_s")
    if device.type == "cuda":  # the preparation's transient memory back to the device, for the others
        torch.cuda.empty_cache()
    params = sum(p.numel() * p.element_size() for p in list(model.parameters()) + list(model.buffers()))
    channel.send(
        Report.PREPARED,
        flops=flops,
        bytes_moved=prepared.in_nbytes + prepared.out_nbytes + params,
        out_dtype=str(ref_outputs[0][0].dtype).removeprefix("torch."),
        compiled_error=prepared.compiled_error,
        compiled=prepared.compiled is not None,
        init_on_device=init_on_device,
        phases=laps.seconds,
        output_slots=(
            {"files": len(prepared.slots.slots), "pinned": prepared.slots.pinned}
            if prepared.slots
            else {"shared": len(prepared.shared.views)}
            if prepared.shared
            else None
        ),
        input_sums=input_sums,
        out_metas=[
            [
                {
                    "dtype": str(o.dtype).removeprefix("torch."),
                    "shape": list(o.shape),
                    "nbytes": o.numel() * o.element_size(),
                }
                for o in outs
            ]
            for outs in ref_outputs
        ],
    )
    return prepared


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
"""Tries at the baseline: two spares compiling one task at once share the inductor cache, and one
of them failed once in CI, after 2.9 s of its peer's 16 (the error was not kept); a second try
costs a failing task one more compilation per spare that builds it."""


def build_compiled(prepared: Prepared, channel: Channel) -> None:
    """``torch.compile`` the reference and warm it, before any candidate code is loaded.

    Dynamo and inductor compile on the CPU; the compiled graph's runs (and the autotuning of
    kernel configs they may do) use the GPU. So the GPU lease is taken when a compilation ends
    and given back when one starts (dynamo's compile callbacks), and held whenever the compiled
    model runs. Without those callbacks the whole warm-up holds the lease.
    """
    device = prepared.device

    def on_start(*_args: object) -> None:
        channel.release_gpu(device)

    def on_end(*_args: object) -> None:
        channel.acquire_gpu(device)

    try:
        for attempt in range(COMPILE_ATTEMPTS):
            try:
                with _compile_hooks(on_start, on_end):
                    compiled = torch.compile(prepared.model)
                    with torch.no_grad():
                        for _ in range(2):
                            # every call runs under the lease; a compilation inside it gives the lease back meanwhile
                            on_end()
                            compiled(*clone_inputs(prepared.trials[0]))
                    sync(device)
                prepared.compiled, prepared.compiled_error = compiled, None
                break
            except Exception as exc:  # noqa: BLE001 - the baseline is optional; the reason is reported
                prepared.compiled_error = f"torch.compile failed: {type(exc).__name__}: {exc}"[:1000]
                log(f"{prepared.compiled_error} (attempt {attempt + 1} of {COMPILE_ATTEMPTS})")
                torch._dynamo.reset()  # the next attempt traces afresh (this also drops the callbacks)
    finally:
        on_start()


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
