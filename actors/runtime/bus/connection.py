"""The ``Bus`` itself: connecting (a cluster, bounded or endless attempts, reconnects) and the
lossless close, over the concerns it is made of (sending, receiving, services, streams)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

import nats
import nats.errors
import nats.js.errors

from actors.runtime.bus.calls import short
from actors.runtime.bus.receiving import Receiving
from actors.runtime.bus.services import Serving
from actors.runtime.bus.streams import Streams
from actors.runtime.errors import BusError
from actors.runtime.logs import get_logger
from actors.runtime.stats import StatsRecorder
from schemas import subjects

log = get_logger(__name__)


class Bus(Receiving, Serving, Streams):
    """A typed connection to NATS for one actor (see the docstring of ``actors.runtime.bus``)."""

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        actor_id: str,
        dlq_run: str = subjects.NO_RUN,
        stats: StatsRecorder | None = None,
        connect_timeout: float | None = 5.0,
        stop: asyncio.Event | None = None,
        kind: str = "",
        quiet: bool = False,
    ) -> Bus:
        """Connect to ``url`` (a comma-separated list joins a cluster).

        With ``connect_timeout`` (a one-shot command), give up after that many seconds, and give up
        on a lost connection after about as long: ``BusError`` in one line. With ``None`` (a
        long-running actor), keep trying for ever, one log line per failed attempt, until ``stop``
        is set (then ``BusError`` at once). ``quiet``: no log line for failed attempts, lost and
        restored connections (a process's second connection, whose first says so already).
        """
        servers = [u.strip() for u in url.split(",")]
        last: list[BaseException] = []

        async def on_error(exc: Exception) -> None:
            last[:] = [exc]
            if connect_timeout is None and not quiet:
                log.warning("NATS connection attempt failed", url=url, error=short(exc))

        made: list[Bus] = []

        async def on_disconnect() -> None:
            if made:
                made[0]._dropped()
            if not (made and made[0]._closed) and not quiet:
                log.warning("NATS connection lost, reconnecting", url=url)

        async def on_reconnect() -> None:
            if made:
                made[0].online.set()
            if not quiet:
                log.info("NATS connection restored", url=url)

        async def on_closed() -> None:
            if made and not made[0]._closed:
                made[0].lost.set()  # gave up reconnecting (a one-shot command's bounded attempts)

        wait = 1.0
        per_attempt, attempts = 2.0, -1
        if connect_timeout is not None:
            per_attempt, attempts = min(connect_timeout, 2.0), max(2, math.ceil(connect_timeout / wait))
        connecting = asyncio.ensure_future(
            nats.connect(
                servers=servers,
                name=name,
                connect_timeout=per_attempt,
                reconnect_time_wait=wait,
                max_reconnect_attempts=attempts,
                allow_reconnect=True,
                pending_size=64 * 1024 * 1024,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                closed_cb=on_closed,
            )
        )
        waiters: set[asyncio.Future[Any]] = {connecting}
        stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if stopped is not None:
            waiters.add(stopped)
        try:
            done, _ = await asyncio.wait(waiters, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopped is not None:
                stopped.cancel()
        if connecting in done:
            try:
                nc = connecting.result()
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                raise BusError(f"cannot connect to NATS at {url}: {short(exc)}") from exc
            made.append(cls(nc, actor_id=actor_id, dlq_run=dlq_run, stats=stats, kind=kind))
            return made[0]
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        if stop is not None and stop.is_set():
            raise BusError(f"stopped while connecting to NATS at {url}")
        why = f" (last error: {short(last[0])})" if last else ""
        raise BusError(f"cannot reach NATS at {url} within {connect_timeout:g} s{why}")

    # -- shutdown --------------------------------------------------------------------------

    async def close(self) -> None:
        """The lossless shutdown order (see the docstring of ``actors.runtime.bus``). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        # Every pull loop stops fetching at once (each may be inside a fetch of up to its poll_s), then
        # each lets its in-hand messages ack or nak: side by side, not one consumer after another.
        for consumer in self._consumers:
            consumer.stopping.set()
        await asyncio.gather(*(consumer.stop() for consumer in self._consumers))
        for core in self._core:
            with contextlib.suppress(nats.errors.Error):
                await core.sub.drain()  # type: ignore[no-untyped-call]
        for endpoint in self._endpoints:
            for ep in getattr(endpoint.service, "_endpoints", []):
                sub = getattr(ep, "_subscription", None)
                if sub is not None:
                    with contextlib.suppress(nats.errors.Error):
                        await sub.drain()
        # Drained subscriptions have handed their pending messages to our workers: wait for them.
        for core in self._core:
            await core.workers.join()
        for endpoint in self._endpoints:
            await endpoint.workers.join()
        if not self.nc.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self.nc.drain()
