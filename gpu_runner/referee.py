"""The referee (parent side): the one process that holds a task's reference, its truth and its baselines.

A run worker forked like any spare, given a ``task`` and never a candidate
(:mod:`gpu_runner.sandboxed.referee`). The pool starts one per task; the run stage asks it for the
reference's outputs of the seeds a spare's trials (or a timed call) used, and, inside a
candidate's timing session, for timed batches of the eager and compiled baselines interleaved
with the candidate's. One op at a time (a lock); its own GPU work outside a timing session runs
under a shared lease, so it never overlaps a timing. Everything it sends is trusted: no candidate
code ever ran in its process, and the parent tells it nothing of a candidate but seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy.typing as npt
import structlog

from gpu_runner.compare import kept_defaults, raise_defaults, release_fallbacks
from gpu_runner.errors import EvaluatorFault, InvalidReference, ProtocolError
from gpu_runner.frames import BatchOp, Op, Report, TaskOp, TruthOp, op_frame
from gpu_runner.lease import GpuGate, GpuLease, renice
from gpu_runner.protocol import Blob, tensor_from_wire
from gpu_runner.sandbox import Worker

logger = structlog.get_logger(__name__)


@dataclass
class Truth:
    """The reference's outputs for one seed: what a trial or a timed call is compared with."""

    trial: int
    outputs: list[npt.NDArray[Any]]
    dtypes: list[str]
    residuals: list[npt.NDArray[Any]] | None
    """The float64 outputs minus the reference's (None: no float64 run, ``fp64_error`` says why)."""
    fp64_error: str | None
    default_errors: list[Any] | None = None
    """Per output, the reference's error at PyTorch's defaults on this seed's inputs (where the
    task grants precision parity: :meth:`gpu_runner.compare.PrecisionRule.on_trial`)."""


@dataclass
class Batch:
    """One timed batch as the parent saw it: the process's samples and the parent's own clock."""

    callable: str
    calls: int
    wall_ms: float
    """The parent's clock from sending the batch to its ``timed`` frame (the device synchronised)."""
    samples: list[float]
    warmup: bool = False
    canary_us: float | None = None
    """The referee's canary before this batch (its baselines' batches only)."""
    busy_ms: float = 0.0
    """How long the GPU stayed busy after that canary (the referee waited before timing)."""
    host_us: float | None = None
    """The timing process's host time per call (median; what the lead spin must cover)."""
    draw_us: float | None = None
    """Its host time per call drawing the batch's inputs, and once seeding the draws (what the
    cover spin must cover)."""
    seed_us: float | None = None
    own_launches: int | None = None
    """The candidate's own launches during the batch, as its process counted them."""
    referee_us: float = 0.0
    """The referee's time inside the parent's window on work a candidate's batch does not do (its
    canary and the wait after it, the persisting-L2 reset), by its own clock: taken out of its
    time outside the timed windows where the cross-check asks whether a candidate skipped the
    harness (a candidate's process cannot set it: read from the referee's batches only)."""

    @classmethod
    def from_report(cls, callable_: str, header: dict[str, Any], wall_ms: float, warmup: bool) -> Batch:
        """A ``timed`` frame as the parent keeps it (numbers that are not finite times are dropped:
        a candidate's process may send anything)."""
        launches, canary = header.get("own_launches"), _number(header.get("canary_us"))
        return cls(
            callable=callable_,
            calls=int(header["calls"]),
            wall_ms=wall_ms,
            samples=[float(x) for x in header.get("samples") or []],
            warmup=warmup,
            canary_us=canary,
            busy_ms=_number(header.get("busy_ms")) or 0.0,
            host_us=_number(header.get("host_us")),
            draw_us=_number(header.get("draw_us")),
            seed_us=_number(header.get("seed_us")),
            own_launches=launches if isinstance(launches, int) else None,
            referee_us=(_number(header.get("referee_extra_us")) or 0.0) if callable_ != "candidate" else 0.0,
        )


