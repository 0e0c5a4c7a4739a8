"""One timed batch: the harness the candidate's spare and the referee both run, call for call.

The parent drives the timing (:mod:`gpu_runner.timing_session`): it sends each process a batch of
fresh seeds and holds its own clock around the whole batch. A batch here draws every call's inputs
on the device from its seed first (fresh data no earlier call saw), then per call: an L2 flush of
twice the L2 size, a device-side spin (``lead_us``, so the start event fires right before the
call's first kernel and host launch delays are not timed), CUDA events around the call; one
synchronisation at the end. The CPU uses ``perf_counter``. The samples go back raw.

In the referee these numbers are trusted. In a candidate's process everything here runs beside the
candidate's code and may have been rewritten by it, so the parent trusts none of it: it compares
the samples with its own clock around the batch (the time outside the timed windows must be what
the same harness costs the referee) and judges the outputs itself.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

import torch

from gpu_runner.frames import BatchOp, Report
from gpu_runner.sandboxed.common import Channel, flatten_outputs, log, pack, sync


class Flusher:
    """Evicts the L2 cache (and resets persisting L2 lines) between timed calls on CUDA, then queues
    the lead spin (a number of GPU cycles the parent chose)."""

    def __init__(self, device: torch.device, measure: bool = False) -> None:
        """``measure``: also measure the spin rate and the flush's own time (the referee does)."""
        self.device = device
        self.buffer: torch.Tensor | None = None
        self.reset_fn: Any = None
        self.nbytes = 0
        self.cycles_per_us = 0.0
        self.flush_us = 0.0
        if device.type != "cuda":
            return
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20))
        self.nbytes = 2 * l2
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=device)
        self.reset_fn = _persisting_l2_reset()
        if measure:
            self.cycles_per_us = _cycles_per_us(device)
            self.flush_us = self._flush_us()

    def _flush_us(self) -> float:
        """The flush's device time (median of 7, CUDA events)."""
        assert self.buffer is not None
        times = []
        for _ in range(7):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self.buffer.zero_()
            end.record()
            sync(self.device)
            times.append(float(start.elapsed_time(end)) * 1e3)
        return sorted(times)[3]

    def flush(self, lead_cycles: int) -> None:
        if self.buffer is not None:
            self.buffer.zero_()
        self.spin(lead_cycles)

    def spin(self, cycles: int) -> None:
        """Keep the device busy for ``cycles`` GPU cycles (nothing on the CPU)."""
        if cycles > 0 and self.device.type == "cuda":
            torch.cuda._sleep(int(cycles))  # type: ignore[no-untyped-call]

    def reset_persisting(self) -> bool:
        if self.reset_fn is None:
            return False
        return bool(self.reset_fn() == 0)


def _cycles_per_us(device: torch.device) -> float:
    """The GPU's spin rate for ``torch.cuda._sleep``, measured with events."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # warm
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
    end.record()
    sync(device)
    ms = float(start.elapsed_time(end))
    return cycles / (ms * 1e3) if ms > 0 else 1500.0


def _persisting_l2_reset() -> Any:
    """``cudaCtxResetPersistingL2Cache`` from the CUDA runtime torch loaded, if it can be found."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libcudart.so" in line}
        for path in sorted(paths):
            if path.startswith("/"):
                lib = ctypes.CDLL(path)
                fn = lib.cudaCtxResetPersistingL2Cache
                fn.restype = ctypes.c_int
                return fn
    except (OSError, AttributeError) as exc:
        log(f"persisting-L2 reset unavailable: {exc}")
    return None


def canary_us(device: torch.device, scratch: torch.Tensor | None) -> float:
    """Host-clock microseconds of one tiny kernel and a synchronisation: a few tens with the GPU
    idle, milliseconds while another process's kernel holds it (the GPU time-slices contexts)."""
    if device.type != "cuda" or scratch is None:
        return 0.0
    sync(device)
    t0 = time.perf_counter()
    scratch.add_(1)
    sync(device)
    return (time.perf_counter() - t0) * 1e6


