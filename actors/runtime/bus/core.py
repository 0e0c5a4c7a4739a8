"""The state every part of the bus shares (``BusCore``): the connection, the actor's identity and
statistics, the running subscriptions, and the switches that pause, resume or abort them."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.runtime.bus.delivery import CoreSub, Endpoint, PullConsumer
from actors.runtime.stats import StatsRecorder
from schemas import subjects


class BusCore:
    """A bus's connection and state, and its switches: pause and resume fetching, abort. The
    concerns of :class:`~actors.runtime.bus.connection.Bus` build on it: sending
    (:class:`~actors.runtime.bus.sending.Sending`), receiving, services and streams."""

    def __init__(
        self,
        nc: NATS,
        *,
        actor_id: str,
        dlq_run: str = subjects.NO_RUN,
        stats: StatsRecorder | None = None,
        kind: str = "",
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.jsm = nc.jsm()
        self.actor_id = actor_id
        self.kind = kind
        """The actor kind, a label of the handling-time histogram (``actors.runtime.latency``)."""
        self.dlq_subject = subjects.dead_letters(dlq_run)
        self.stats = stats or StatsRecorder()
        self._core: list[CoreSub] = []
        self._consumers: list[PullConsumer] = []
        self._endpoints: list[Endpoint] = []
        self._closed = False
        self._running = asyncio.Event()
        self._running.set()
        self._reply_prefix: str | None = None
        """Subject prefix of the answers this bus waits for: requests' replies and JetStream
        acknowledgements (see :meth:`_answer`)."""
        self._reply_lock = asyncio.Lock()
        self._reply_ids = itertools.count()
        self._replies: dict[str, asyncio.Future[Msg]] = {}
        self.online = asyncio.Event()
        """Set while the connection is up (cleared from a drop until the client reconnects)."""
        self.online.set()
        self.lost = asyncio.Event()
        """Set when the client gave up on a lost server (bounded reconnects) without being closed."""

    def pause(self) -> None:
        """Stop fetching from pull consumers (in-hand messages finish)."""
        self._running.clear()

    def resume(self) -> None:
        """Fetch again."""
        self._running.set()

    def abort_consumers(self) -> int:
        """Cancel the work in hand of every pull consumer at once (see ``PullConsumer.abort``)."""
        return sum(consumer.abort() for consumer in self._consumers)

    async def abort(self) -> int:
        """Stop at once: cancel every handler (pull, core and endpoint), close the connection
        without draining. Unacknowledged JetStream messages are redelivered later; core and
        request messages in hand are lost (a request's sender gets a timeout). Returns how many
        handlers were cancelled."""
        self._closed = True
        n = self.abort_consumers()
        n += sum(core.workers.cancel() for core in self._core)
        n += sum(endpoint.workers.cancel() for endpoint in self._endpoints)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.nc.close()
        return n

    @property
    def in_hand(self) -> int:
        """Messages the pull consumers' handlers hold now."""
        return sum(consumer.workers.busy for consumer in self._consumers)