def _number(value: object) -> float | None:
    """A finite non-negative number, or None."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value >= 0 else None


POOL_SESSIONS = 3
"""Timing sessions of a task whose baseline samples a later session may pool with its own."""


class BaselineLedger:
    """The baselines' samples of a task's recent timing sessions, as the referee measured them.

    Every session times the eager and compiled baselines interleaved with its candidate, but the
    baselines do not change from candidate to candidate: a session that finds samples here times
    each baseline in every other round only (one baseline per round, so the referee still times,
    and looks for left work with its canary, between any two candidate batches), and judges the
    baselines on its own samples and these together, provided the two agree
    (:mod:`gpu_runner.timing_session`). Only sessions whose canaries found no work left running
    (``KF104``) and whose own baselines agreed with what was here are added; a disagreement empties it. It lives
    as long as the referee's process (one task, one GPU)."""

    def __init__(self, sessions: int = POOL_SESSIONS) -> None:
        self.sessions: deque[dict[str, list[float]]] = deque(maxlen=max(1, sessions))
        self.enabled = sessions > 0

    def pooled(self, names: list[str]) -> dict[str, list[float]]:
        """Per baseline in ``names``, the samples of the sessions kept ({} where any is missing)."""
        if not self.enabled:
            return {}
        out = {name: [x for s in self.sessions for x in s.get(name, [])] for name in names}
        return out if out and all(out.values()) else {}

    def add(self, samples: dict[str, list[float]]) -> None:
        if self.enabled and samples and all(samples.values()):
            self.sessions.append({k: list(v) for k, v in samples.items()})

    def clear(self) -> None:
        self.sessions.clear()


