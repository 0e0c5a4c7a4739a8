"""A process's log lines, also on NATS: ``kflog.<run>.<actor>`` subjects kept in the ``KF_LOGS``
stream, so that ``kfoundry logs RUN`` gathers every actor's lines of a run wherever it runs (in
distributed mode each actor's stderr stays on its own machine).

The lines are the process's own (JSON, as on stderr), sent by a handler that only queues them: a
task publishes the queue over a connection of its own, which comes up in the background (an
actor never waits for it), and what was queued before it came up goes first. At most
:data:`MAX_PENDING` lines wait; beyond that the oldest are dropped, and counted in a line of their
own. What is queued when the process ends is published before it leaves (within
:data:`FLUSH_S`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

from actors.runtime.logs import add_handler, get_logger, remove_handler
from schemas import subjects

log = get_logger(__name__)

MAX_PENDING = 10_000
"""Log lines that may wait for the connection; the oldest are dropped beyond."""
FLUSH_S = 3.0
"""How long a process's end waits for its last lines to reach the server."""


class LogShipper(logging.Handler):
    """Queues every formatted log line for :func:`shipping_logs`' publisher (any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: collections.deque[bytes] = collections.deque()
        self._lock = threading.Lock()
        self.dropped = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record).encode()
        except Exception:  # noqa: BLE001 - logging's contract: a bad record never raises here
            self.handleError(record)
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(line)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the lines stay queued
                loop.call_soon_threadsafe(wake.set)

    def take(self) -> tuple[list[bytes], int]:
        """The queued lines, and how many were dropped since the last call."""
        with self._lock:
            lines = list(self._pending)
            self._pending.clear()
            dropped, self.dropped = self.dropped, 0
        return lines, dropped


@contextlib.asynccontextmanager
async def shipping_logs(url: str, *, run: str | None, actor: str) -> AsyncIterator[LogShipper]:
    """Within the block, this process's log lines go also to ``kflog.<run>.<actor>`` (``run``
    ``None``: ``_``, an actor of no particular run)."""
    shipper = LogShipper()
    add_handler(shipper)
    subject = subjects.logs(run or subjects.NO_RUN, actor)
    ended = asyncio.Event()
    task = asyncio.ensure_future(_publish(shipper, url, subject, actor, ended))
    try:
        yield shipper
    finally:
        ended.set()
        if shipper._wake is not None:
            shipper._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), FLUSH_S)
        except TimeoutError:
            task.cancel()
            await asyncio.wait([task])
        finally:
            remove_handler(shipper)


async def _publish(shipper: LogShipper, url: str, subject: str, actor: str, ended: asyncio.Event) -> None:
    from actors.runtime.bus import Bus
    from actors.runtime.errors import BusError

    shipper._loop = asyncio.get_running_loop()
    shipper._wake = wake = asyncio.Event()
    try:  # endless attempts while the process lives (an actor's own connection does the same)
        bus = await Bus.connect(
            url, name=f"kfoundry-logs-{actor}", actor_id=f"logs-{actor}", connect_timeout=None, stop=ended, quiet=True
        )
    except BusError:
        return  # the process ended before NATS could be reached: its lines stay on its stderr
    try:
        with contextlib.suppress(Exception):  # a server that refuses streams still takes the lines' subjects
            await bus.ensure_log_stream()
        while True:
            lines, dropped = shipper.take()
            if dropped:
                note = f'{{"event": "log lines dropped while NATS was unreachable", "dropped": {dropped}}}'
                await bus.nc.publish(subject, note.encode())
            for line in lines:
                await bus.nc.publish(subject, line)
            if lines or dropped:
                with contextlib.suppress(Exception):
                    await bus.nc.flush(timeout=int(FLUSH_S))
            if ended.is_set():
                return
            wake.clear()
            if not shipper._pending:
                await wake.wait()
    finally:
        await bus.close()
