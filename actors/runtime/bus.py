"""The bus: one thin, typed layer over nats-py.

Everything an actor sends or receives goes through here:

- ``publish`` (core) and ``publish_durable`` (JetStream, with a ``Nats-Msg-Id`` dedup id);
- ``request`` (typed request/reply; micro error replies become ``RemoteError``);
- ``subscribe`` (core, bounded concurrent handlers);
- ``consume`` (a JetStream durable pull consumer: explicit ack, ``in_progress`` heartbeats while a
  handler runs, nak with backoff, dead letter at the last delivery, ``Retry``/``Drop``/``Poison``);
- ``serve`` (a typed ``nats.micro`` endpoint with bounded concurrent handlers).

Every payload is validated against its pydantic type. A malformed one never reaches a handler:
it is counted, logged and published to the dead-letter subject ``kf.dlq.<run>`` with the
validation error, and the actor keeps serving.

Shutdown (``close``) loses nothing: stop fetching, let in-hand work ack or nak, unsubscribe pull
subscriptions, drain core and endpoint subscriptions while their handlers finish, drain the
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pydantic
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import (
    DEFAULT_PREFIX,
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from actors.runtime.errors import BusError, ConfigError, Drop, NoResponders, Poison, RemoteError, RequestTimeout, Retry
from actors.runtime.latency import Outcome, Transport, observe_handle
from actors.runtime.logs import get_logger
from actors.runtime.stats import StatsRecorder
from schemas import DeadLetter, Message, subjects

M = TypeVar("M", bound=Message)
R = TypeVar("R", bound=Message)

MSG_ID_HEADER = "Nats-Msg-Id"
STATUS_HEADER = "Status"
"""Set (with an empty payload) on the server's answers about a pull request itself."""
DESCRIPTION_HEADER = "Description"
_PAYLOAD_LIMIT = 64 * 1024

log = get_logger(__name__)
NO_RESPONDERS_RETRY_S = 0.05
"""How long a request that found no responders waits before asking once more."""
MAX_DROPS = 10
"""Connection drops one request or durable publish is sent again across before it fails."""
RECONNECT_WAIT_S = 60.0
"""How long a durable publish whose connection dropped waits for the reconnect."""
SETTLE_S = 60.0
"""How long an idempotent JetStream call (a bucket or key read, a consumer's creation) is asked
again while the server cannot answer: a server restarting, a cluster electing a new stream leader
after losing one of its servers, or one so loaded that the API's answer is late. In the cluster
failover test, islands starting while a server was down got ``nats: timeout`` from a key read and
exited; each of these calls is safe to repeat."""
T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not answer now (not that the answer was no)."""
    if isinstance(exc, nats.js.errors.APIError):
        return getattr(exc, "code", None) in (500, 503)  # JetStream temporarily unavailable, no leader yet
    return isinstance(
        exc,
        (
            TimeoutError,  # nats.errors.TimeoutError among them
            nats.errors.ConnectionReconnectingError,
            nats.errors.NoRespondersError,  # the JetStream API itself, while it starts
            nats.js.errors.NoStreamResponseError,
        ),
    )


async def settled(what: str, op: Callable[[], Awaitable[T]], *, within_s: float | None = None) -> T:
    """``await op()``, asked again with backoff while it fails transiently (:func:`transient`), for up
    to ``within_s`` seconds (default :data:`SETTLE_S`); then :class:`BusError` naming ``what``. ``op``
    must be safe to repeat."""
    within_s = SETTLE_S if within_s is None else within_s
    deadline = time.monotonic() + within_s
    delay = 0.1
    while True:
        try:
            return await op()
        except Exception as exc:  # classified below: anything not transient is raised as it is
            if not transient(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise BusError(f"{what}: the NATS server did not answer within {within_s:g} s ({_short(exc)})") from exc
            log.warning("NATS call failed, asking again", what=what, error=_short(exc), retry_in_s=round(delay, 2))
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)


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


def _payload_text(data: bytes) -> str:
    return data[:_PAYLOAD_LIMIT].decode("utf-8", errors="backslashreplace")


def _delivered_and_seq(raw: Msg) -> tuple[int, int]:
    """How many times a JetStream message was delivered and its stream sequence, read from its
    reply subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
    <pending>``) without nats-py's whole ``Metadata`` (its timestamp and nested dataclasses were a
    twentieth of a hop's CPU); the other forms (with a domain) through ``Metadata``."""
    tokens = (raw.reply or "").split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[4]), int(tokens[5])
    meta = raw.metadata
    return int(meta.num_delivered), int(meta.sequence.stream)


