"""How messages reach handlers: a message's ``Delivery``, the handler types, a durable pull
consumer's ``ConsumerSpec``, the bounded set of handler tasks (``Workers``) and the running
subscriptions they serve (``PullConsumer``, ``CoreSub``, ``Endpoint``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.micro.service import Service

from actors.runtime.bus.calls import short
from actors.runtime.logs import get_logger
from schemas import Message

M = TypeVar("M", bound=Message)
R = TypeVar("R", bound=Message)

log = get_logger(__name__)


@dataclass(frozen=True)
class Delivery:
    """How a message arrived: its subject and, for JetStream, its delivery bookkeeping."""

    subject: str
    headers: dict[str, str]
    num_delivered: int = 1
    stream_seq: int | None = None
    max_deliver: int | None = None

    @property
    def last_attempt(self) -> bool:
        """Whether a failure now is final (the message will be dead-lettered)."""
        return self.max_deliver is not None and self.num_delivered >= self.max_deliver


Handler = Callable[[M, Delivery], Awaitable[None]]
ReplyHandler = Callable[[M], Awaitable[R]]


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer of a stream."""

    stream: str
    durable: str
    filter_subject: str
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    backoff_s: tuple[float, ...] = (0.5, 2.0, 5.0, 15.0)
    """Delay of the nak after the n-th failed attempt (the last value repeats)."""
    batch: int = 64
    heartbeat_s: float | None = None
    """How often ``in_progress`` is sent while a handler runs (default ack_wait / 3)."""
    deliver_all: bool = True
    max_ack_pending: int = 10_000
    poll_s: float = 0.25
    """Longest wait of one fetch for the first message (the server holds the pull request that
    long). A stop waits for the fetch in progress, so this bounds how long a consumer takes to
    notice a stop; a shorter wait only adds idle pull requests (four a second at 0.25 s)."""

    def nak_delay(self, attempt: int) -> float:
        return self.backoff_s[min(attempt - 1, len(self.backoff_s) - 1)] if self.backoff_s else 0.0


def delivered_and_seq(raw: Msg) -> tuple[int, int]:
    """How many times a JetStream message was delivered and its stream sequence, read from its
    reply subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
    <pending>``) without nats-py's whole ``Metadata`` (its timestamp and nested dataclasses were a
    twentieth of a hop's CPU); the other forms (with a domain) through ``Metadata``."""
    tokens = (raw.reply or "").split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[4]), int(tokens[5])
    meta = raw.metadata
    return int(meta.num_delivered), int(meta.sequence.stream)


class Workers:
    """A bounded set of handler tasks: ``spawn`` waits for a free slot, ``join`` waits for all."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"concurrency must be >= 1, got {limit}")
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> int:
        return len(self._tasks)

    @property
    def free(self) -> int:
        return self.limit - len(self._tasks)

    async def spawn(self, coro: Awaitable[None]) -> None:
        await self._slots.acquire()
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("handler task crashed", error=short(task.exception()))  # type: ignore[arg-type]

    async def wait_free(self) -> None:
        await self._slots.acquire()
        self._slots.release()

    def cancel(self) -> int:
        """Cancel every running handler; returns how many there were."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def join(self) -> None:
        """Wait until every handler has finished and been removed.

        A task that is done stays in ``_tasks`` until its done-callback runs, which needs the
        event loop to turn; and awaiting ``gather`` over tasks that are all done returns without
        yielding (Python 3.12). Looping on that spun forever with the loop blocked (seen on an
        H100: a run's evaluator drained for ever after its cancelled evaluations ended, and no
        timeout of the process could fire). So: wait only for unfinished tasks, and let the
        loop turn before looking again."""
        while self._tasks:
            pending = [task for task in self._tasks if not task.done()]
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.sleep(0)


@dataclass
class CoreSub:
    sub: Subscription
    workers: Workers


@dataclass
class PullConsumer:
    """A running durable pull consumer; ``stop`` is the lossless shutdown.

    Its messages come to a subscription of its own (``inbox``) as answers to pull requests on
    ``next_subject``, one request at a time for as many messages as there are free workers; each is
    handed to a worker as it arrives (not gathered by nats-py's ``fetch``, which cost four times as
    much CPU per message). A request ends when all its messages came, or with a status from the
    server (408: its wait of ``poll_s`` is over), or, lost in a reconnect, after its wait."""

    spec: ConsumerSpec
    workers: Workers
    next_subject: str = ""
    """Where pull requests go (``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>``)."""
    inbox: str = ""
    """Where the server delivers the messages of this consumer's pull requests."""
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    psub: Any = None
    """The subscription on ``inbox``."""
    in_hand: dict[int, tuple[Msg, float]] = field(default_factory=dict)
    """Messages being handled and when their last heartbeat (or receipt) was."""
    beat_task: asyncio.Task[None] | None = None
    awaiting: int = 0
    """Messages the pull request in progress may still bring."""
    request_over: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the pull request in progress has ended (its messages came, or a status said so)."""
    trouble: str = ""
    """The last status that ended a request for a reason other than an empty or expired wait."""
    aborted: bool = False
    """Set by ``abort``: messages that still come are nak'ed, not handled."""

    async def heartbeats(self) -> None:
        """One loop per consumer: ``in_progress`` for every message held longer than the interval,
        so long jobs are not redelivered while they run (cheaper than a task per message)."""
        every = self.spec.heartbeat_s or self.spec.ack_wait_s / 3
        while True:
            await asyncio.sleep(every / 2)
            now = time.monotonic()
            for key, (msg, last) in list(self.in_hand.items()):
                if now - last >= every and key in self.in_hand:
                    self.in_hand[key] = (msg, now)
                    with contextlib.suppress(nats.errors.Error):
                        await msg.in_progress()

    def abort(self) -> int:
        """Stop fetching and cancel the handlers now: what they held is neither acked nor nak'ed
        (the stream keeps it). Returns how many were cancelled."""
        self.aborted = True
        self.stopping.set()
        return self.workers.cancel()

    async def stop(self) -> None:
        """Stop fetching, let in-hand messages ack or nak (with what the pull request in progress
        still brings: it ends within ``poll_s``), then unsubscribe."""
        self.stopping.set()
        if self.task is not None:
            await self.task
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.spec.poll_s + 0.5):
                await self.request_over.wait()
        await self.workers.join()
        if self.beat_task is not None:
            self.beat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.beat_task
        if self.psub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.psub.unsubscribe()


@dataclass
class Endpoint:
    service: Service
    workers: Workers