def run_batch(
    msg: BatchOp,
    fn: Callable[[list[Any]], object],
    draw: Callable[[int, int, dict[str, float]], list[list[Any]]],
    device: torch.device,
    flusher: Flusher,
) -> BatchResult:
    """Time one batch: (milliseconds per timed call, each call's output tensors, calls made, the
    host's median microseconds per call from its flush to its end event, and the host's time
    drawing the inputs: ``seed_us`` once, ``draw_us`` per call).

    Warm-up batches go round their inputs until both ``calls`` calls and ``warmup_min_s`` are
    done. The outputs are kept (their tensors, as the calls returned them): the caller decides
    what goes back. The host time tells the parent how long a lead spin hides the launches."""
    count = int(msg["calls"])
    lead = int(msg["lead_cycles"])
    warm_s = float(msg["warmup_min_s"]) if msg["warmup"] else 0.0
    if msg["warmup"]:
        # A first draw pays for the allocator's first blocks (as many as the largest timed batch
        # needs) and the generators' first use; the draw that is measured (the parent sizes the
        # cover spin from it) then costs what the timed batches' draws will.
        draw(int(msg["seed"]), max(count, int(msg.get("predraw") or 0)), {})
    flusher.spin(int(msg["cover_cycles"]))
    laps: dict[str, float] = {}
    inputs = draw(int(msg["seed"]), count, laps)  # every call's own inputs, drawn before the first call
    drawing = {"seed_us": laps.get("seed_s", 0.0) * 1e6, "draw_us": laps.get("draws_s", 0.0) * 1e6 / max(1, count)}
    samples: list[float] = []
    outputs: list[list[torch.Tensor]] = []
    events: list[tuple[Any, Any]] = []
    host: list[float] = []
    started = time.perf_counter()
    calls = 0
    with torch.no_grad():
        while calls < count or time.perf_counter() - started < warm_s:
            args = inputs[calls % len(inputs)]
            t_host = time.perf_counter()
            flusher.flush(lead)
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                out = fn(args)
                end.record()
                events.append((start, end))
            else:
                t0 = time.perf_counter()
                out = fn(args)
                samples.append((time.perf_counter() - t0) * 1e3)
            host.append((time.perf_counter() - t_host) * 1e6)
            if calls < count:
                outputs.append([o for o in flatten_outputs(out) if isinstance(o, torch.Tensor)])
            calls += 1
            if warm_s and calls >= count:
                sync(device)  # a warm-up measures its time with the device caught up
        sync(device)
    if events:
        samples = [float(s.elapsed_time(e)) for s, e in events]
    late = sorted(host[len(host) // 2 :])  # past the first calls (a warm-up's first launches build things)
    return samples, outputs, calls, late[len(late) // 2], drawing


BatchResult = tuple[list[float], list[list[torch.Tensor]], int, float, dict[str, float]]
"""What :func:`run_batch` returns."""


def send_timed(
    channel: Channel, msg: BatchOp, device: torch.device, result: BatchResult, **extra: Any
) -> list[list[torch.Tensor]]:
    """The batch's ``timed`` frame (every call's outputs packed into it where ``msg`` asks for
    ``all``, ``extra`` fields added); returns the outputs to keep until the next batch (``keep``)."""
    samples, outputs, calls, host_us, drawing = result
    blobs: list[Any] = []
    metas: list[dict[str, Any]] = []
    if msg["outputs"] == "all":
        for outs in outputs:
            m, b = pack(outs)
            metas += m
            blobs += b
    channel.send(
        Report.TIMED,
        blobs=blobs,
        samples=samples,
        calls=calls,
        host_us=host_us,
        **drawing,
        timer="cuda_event" if device.type == "cuda" else "perf_counter",
        tensors=metas,
        **extra,
    )
    return outputs if msg["outputs"] == "keep" else []