class ConnectionDropped(Exception):
    """The connection dropped while an answer was awaited (see ``Bus._answer``)."""


def _status(msg: Msg) -> str | None:
    """The status of a server's answer about a message itself (empty payload), e.g. '503' for no
    responders; None for an answer with a body."""
    return msg.headers.get(STATUS_HEADER) if msg.headers and not msg.data else None


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


async def _wait_any_for(seconds: float, event: asyncio.Event) -> None:
    """Sleep ``seconds``, or less when ``event`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def _wait_any(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class _Workers:
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
            log.error("handler task crashed", error=_short(task.exception()))  # type: ignore[arg-type]

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
class _CoreSub:
    sub: Subscription
    workers: _Workers


@dataclass
class PullConsumer:
    """A running durable pull consumer; ``stop`` is the lossless shutdown.

    Its messages come to a subscription of its own (``inbox``) as answers to pull requests on
    ``next_subject``, one request at a time for as many messages as there are free workers; each is
    handed to a worker as it arrives (not gathered by nats-py's ``fetch``, which cost four times as
    much CPU per message). A request ends when all its messages came, or with a status from the
    server (408: its wait of ``poll_s`` is over), or, lost in a reconnect, after its wait."""

    spec: ConsumerSpec
    workers: _Workers
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
class _Endpoint:
    service: Service
    workers: _Workers


class Bus:
    """A typed connection to NATS for one actor (see the module docstring)."""

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
        self._core: list[_CoreSub] = []
        self._consumers: list[PullConsumer] = []
        self._endpoints: list[_Endpoint] = []
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
    ) -> Bus:
        """Connect to ``url`` (a comma-separated list joins a cluster).

        With ``connect_timeout`` (a one-shot command), give up after that many seconds, and give up
        on a lost connection after about as long: ``BusError`` in one line. With ``None`` (a
        long-running actor), keep trying for ever, one log line per failed attempt, until ``stop``
        is set (then ``BusError`` at once).
        """
        servers = [u.strip() for u in url.split(",")]
        last: list[BaseException] = []

        async def on_error(exc: Exception) -> None:
            last[:] = [exc]
            if connect_timeout is None:
                log.warning("NATS connection attempt failed", url=url, error=_short(exc))

        made: list[Bus] = []

        async def on_disconnect() -> None:
            if made:
                made[0]._dropped()
            if not (made and made[0]._closed):
                log.warning("NATS connection lost, reconnecting", url=url)

        async def on_reconnect() -> None:
            if made:
                made[0].online.set()
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
                raise BusError(f"cannot connect to NATS at {url}: {_short(exc)}") from exc
            made.append(cls(nc, actor_id=actor_id, dlq_run=dlq_run, stats=stats, kind=kind))
            return made[0]
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        if stop is not None and stop.is_set():
            raise BusError(f"stopped while connecting to NATS at {url}")
        why = f" (last error: {_short(last[0])})" if last else ""
        raise BusError(f"cannot reach NATS at {url} within {connect_timeout:g} s{why}")

    # -- sending ---------------------------------------------------------------------------

    async def publish(self, subject: str, msg: Message) -> None:
        """Publish on core NATS (at most once)."""
        await self.nc.publish(subject, msg.to_bytes())

    async def publish_durable(self, subject: str, msg: Message, *, msg_id: str, attempts: int = 5) -> int:
        """Publish into JetStream and wait for the stream's ack; the server drops duplicates of
        ``msg_id`` within its dedup window. Returns the stream sequence."""
        payload = msg.to_bytes()
        headers = {MSG_ID_HEADER: msg_id}
        delay = 0.1
        attempt = drops = 0
        while True:
            try:
                return await self._stored(subject, payload, headers, timeout=5.0)
            except ConnectionDropped as exc:
                # The server went away before it acknowledged: the message is stored or not; the
                # same msg_id again after the reconnect is acknowledged either way, stored once.
                drops += 1
                if drops > MAX_DROPS or not await self._back_online(RECONNECT_WAIT_S):
                    raise BusError(f"publish to {subject} not acknowledged: {exc}") from exc
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError) as exc:
                attempt += 1
                if attempt >= attempts:
                    raise BusError(f"publish to {subject} not acknowledged: {_short(exc)}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _answer(self, subject: str, payload: bytes, headers: dict[str, str] | None, *, timeout: float) -> Msg:
        """Publish with a reply subject of this bus and wait for the answer.

        Every answer this bus waits for comes to one subscription (``_reply_prefix`` plus a
        counter), instead of what nats-py does per request (a random token, a timer task) and per
        JetStream publish (a dataclass for the answer too): a third less client CPU per publish.
        When the connection drops, every answer still awaited fails with ``ConnectionDropped``:
        the message or its answer may be gone with the server, and the caller decides whether to
        send it again (nats-py would leave it to time out: an expert's request waited minutes)."""
        if self._reply_prefix is None:
            async with self._reply_lock:
                if self._reply_prefix is None:
                    prefix = self.nc.new_inbox() + "."
                    await self.nc.subscribe(prefix + "*", cb=self._on_reply)
                    self._reply_prefix = prefix
        reply = f"{self._reply_prefix}{next(self._reply_ids)}"
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._replies[reply] = answer
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=headers)
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc
        finally:
            self._replies.pop(reply, None)

    def _dropped(self) -> None:
        """The connection dropped: the answers awaited now may never come (see :meth:`_answer`)."""
        self.online.clear()
        for answer in self._replies.values():
            if not answer.done():
                answer.set_exception(ConnectionDropped("the connection to NATS dropped before the answer came"))

    async def _back_online(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the connection; whether it is up. False at once for
        a bus being closed or a client that gave up reconnecting."""
        if not (self.online.is_set() or self._closed or self.lost.is_set()):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout, 0.0)):
                    await _wait_any(self.online, self.lost)
        return self.online.is_set() and not self._closed

    async def _stored(self, subject: str, payload: bytes, headers: dict[str, str], *, timeout: float) -> int:
        """Publish into JetStream once and wait for the stream's acknowledgement; its sequence
        (what ``JetStreamContext.publish`` does, through :meth:`_answer`)."""
        ack = await self._answer(subject, payload, headers, timeout=timeout)
        status = _status(ack)
        if status == "503":  # no stream takes this subject (no responders)
            raise nats.js.errors.NoStreamResponseError
        if status is not None:
            description = ack.headers.get(DESCRIPTION_HEADER, "") if ack.headers else ""
            raise BusError(f"publish to {subject} answered with status {status} {description}".rstrip())
        body = json.loads(ack.data)
        if "error" in body:
            raise nats.js.errors.APIError.from_error(body["error"])
        return int(body["seq"])

    async def _on_reply(self, msg: Msg) -> None:
        answer = self._replies.pop(msg.subject, None)
        if answer is not None and not answer.done():
            answer.set_result(msg)

    async def request(self, subject: str, msg: Message, reply_type: type[R], *, timeout: float) -> R:
        """Send a request and validate the reply as ``reply_type``.

        "No responders" is asked again once, after :data:`NO_RESPONDERS_RETRY_S`: a subscription
        made and flushed on another connection just before can still be missing for a moment
        (seen: 3 of 300 requests right after a flushed subscribe with nats-py and nats-server on
        loopback; 0 of 300 with this one retry), and an actor that has just started serving must
        not be reported as absent.

        A request whose connection drops before its reply came is sent again once the client has
        reconnected, within ``timeout`` in all: the request or its reply may be gone with the
        server. A responder may then answer it twice; every request of this project may be
        (queries, an expert's proposals, control)."""
        data = msg.to_bytes()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        asked_again = False
        drops = 0
        while True:
            try:
                reply = await self._answer(subject, data, None, timeout=deadline - loop.time())
            except ConnectionDropped:
                drops += 1
                if drops > MAX_DROPS or not await self._back_online(deadline - loop.time()):
                    raise RequestTimeout(subject, timeout) from None
                continue
            except nats.errors.TimeoutError as exc:
                raise RequestTimeout(subject, timeout) from exc
            if _status(reply) != "503":
                break
            if asked_again:
                raise NoResponders(subject)
            asked_again = True
            await asyncio.sleep(NO_RESPONDERS_RETRY_S)
        headers = reply.headers or {}
        if "Nats-Service-Error-Code" in headers:
            raise RemoteError(subject, headers["Nats-Service-Error-Code"], headers.get("Nats-Service-Error", ""))
        return reply_type.model_validate_json(reply.data)

    async def dead_letter(
        self,
        subject: str,
        data: bytes,
        *,
        reason: str,
        error: str,
        deliveries: int | None = None,
        stream_seq: int | None = None,
    ) -> None:
        """Keep a message this actor gave up on, with the reason, in the dead-letter stream."""
        letter = DeadLetter(
            subject=subject,
            reason=reason,  # type: ignore[arg-type]
            error=error[:_PAYLOAD_LIMIT],
            payload=_payload_text(data),
            actor_id=self.actor_id,
            deliveries=deliveries,
            stream_seq=stream_seq,
        )
        self.stats.dead_lettered += 1
        log.warning("dead letter", subject=subject, reason=reason, error=error.splitlines()[0][:300])
        try:
            await self.js.publish(self.dlq_subject, letter.to_bytes(), timeout=5.0)
        except (TimeoutError, nats.errors.Error) as exc:
            # The DLQ stream may be missing (a bare server): the letter still goes out on core NATS.
            log.error("dead-letter stream unavailable, sent on core NATS only", error=_short(exc))
            await self.nc.publish(self.dlq_subject, letter.to_bytes())

    # -- receiving -------------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        msg_type: type[M],
        handler: Handler[M],
        *,
        queue: str = "",
        concurrency: int = 64,
    ) -> None:
        """Handle core messages on ``subject`` with up to ``concurrency`` handlers at once."""
        workers = _Workers(concurrency)

        async def on_msg(raw: Msg) -> None:
            message = await self._decode(raw, msg_type)
            if message is None:
                return
            delivery = Delivery(subject=raw.subject, headers=dict(raw.headers or {}))
            await workers.spawn(self._run_core(handler, message, delivery))

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg, pending_msgs_limit=1_000_000)
        self._core.append(_CoreSub(sub, workers))
        await self.nc.flush()

    async def _run_core(self, handler: Handler[M], message: M, delivery: Delivery) -> None:
        started = self.stats.start()
        try:
            await handler(message, delivery)
        except Exception as exc:  # the boundary: logged with traceback, counted
            self.stats.done(started, ok=False, error=exc)
            observe_handle(self.kind, Transport.CORE, Outcome.ERROR, time.perf_counter() - started)
            log.exception("handler failed", subject=delivery.subject)
        else:
            self.stats.done(started, ok=True)
            observe_handle(self.kind, Transport.CORE, Outcome.OK, time.perf_counter() - started)

    async def _decode(self, raw: Msg, msg_type: type[M]) -> M | None:
        try:
            return msg_type.model_validate_json(raw.data)
        except pydantic.ValidationError as exc:
            self.stats.invalid(str(exc))
            await self.dead_letter(raw.subject, raw.data, reason="invalid", error=str(exc))
            return None

    async def consume(
        self, spec: ConsumerSpec, msg_type: type[M], handler: Handler[M], *, concurrency: int = 8
    ) -> PullConsumer:
        """Start a durable pull consumer loop (see the module docstring for its guarantees)."""
        config = ConsumerConfig(
            durable_name=spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=spec.ack_wait_s,
            max_deliver=spec.max_deliver,
            filter_subject=spec.filter_subject,
            deliver_policy=DeliverPolicy.ALL if spec.deliver_all else DeliverPolicy.NEW,
            max_ack_pending=spec.max_ack_pending,
        )
        await settled(
            f"creating consumer {spec.durable} on {spec.stream}", lambda: self._ensure_consumer(spec.stream, config)
        )
        consumer = PullConsumer(
            spec=spec,
            workers=_Workers(concurrency),
            next_subject=f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}",
            inbox=self.nc.new_inbox(),
        )
        consumer.request_over.set()

        async def on_msg(raw: Msg) -> None:
            await self._on_pulled(raw, consumer, msg_type, handler)

        consumer.psub = await self.nc.subscribe(consumer.inbox, cb=on_msg, pending_msgs_limit=1_000_000)
        consumer.task = asyncio.create_task(self._pull_loop(consumer))
        consumer.beat_task = asyncio.create_task(consumer.heartbeats())
        self._consumers.append(consumer)
        return consumer

    async def _ensure_consumer(self, stream: str, config: ConsumerConfig) -> None:
        """Create the durable consumer, or leave the one of that name as it is (as a restarted actor
        finds it, with what it has not acknowledged yet)."""
        assert config.durable_name is not None
        try:
            await self.jsm.consumer_info(stream, config.durable_name)
        except nats.js.errors.NotFoundError:
            config.name = config.durable_name
            await self.jsm.add_consumer(stream, config=config)

    async def _pull_loop(self, consumer: PullConsumer) -> None:
        """Pull requests, one at a time, each for as many messages as there are free workers."""
        spec = consumer.spec
        expires_ns = int(spec.poll_s * 1e9)
        while not consumer.stopping.is_set():
            if not self._running.is_set():
                await _wait_any(consumer.stopping, self._running)
                continue
            await consumer.workers.wait_free()
            if consumer.stopping.is_set():
                break
            want = max(1, min(spec.batch, consumer.workers.free))
            consumer.awaiting = want
            consumer.request_over.clear()
            try:
                await self.nc.publish(
                    consumer.next_subject,
                    json.dumps({"batch": want, "expires": expires_ns}).encode(),
                    reply=consumer.inbox,
                )
            except nats.errors.Error as exc:
                consumer.request_over.set()
                if self.nc.is_closed:
                    break
                log.warning("pull request failed", consumer=spec.durable, error=_short(exc))
                await asyncio.sleep(0.5)
                continue
            # Until the request has ended; a request lost in a reconnect ends with its wait.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(spec.poll_s + 1.0):
                    await _wait_any(consumer.request_over, consumer.stopping)
            if consumer.trouble:
                log.warning("pull request refused", consumer=spec.durable, status=consumer.trouble)
                consumer.trouble = ""
                await _wait_any_for(0.5, consumer.stopping)

    async def _on_pulled(self, raw: Msg, consumer: PullConsumer, msg_type: type[M], handler: Handler[M]) -> None:
        """A message of the consumer's inbox: a status that ends a pull request, or a message for a
        worker (nak'ed at once when it comes after the stop)."""
        status = _status(raw)
        if status is not None:
            if status != "100":  # 100 is an idle heartbeat; anything else ends the request
                if status not in ("404", "408"):
                    consumer.trouble = f"{status} {raw.headers.get(DESCRIPTION_HEADER, '') if raw.headers else ''}"
                consumer.request_over.set()
            return
        consumer.awaiting -= 1
        if consumer.awaiting <= 0:
            consumer.request_over.set()
        if consumer.aborted:  # what an abort's last request still brings goes back to the stream at once
            with contextlib.suppress(nats.errors.Error):
                await raw.nak()
            return
        # Also after a stop: it is in hand (the stop waits for the request to end), and handling it
        # here beats sending it back for a redelivery.
        await consumer.workers.spawn(self._handle_js(raw, consumer, msg_type, handler))

    async def _handle_js(self, raw: Msg, consumer: PullConsumer, msg_type: type[M], handler: Handler[M]) -> None:
        spec = consumer.spec
        delivered, seq = _delivered_and_seq(raw)
        if delivered > 1:
            self.stats.redelivered += 1
        message = await self._decode(raw, msg_type)
        if message is None:
            await raw.term()
            return
        delivery = Delivery(
            subject=raw.subject,
            headers=dict(raw.headers or {}),
            num_delivered=delivered,
            stream_seq=seq,
            max_deliver=spec.max_deliver,
        )
        started = self.stats.start()
        consumer.in_hand[id(raw)] = (raw, time.monotonic())

        def took(outcome: Outcome) -> None:
            observe_handle(self.kind, Transport.JETSTREAM, outcome, time.perf_counter() - started)

        try:
            await handler(message, delivery)
        except Retry as exc:
            self.stats.done(started, ok=False, error=exc)
            took(Outcome.RETRY)
            await self._fail(raw, delivery, spec, exc, delay=exc.delay_s)
        except Drop as exc:
            self.stats.done(started, ok=True)
            took(Outcome.DROP)
            log.info("message dropped on purpose", subject=raw.subject, reason=str(exc))
            await raw.term()
        except Poison as exc:
            self.stats.done(started, ok=False, error=exc)
            took(Outcome.POISON)
            await self.dead_letter(
                raw.subject, raw.data, reason="poison", error=str(exc), deliveries=delivered, stream_seq=seq
            )
            await raw.term()
        except Exception as exc:  # the boundary: logged with traceback, counted, nak'ed
            self.stats.done(started, ok=False, error=exc)
            took(Outcome.ERROR)
            log.exception("handler failed", subject=raw.subject, delivery=delivered)
            await self._fail(raw, delivery, spec, exc, delay=spec.nak_delay(delivered))
        else:
            self.stats.done(started, ok=True)
            took(Outcome.OK)
            await raw.ack()
        finally:
            consumer.in_hand.pop(id(raw), None)

    async def _fail(
        self, raw: Msg, delivery: Delivery, spec: ConsumerSpec, exc: BaseException, *, delay: float
    ) -> None:
        if delivery.last_attempt:
            await self.dead_letter(
                raw.subject,
                raw.data,
                reason="max_deliveries",
                error=_short(exc),
                deliveries=delivery.num_delivered,
                stream_seq=delivery.stream_seq,
            )
            await raw.term()
        else:
            await raw.nak(delay=delay)

    # -- services --------------------------------------------------------------------------

    async def add_service(
        self,
        *,
        name: str,
        version: str,
        description: str,
        metadata: dict[str, str],
        stats_handler: Any = None,
    ) -> Service:
        """Register a ``nats.micro`` service (discoverable through ``$SRV.PING/INFO/STATS``)."""
        service = await add_service(
            self.nc,
            name=name,
            version=version,
            description=description,
            metadata=metadata,
            stats_handler=stats_handler,
        )
        return service

    async def serve(
        self,
        service: Service,
        *,
        name: str,
        subject: str,
        request_type: type[M],
        handler: ReplyHandler[M, R],
        queue_group: str | None = None,
        concurrency: int = 16,
        record_stats: bool = True,
    ) -> None:
        """Add a typed endpoint. Handlers run concurrently (bounded); an invalid request gets an
        error reply (code 400) and a dead letter; a failing handler an error reply (code 500)."""
        workers = _Workers(concurrency)

        stats = self.stats if record_stats else StatsRecorder()

        async def respond(request: Request, message: M) -> None:
            started = stats.start()
            try:
                reply = await handler(message)
            except Exception as exc:  # the boundary: the caller gets a typed error
                stats.done(started, ok=False, error=exc)
                if record_stats:
                    observe_handle(self.kind, Transport.SERVICE, Outcome.ERROR, time.perf_counter() - started)
                log.exception("endpoint handler failed", subject=subject)
                await request.respond_error("500", _short(exc)[:500])
            else:
                stats.done(started, ok=True)
                if record_stats:
                    observe_handle(self.kind, Transport.SERVICE, Outcome.OK, time.perf_counter() - started)
                await request.respond(reply.to_bytes())

        async def on_request(request: Request) -> None:
            try:
                message = request_type.model_validate_json(request.data)
            except pydantic.ValidationError as exc:
                self.stats.invalid(str(exc))
                await self.dead_letter(request.subject, request.data, reason="invalid", error=str(exc))
                await request.respond_error("400", f"invalid {request_type.__name__}: {exc}"[:2000])
                return
            await workers.spawn(respond(request, message))

        await service.add_endpoint(
            name=name, subject=subject, handler=on_request, queue_group=queue_group or f"q-{name}"
        )
        self._endpoints.append(_Endpoint(service, workers))
        await self.nc.flush()

    # -- streams ---------------------------------------------------------------------------

    def replicas(self) -> int:
        """Replicas for the streams and buckets this bus creates: 3 when the server is one of a
        cluster of three or more (the cluster survives the loss of any one server), else 1;
        ``KF_STREAM_REPLICAS`` overrides."""
        forced = os.environ.get("KF_STREAM_REPLICAS")
        if forced:
            try:
                value = int(forced)
            except ValueError as exc:
                raise ConfigError(f"KF_STREAM_REPLICAS must be 1 to 5, got {forced!r}") from exc
            if not 1 <= value <= 5:
                raise ConfigError(f"KF_STREAM_REPLICAS must be 1 to 5, got {forced!r}")
            return value
        info = getattr(self.nc, "_server_info", None) or {}
        peers = info.get("connect_urls") or []
        return 3 if info.get("cluster") and len(peers) >= 3 else 1

    async def ensure_stream(self, config: StreamConfig) -> None:
        """Create a stream, or leave an existing one of that name as it is (asked again while the
        server cannot answer)."""
        await settled(f"creating stream {config.name}", lambda: self._ensure_stream(config))

    async def _ensure_stream(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if "already in use" not in str(exc):
                raise
            await self.js.update_stream(config)

    async def ensure_run_stream(self, run_id: str, *, max_age_s: float = 7 * 24 * 3600) -> None:
        """The run's event log: every ``kf.<run>.>`` subject, kept for ``max_age_s``, with direct
        gets (a message by subject without the JSON and base64 of the stream API)."""
        await self.ensure_stream(
            StreamConfig(
                name=subjects.run_stream(run_id),
                subjects=[subjects.run_all(run_id)],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=max_age_s,
                duplicate_window=15 * 60,
                num_replicas=self.replicas(),
                allow_direct=True,  # diagnosers read each candidate by subject (a direct get)
            )
        )

    async def ensure_shared_streams(self) -> None:
        """Experience (source of truth), dead letters and max-delivery advisories."""
        await self.ensure_stream(
            StreamConfig(
                name=subjects.EXPERIENCE_STREAM,
                subjects=[subjects.EXPERIENCE_RECORD, subjects.EXPERIENCE_OUTCOME, subjects.EXPERIENCE_BATCH],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=15 * 60,
                num_replicas=self.replicas(),
            )
        )
        await self.ensure_stream(
            StreamConfig(
                name=subjects.DLQ_STREAM,
                subjects=[subjects.dead_letters(">")],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=30 * 24 * 3600,
                num_replicas=self.replicas(),
            )
        )
        await self.ensure_stream(
            StreamConfig(
                name=subjects.ADVISORY_STREAM,
                subjects=[subjects.MAX_DELIVERIES_ADVISORY],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=30 * 24 * 3600,
                num_replicas=self.replicas(),
            )
        )

    # -- shutdown --------------------------------------------------------------------------

    async def close(self) -> None:
        """The lossless shutdown order (see the module docstring). Safe to call twice."""
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
