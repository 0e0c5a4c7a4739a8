"""Who may use the GPU when (parent side): timing alone, everything else together.

A candidate's timing must not overlap any other GPU work of ours, or its numbers (and the
baselines timed beside it) are disturbed. bench/gpu_interference.py measured on an H200 what
another process's activity does to a ~50 us kernel timed the way ``gpu_runner.sandboxed.timing`` does:
host-to-device copies moved the median by 0.9% and the 99th percentile by 12%, a 1 GB allocation
the median by 2%; a CUDA context start, Triton's driver load and CUPTI's start moved neither. So
the GPU steps of a worker run under a lease from the parent's :class:`GpuGate`:

* *candidate* (a candidate from ``go`` until its trials are done: import, construction, the
  correctness trials): at most ``max_concurrent_runs`` candidates alive on the GPU at once, and
  spares' shared work may run beside it (no timing is running, and a spare is trusted code);
* *exclusive* (the candidate's timing and profile, after :meth:`GpuGate.upgrade`): no other
  holder at all;
* *shared* (a spare moving the reference and its inputs to the device, computing the reference's
  outputs, compiling the baseline, copying the results out): any number together, never during
  an exclusive hold. A spare's CUDA start needs no lease.

So no candidate code is alive on the GPU outside a candidate's own lease, and nothing overlaps
a timing. A waiting exclusive request (an upgrade) stops new shared grants; shared holders that
already run finish first. When an exclusive hold ends, the spares waiting then are let in
together before the next exclusive request (phase-fair), so a queue of candidates cannot starve
the spares that the candidates after it need. On the H200 a spare's GPU work (0.1-0.4 s) hid in
a candidate's trials this way instead of adding to the GPU time of every candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from gpu_runner.frames import Op, OpFrame, Report, op_frame

Turn = tuple[float, int]
"""An evaluation's place in line: (its candidate's rank, its arrival at the evaluator); lower first."""
UNRANKED = float("inf")
"""The rank of a candidate that has none (``Candidate.rank`` is ``None``): after every ranked one."""
ARM_PATIENCE_S = 0.5
"""How long an armed candidate lets the GPU wait for a better-ranked one still arming (its job
staged, its module imported) before it goes first: at a run's start the first spares are armed
together, and the first starting point should not lose the GPU to the fastest import."""
COMPILE_PATIENCE_S = 10.0
"""How long a compiled candidate lets a better-ranked one still being gated or compiled go first
(:class:`CompileLine`, ``RunnerConfig.compile_patience_s``'s default)."""


def renice(pgid: int, value: int) -> OSError | None:
    """Set the niceness of a worker's whole process group (every thread); the error if refused."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, value)
    except OSError as exc:
        return exc
    return None


class TurnLock:
    """A lock (``capacity`` holders at once: a semaphore) handed to its waiters by turn (lowest
    first) instead of in the order they came."""

    def __init__(self, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"a turn lock holds at least one, not {capacity}")
        self.capacity = capacity
        self.holders = 0
        self._waiting: set[Turn] = set()
        self._changed = asyncio.Condition()

    @property
    def held(self) -> bool:
        """Whether no one else may take it now."""
        return self.holders >= self.capacity

    async def acquire(self, turn: Turn) -> None:
        self._waiting.add(turn)
        acquired = False
        try:
            await asyncio.sleep(0)  # those woken with it (by the task's plan, at a run's start) get in line first
            async with self._changed:
                await self._changed.wait_for(lambda: not self.held and turn == min(self._waiting))
                self.holders += 1
                acquired = True
                self._waiting.discard(turn)
                self._changed.notify_all()  # the next in line, where room is left
        finally:
            if not acquired:  # cancelled: the next in line may go now
                self._waiting.discard(turn)
                await asyncio.shield(self._wake())

    async def release(self) -> None:
        self.holders -= 1
        await self._wake()

    async def _wake(self) -> None:
        """Have the waiters look again (who is first in line, and whether the lock is free)."""
        async with self._changed:
            self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def hold(self, turn: Turn) -> AsyncIterator[None]:
        await self.acquire(turn)
        try:
            yield
        finally:
            await asyncio.shield(self.release())


class CompileLine:
    """Evaluations not yet in line for a spare (gated, compiled, compiled at the held-out shapes),
    by turn. One ready to line up waits while a better-ranked one is still here, for at most a
    patience: the spares, the one-at-a-time lock and the GPU take candidates by turn, but only
    those already waiting. At a run's start (an H200, KernelBench L1-63, two islands of four) the
    candidate whose kernels compiled first took the first spare: a mutation at 0.31x eager became
    the first verdict, while the islands' first starting point, ranked 0, ran 1.16x, the run's best.
    """

    def __init__(self) -> None:
        self._here: set[Turn] = set()
        self._changed = asyncio.Condition()

    def enter(self, turn: Turn) -> None:
        """An evaluation arrived (before its gate)."""
        self._here.add(turn)

    async def leave(self, turn: Turn) -> None:
        """It lines up for a spare, or ended before (idempotent)."""
        if turn in self._here:
            self._here.discard(turn)
            async with self._changed:
                self._changed.notify_all()

    def ahead(self, turn: Turn) -> int:
        """Better-ranked evaluations still being gated or compiled."""
        return sum(1 for other in self._here if other < turn)

    async def wait_turn(self, turn: Turn, patience_s: float, worth: Callable[[Turn], bool] | None = None) -> float:
        """Wait while a better-ranked evaluation is still here, for ``patience_s`` at most; then
        leave. ``worth``: which of those better-ranked now are waited for (default: all). The
        seconds waited."""
        started = time.perf_counter()
        try:
            awaited = {other for other in self._here if other < turn and (worth is None or worth(other))}
            if awaited:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(patience_s), self._changed:
                        await self._changed.wait_for(lambda: not awaited & self._here)
        finally:
            await self.leave(turn)
        return time.perf_counter() - started


class GpuGate:
    """A readers-writer gate over the GPU, phase-fair (asyncio, one event loop).

    A waiting exclusive request stops new shared grants, but when an exclusive hold ends, the
    shared requests waiting at that moment go first, together, before the next exclusive one. With
    plain writer preference a queue of armed candidates kept every spare off the GPU until the
    queue was empty, and the GPU then sat idle while the spares caught up (H200 stream: a spare
    waited up to 3.4 s for its lease, the GPU waited 3.5 s of 30 s for spares).
    """

    def __init__(self, max_exclusive: int = 1) -> None:
        self.max_exclusive = max_exclusive
        self.shared_holders = 0
        self.candidate_holders = 0
        """Candidates in their trials (spares may run beside them)."""
        self.exclusive_holders = 0
        self.exclusive_waiting = 0
        self._shared_waiters: set[int] = set()
        self._turn: set[int] = set()
        """Shared waiters let in ahead of waiting exclusive requests (those waiting when one ended)."""
        self._tickets = itertools.count()
        self._candidates_waiting: set[Turn] = set()
        """Armed candidates waiting for their lease, by turn."""
        self._expected: set[Turn] = set()
        """Candidates holding a spare, not armed yet (:meth:`expect`)."""
        self._changed = asyncio.Condition()
        self.seconds = {"exclusive": 0.0, "candidate": 0.0, "shared": 0.0, "idle": 0.0}
        """Time the GPU spent held exclusively, by a candidate's trials (spares perhaps beside it),
        by spares only, and not held (for benchmarks)."""
        self._since = time.perf_counter()

    def state(self) -> str:
        """``exclusive``, ``candidate`` (spares perhaps beside it), ``shared`` (spares only) or ``idle``."""
        if self.exclusive_holders:
            return "exclusive"
        if self.candidate_holders:
            return "candidate"
        return "shared" if self.shared_holders else "idle"

    def _account(self) -> None:
        """Add the time since the last change to the state the gate was in (call before a change)."""
        now = time.perf_counter()
        self.seconds[self.state()] += now - self._since
        self._since = now

    def usage(self) -> dict[str, float]:
        """The accounting up to now."""
        self._account()
        return dict(self.seconds)

    async def acquire_shared(self) -> None:
        async with self._changed:
            ticket = next(self._tickets)
            self._shared_waiters.add(ticket)
            try:
                await self._changed.wait_for(
                    lambda: not self.exclusive_holders and (ticket in self._turn or not self.exclusive_waiting)
                )
            finally:
                self._shared_waiters.discard(ticket)
                if ticket in self._turn:
                    self._turn.discard(ticket)
                    if not self._turn:
                        self._changed.notify_all()  # the turn is over (a cancelled waiter may end it)
            self._account()
            self.shared_holders += 1

    def _runs(self) -> int:
        return self.candidate_holders + self.exclusive_holders

    async def expect(self, turn: Turn) -> None:
        """A candidate holding a spare will ask for its lease (:meth:`acquire_candidate`) once armed:
        armed ones ranked after it wait for it a little (:data:`ARM_PATIENCE_S`)."""
        async with self._changed:
            self._expected.add(turn)

    async def forget(self, turn: Turn) -> None:
        """The candidate of ``turn`` will not ask for its lease (it failed before, or has it)."""
        async with self._changed:
            if turn in self._expected:
                self._expected.discard(turn)
                self._changed.notify_all()

    def _candidate_may_run(self, me: Turn, patient_until: float) -> bool:
        if self.exclusive_holders or self.exclusive_waiting:
            return False
        ahead = sum(1 for other in self._candidates_waiting if other < me)
        if self._runs() + ahead >= self.max_exclusive:
            return False
        return time.perf_counter() >= patient_until or not any(other < me for other in self._expected)

    async def acquire_candidate(self, turn: Turn | None = None) -> None:
        """A candidate's lease for its trials: no timing running, fewer than the bound of runs, and
        the candidates waiting together let in by ``turn`` (lowest first; none given: last, in
        arrival order), a better-ranked one still arming waited for up to :data:`ARM_PATIENCE_S`."""
        async with self._changed:
            me = turn if turn is not None else (UNRANKED, next(self._tickets))
            self._expected.discard(me)
            self._candidates_waiting.add(me)
            patient_until = time.perf_counter() + ARM_PATIENCE_S
            try:
                while not self._candidate_may_run(me, patient_until):
                    left = patient_until - time.perf_counter()
                    if left > 0 and any(other < me for other in self._expected):
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(left):
                                await self._changed.wait()
                    else:
                        await self._changed.wait()
            finally:
                self._candidates_waiting.discard(me)
                self._changed.notify_all()  # the next in line may go now (or must wait again)
            self._account()
            self.candidate_holders += 1

    async def upgrade(self) -> None:
        """Turn a candidate lease into an exclusive one (for its timing) once the spares beside it
        are done; new shared grants wait meanwhile. The only way to the exclusive lease."""
        async with self._changed:
            self.exclusive_waiting += 1
            try:
                await self._changed.wait_for(lambda: not self.shared_holders and not self._turn)
            finally:
                self.exclusive_waiting -= 1
                self._changed.notify_all()  # a cancelled upgrade may unblock shared requests
            self._account()
            self.candidate_holders -= 1
            self.exclusive_holders += 1

    async def release(self, exclusive: bool, candidate: bool = False) -> None:
        """Give back an exclusive, a candidate (``candidate``) or a shared lease."""
        async with self._changed:
            self._account()
            if exclusive:
                self.exclusive_holders -= 1
                self._turn = set(self._shared_waiters)
            elif candidate:
                self.candidate_holders -= 1
            else:
                self.shared_holders -= 1
            self._changed.notify_all()


class _Peer(Protocol):
    """What a lease needs of a worker: its process group and a way to answer it."""

    @property
    def pid(self) -> int: ...

    async def send(self, header: OpFrame) -> None: ...


@dataclass
class GpuLease:
    """The parent's side of one worker's shared-lease requests (``gpu_acquire`` / ``gpu_release``).

    While the worker holds the lease it runs at nice 0 (the GPU waits on it); it goes back to
    ``nice`` afterwards. :meth:`drop` releases a lease the worker never gave back (it died), or
    one kept (``keep``) across the worker's requests.
    """

    gate: GpuGate
    worker: _Peer
    nice: int = 0
    keep: bool = False
    """Keep the lease when the worker gives it back, for its next request (:meth:`drop` ends it)."""
    held: bool = False
    parked: bool = False
    """Held for the worker while it does not use it (``keep``)."""
    granted: float = 0.0
    seconds: float = 0.0

    def _renice(self, value: int) -> None:
        if self.nice:
            renice(self.worker.pid, value)

    async def handle(self, kind: object) -> bool:
        """Act on a lease frame; False for any other frame."""
        if kind == Report.GPU_ACQUIRE and (not self.held or self.parked):
            if not self.held:
                await self.gate.acquire_shared()
                self.held, self.granted = True, time.perf_counter()
                self._renice(0)
            self.parked = False
            await self.worker.send(op_frame(Op.GPU_GRANTED))
            return True
        if kind == Report.GPU_RELEASE and self.held and not self.parked:
            if self.keep:
                self.parked = True
            else:
                await self.drop()
            return True
        return False

    async def drop(self) -> None:
        if self.held:
            self.held = self.parked = False
            self._renice(self.nice)
            self.seconds += time.perf_counter() - self.granted
            await asyncio.shield(self.gate.release(exclusive=False))
