"""Interleaved timing of the candidate and the reference baselines, inside the run worker.

Each round times every callable once, in a rotating order, so all of them see the same process
and device state. Before every timed call, outside the timed region: a distinct input buffer
(two alternate, and each is refilled with another trial's inputs, so a cache keyed on a pointer
or on stale contents gives wrong answers) and an L2 flush of twice the L2 size. CUDA events
bracket each call; the CPU uses ``perf_counter``. Rounds go on until the median of every callable
is known to the target relative error (:func:`gpu_runner.stats.median_rel_stderr`; the median is
what the speed-up uses) or the budget runs out. A guard then times synchronized
calls with the host clock, which exposes work left on side streams or deferred past the call.
Raw samples go to the parent, which computes the statistics.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_runner.sandboxed.common import log, sync
from gpu_runner.stats import median_rel_stderr


@dataclass
class Timed:
    """One callable to time: it takes the inputs and returns the outputs."""

    name: str
    fn: Callable[[list[Any]], object]
    after: Callable[[int, object], None] | None = None
    samples: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    calls: int = 0
    warmup_calls: int = 0


class Rotation:
    """Distinct input buffers in turn: two copies, each refilled from a different trial before every
    call, or (inputs over :data:`gpu_runner.memplan.LARGE_BYTES`, ``copy=False``) the
    trials' own buffers, each its own pointer and data."""

    def __init__(self, trials: list[list[Any]], copy: bool = True) -> None:
        self.trials = trials
        self.copy = copy
        self.buffers = (
            [[v.clone() if isinstance(v, torch.Tensor) else v for v in trials[0]] for _ in range(2)] if copy else []
        )

    def load(self, k: int) -> tuple[list[Any], int]:
        if not self.copy:
            t = k % len(self.trials)
            return self.trials[t], t
        b = k % 2
        t = (k // 2 + b) % len(self.trials)
        for dst, src in zip(self.buffers[b], self.trials[t], strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        return self.buffers[b], t


class Flusher:
    """Evicts the L2 cache (and resets persisting L2 lines) between timed calls on CUDA.

    After the flush it queues a short device-side spin (``lead_us``), so the GPU is still busy
    when the host launches the timed call: the start event then fires right before the call's
    first kernel, and host-side delays (a launcher's Python overhead, a preempted thread) do not
    count as kernel time. Work a callable does on the host is caught by the wall-clock guard.
    """

    def __init__(self, device: torch.device, lead_us: float = 0.0) -> None:
        self.device = device
        self.buffer: torch.Tensor | None = None
        self.reset_fn: Any = None
        self.nbytes = 0
        self.lead_cycles = 0
        if device.type != "cuda":
            return
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20))
        self.nbytes = 2 * l2
        self.buffer = torch.empty(self.nbytes, dtype=torch.int8, device=device)
        self.reset_fn = _persisting_l2_reset()
        if lead_us > 0:
            self.lead_cycles = int(_cycles_per_us(device) * lead_us)

    def flush(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()
        if self.lead_cycles:
            torch.cuda._sleep(self.lead_cycles)  # type: ignore[no-untyped-call]

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


def _call(tm: Timed, rotation: Rotation, flusher: Flusher, device: torch.device) -> tuple[Any, Any, int]:
    inputs, trial = rotation.load(tm.calls)
    flusher.flush()
    tm.calls += 1
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        out = tm.fn(inputs)
        end.record()
        if tm.after is not None:
            tm.after(trial, out)
        return start, end, trial
    t0 = time.perf_counter()
    out = tm.fn(inputs)
    elapsed = (time.perf_counter() - t0) * 1e3
    if tm.after is not None:
        tm.after(trial, out)
    return elapsed, None, trial


def run_timing(timed: list[Timed], rotation: Rotation, device: torch.device, cfg: dict[str, Any]) -> dict[str, Any]:
    """Warm up, time interleaved rounds to the target error, then run the wall-clock guard."""
    flusher = Flusher(device, float(cfg.get("timing_lead_us", 0.0)))
    budget = float(cfg["timing_budget_s"])
    started = time.perf_counter()
    with torch.no_grad():
        for tm in timed:
            t0 = time.perf_counter()
            while tm.warmup_calls < cfg["warmup_min_calls"] or time.perf_counter() - t0 < cfg["warmup_min_s"]:
                _call(tm, rotation, flusher, device)
                sync(device)
                tm.warmup_calls += 1
                if time.perf_counter() - t0 > budget / 4:
                    break
        l2_reset = flusher.reset_persisting()
        rounds = 0
        timing_started = time.perf_counter()
        while True:
            order = timed[rounds % len(timed) :] + timed[: rounds % len(timed)]
            pending = [(tm, *_call(tm, rotation, flusher, device)) for tm in order]
            sync(device)
            for tm, first, second, _trial in pending:
                tm.samples.append(first.elapsed_time(second) if second is not None else first)
            rounds += 1
            if device.type == "cuda" and rounds % 16 == 0:
                flusher.reset_persisting()
            spent = time.perf_counter() - timing_started
            if rounds >= cfg["timing_min_reps"]:
                converged = all(median_rel_stderr(tm.samples) <= cfg["timing_target_rel_err"] for tm in timed)
                if converged or rounds >= cfg["timing_max_reps"] or spent > budget:
                    break
            elif spent > 2 * budget and rounds >= 3:
                break
        if device.type == "cuda":
            for _ in range(int(cfg["guard_reps"])):
                for tm in timed:
                    inputs, trial = rotation.load(tm.calls)
                    tm.calls += 1
                    flusher.flush()
                    sync(device)
                    t0 = time.perf_counter()
                    out = tm.fn(inputs)
                    sync(device)
                    tm.wall.append((time.perf_counter() - t0) * 1e3)
                    if tm.after is not None:
                        tm.after(trial, out)
    return {
        "callables": {
            tm.name: {"samples": tm.samples, "wall": tm.wall, "warmup_calls": tm.warmup_calls} for tm in timed
        },
        "rounds": rounds,
        "flush_bytes": flusher.nbytes,
        "lead_cycles": flusher.lead_cycles,
        "l2_reset": l2_reset,
        "timer": "cuda_event" if device.type == "cuda" else "perf_counter",
        "elapsed_s": time.perf_counter() - started,
    }