class Referee:
    """The parent's handle on the referee process of the current task."""

    def __init__(
        self,
        start: Callable[[], Awaitable[Worker]],
        gate: GpuGate,
        nice: int,
        timeout_s: float,
        pool_sessions: int = POOL_SESSIONS,
    ) -> None:
        self._start = start
        self.gate = gate
        self.nice = nice
        self.timeout_s = timeout_s
        self.worker: Worker | None = None
        self.lock = asyncio.Lock()
        """One op at a time in the referee's process (timing sessions go first: :meth:`background`)."""
        self.sessions_waiting = 0
        self._no_session = asyncio.Event()
        self._no_session.set()
        self.info: dict[str, Any] = {}
        """The ``task_ready`` frame of the current task (sizes, FLOPs, output metadata, range scales)."""
        self.task: str | None = None
        self._first_defaults: dict[str, dict[str, Any]] = {}
        """Per task, its first start's measures of the reference at PyTorch's defaults."""
        self.ledger = BaselineLedger(pool_sessions)
        """The current task's baseline samples from earlier timing sessions."""

    @property
    def alive(self) -> bool:
        """Its process runs (a task was started and it has not died or been stopped)."""
        return self.worker is not None and not self.worker.dead

    @property
    def compiled(self) -> bool:
        return bool(self.info.get("compiled"))

    async def start_task(self, key: str, op: TaskOp, worker: Worker | None = None) -> dict[str, Any]:
        """(Re)start the referee for a task (in ``worker``, a fresh run worker, or a new one) and
        wait for its ``task_ready``; raises :class:`InvalidReference` when the reference itself fails."""
        async with self.lock:
            await self.stop()
            self.worker = worker if worker is not None else await self._start()
            try:
                await self.worker.send(op_frame(Op.TASK, op))
                header, _ = await self._until(Report.TASK_READY, 4 * self.timeout_s)
            except BaseException:
                await self.stop()
                raise
            if not op.get("light") and not op.get("compiled_only"):
                header = self._defaults_kept(key, header)
            self.info, self.task = header, key
            log = logger.debug if op.get("light") else logger.info
            log(
                "truth_worker_ready"
                if op.get("light")
                else "compiled_baseline_ready"
                if op.get("compiled_only")
                else "referee_ready",
                task=key,
                compiled=header.get("compiled"),
                range_scales=header.get("range_scales"),
                canary_quiet_us=header.get("canary_quiet_us"),
                phases={k: round(float(v), 3) for k, v in (header.get("phases") or {}).items()},
            )
            return header

    def _defaults_kept(self, key: str, header: dict[str, Any]) -> dict[str, Any]:
        """``header`` with the first start's measures of the reference at PyTorch's defaults kept
        where this (re)start's fell back (:func:`gpu_runner.compare.kept_defaults`); the first
        start's are remembered per task."""
        first = self._first_defaults.get(key)
        if first is None:
            self._first_defaults[key] = {
                k: header.get(k) for k in ("default_errors", "range_scales", "range_default_errors")
            }
            return header
        merged, kept = kept_defaults(first, header)
        if kept:
            logger.warning(
                "defaults_measure_kept",
                task=key,
                outputs=kept,
                reason="the restarted referee measured the reference at PyTorch's defaults far more "
                "precisely than its first start (cuDNN without the workspace of its TF32 algorithm): "
                "the first start's measure stands",
            )
        return merged

    def raise_defaults(self, key: str, measured: Any, scale: float = 1.0) -> list[int]:
        """Raise the current task's calibration of the reference at PyTorch's defaults for inputs
        drawn at ``scale`` (the typical draws', or a range trial scale's) to a trial's own measure
        there (``measured``) per output where the calibration fell back
        (:func:`gpu_runner.compare.raise_defaults`). The lists are changed in place: the spares'
        ``info`` are shallow copies of :attr:`info`, so the raised calibration holds for every
        spare of the task at once; the first start's record is raised too (later restarts keep it
        where they fall back). Returns the outputs raised (none for another task)."""
        if key != self.task:
            return []
        raised: list[int] = []
        for record in (self.info, self._first_defaults.get(key) or {}):
            if scale == 1.0:
                calibration = record.get("default_errors")
            else:
                scales = [float(s) for s in record.get("range_scales") or []]
                ranged = record.get("range_default_errors") or []
                at = scales.index(scale) if scale in scales else len(ranged)
                calibration = ranged[at] if at < len(ranged) else None
            got = raise_defaults(calibration, measured)  # the first start's list may be this one: raised once
            raised = raised or got
            if scale == 1.0 and isinstance(calibration, list):
                # The range scales' calibrations were measured at the same start: one that fell
                # back beside the raised calibration gives way to it (None: the typical draws' holds).
                for ranged in record.get("range_default_errors") or []:
                    release_fallbacks(ranged, calibration)
        if raised:
            logger.warning(
                "defaults_measure_raised",
                task=key,
                outputs=raised,
                scale=scale,
                reason="a trial measured the reference at PyTorch's defaults far less precisely than the task's "
                "calibration (which ran without the workspace of cuDNN's TF32 algorithm): the trial's measure stands",
            )
        return raised

    async def _until(self, kind: Report, timeout_s: float) -> tuple[dict[str, Any], list[Blob]]:
        """Frames until ``kind``; its header and blobs."""
        got: list[tuple[dict[str, Any], list[Blob]]] = []

        def take(header: dict[str, Any], blobs: list[Blob]) -> bool:
            if header.get("kind") is not kind:
                raise ProtocolError(f"the referee sent {header.get('kind')!r} while {kind.value} was expected")
            got.append((header, blobs))
            return True

        await self._receive(f"waiting for {kind.value}", timeout_s, take)
        return got[0]

    async def _receive(self, what: str, timeout_s: float, take: Callable[[dict[str, Any], list[Blob]], bool]) -> None:
        """The referee's frames to ``take`` until it says it has the last (True), serving the
        shared-lease requests between; a ``reference_error`` raises :class:`InvalidReference`, and
        a referee that times out or dies is stopped (:class:`EvaluatorFault`, naming ``what``)."""
        worker = self._require()
        lease = GpuLease(self.gate, worker, self.nice)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    header, blobs = await worker.recv(1 << 40)
                    kind = header.get("kind")
                    if await lease.handle(kind):
                        continue
                    if kind is Report.REFERENCE_ERROR:
                        raise InvalidReference(str(header.get("message")), str(header.get("traceback", ""))[-2000:])
                    if take(header, blobs):
                        return
        except (TimeoutError, asyncio.IncompleteReadError) as exc:
            await self._fault(worker, exc, what)
        finally:
            await lease.drop()

    async def _fault(self, worker: Worker, exc: BaseException, what: str) -> NoReturn:
        """Stop the referee that timed out or died while ``what``: :class:`EvaluatorFault` with its log."""
        why = "timed out" if isinstance(exc, TimeoutError) else "died"
        log = worker.log_text()[-800:]
        await self.stop()
        raise EvaluatorFault(f"the referee {why} {what}: {log}") from None

    def _require(self) -> Worker:
        if self.worker is None or self.worker.dead:
            raise EvaluatorFault("the referee is not running (its task was not started or it died)")
        return self.worker

    @contextlib.asynccontextmanager
    async def background(self) -> AsyncIterator[None]:
        """The referee for work that can wait (a spare's truth, a judgment): a timing session that
        asks meanwhile goes first (the candidate it times holds the GPU waiting for it)."""
        while True:
            await self._no_session.wait()
            await self.lock.acquire()
            if not self.sessions_waiting:
                break
            self.lock.release()
        try:
            yield
        finally:
            self.lock.release()

    async def truths(
        self,
        seeds: list[int],
        scales: list[float],
        first: int,
        skips: list[int] | None = None,
        timed: bool = False,
        parity: list[bool] | None = None,
        overrides: list[dict[str, int]] | None = None,
    ) -> list[Truth]:
        """The reference's outputs and float64 residuals of ``seeds`` (trial numbers from ``first``;
        ``skips``: per seed, the draws before the one wanted; ``timed``: timed calls' inputs, which
        are drawn on the device; ``parity``: the outputs whose error at PyTorch's defaults to
        measure on each seed's inputs too)."""
        async with self.background():
            worker = self._require()
            op = TruthOp(
                seeds=seeds,
                skips=skips or [0] * len(seeds),
                scales=scales,
                first=first,
                on_device=timed,
                parity=parity or [],
            )
            if overrides:
                op["overrides"] = overrides
            await worker.send(op_frame(Op.TRUTH, op))
            out: list[Truth] = []

            def take(header: dict[str, Any], blobs: list[Blob]) -> bool:
                kind = header.get("kind")
                if kind is Report.REFERENCE_DONE:
                    return True
                if kind is not Report.REFERENCE:
                    raise ProtocolError(f"the referee sent {kind!r} while shipping outputs")
                arrays = [tensor_from_wire(m, b) for m, b in zip(header["tensors"], blobs, strict=True)]
                n = int(header["n_outputs"])
                error = header.get("fp64_error")
                out.append(
                    Truth(
                        trial=int(header["trial"]),
                        outputs=arrays[:n],
                        dtypes=[str(m["dtype"]) for m in header["tensors"][:n]],
                        residuals=arrays[n:] if error is None else None,
                        fp64_error=error,
                        default_errors=header.get("default_errors"),
                    )
                )
                return False

            await self._receive("computing reference outputs", 4 * self.timeout_s, take)
            if len(out) != len(seeds):
                raise ProtocolError(f"the referee shipped {len(out)} outputs for {len(seeds)} seeds")
            return out

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Referee]:
        """The referee to oneself for a timing session (taken before the GPU goes exclusive: a
        truth request holding the referee may be waiting for a shared lease); it runs at nice 0
        meanwhile, as the candidate's process does."""
        self.sessions_waiting += 1
        self._no_session.clear()
        try:
            await self.lock.acquire()
        finally:
            self.sessions_waiting -= 1
            if not self.sessions_waiting:
                self._no_session.set()
        try:
            worker = self._require()
            if self.nice:
                renice(worker.pid, 0)
            try:
                yield self
            finally:
                if self.nice and not worker.dead:
                    renice(worker.pid, self.nice)
        finally:
            self.lock.release()

    async def batch(self, op: BatchOp, timeout_s: float) -> tuple[Batch, dict[str, Any]]:
        """One timed batch of a baseline (inside :meth:`session`, under the exclusive lease)."""
        worker = self._require()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                await worker.send(op_frame(Op.BATCH, op))
                header, _ = await worker.recv(1 << 40)
        except (TimeoutError, asyncio.IncompleteReadError) as exc:
            await self._fault(worker, exc, f"timing the {op['callable']} baseline")
        wall = (time.perf_counter() - t0) * 1e3
        if header.get("kind") is not Report.TIMED:
            raise EvaluatorFault(f"the referee could not time {op['callable']}: {str(header.get('message'))[:500]}")
        batch = Batch.from_report(op["callable"], header, wall, op["warmup"])
        return batch, header

    async def canary(self, timeout_s: float = 30.0) -> tuple[float, float]:
        """The canary's host latency now and how long the GPU stayed busy (inside :meth:`session`)."""
        worker = self._require()
        async with asyncio.timeout(timeout_s):
            await worker.send(op_frame(Op.CANARY))
            header, _ = await worker.recv(1 << 20)
        if header.get("kind") is not Report.CANARY:
            raise EvaluatorFault(f"the referee answered the canary with {header.get('kind')!r}")
        return float(header["host_us"]), float(header.get("busy_ms") or 0.0)

    async def stop(self) -> None:
        """Kill the referee's process (the caller holds :attr:`lock`); the pool starts another for
        the task's next evaluation."""
        if self.worker is not None:
            await self.worker.kill(sweep=False)
            self.worker = None
            self.task = None
            self.info = {}
        self.ledger.clear()

    async def aclose(self) -> None:
        async with self.lock:
            await self.stop()
