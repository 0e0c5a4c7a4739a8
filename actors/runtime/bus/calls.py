"""One NATS call: the headers the server answers with, transient failures asked again (``settled``),
a dropped connection (``ConnectionDropped``), and the small waits the bus is built from."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.runtime.errors import BusError
from actors.runtime.logs import get_logger

T = TypeVar("T")

log = get_logger(__name__)


MSG_ID_HEADER = "Nats-Msg-Id"
STATUS_HEADER = "Status"
"""Set (with an empty payload) on the server's answers about a pull request itself."""
DESCRIPTION_HEADER = "Description"
PAYLOAD_LIMIT = 64 * 1024

SETTLE_S = 60.0
"""How long an idempotent JetStream call (a bucket or key read, a consumer's creation) is asked
again while the server cannot answer: a server restarting, a cluster electing a new stream leader
after losing one of its servers, or one so loaded that the API's answer is late. In the cluster
failover test, islands starting while a server was down got ``nats: timeout`` from a key read and
exited; each of these calls is safe to repeat."""


NO_PEERS_YET = 10005
"""JetStream's ``no suitable peers for placement``: on a cluster that has just formed, the metadata
leader places a stream of three replicas only once it has heard from the other servers; until then
it refuses with this code. The cluster failover test's controller ended on it (a refused creation,
then ``BucketNotFoundError``) after all three servers answered ``/healthz``; streams created at once
on a cold three-server cluster got it in one start of six, for about half a second. Asked again, the
same request succeeds. (``replicas()`` asks for three only of a cluster that lists three servers,
so a lasting refusal is not expected.)"""


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not answer now (not that the answer was no)."""
    if isinstance(exc, nats.js.errors.APIError):
        if getattr(exc, "err_code", None) == NO_PEERS_YET:
            return True
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
                raise BusError(f"{what}: the NATS server did not answer within {within_s:g} s ({short(exc)})") from exc
            log.warning("NATS call failed, asking again", what=what, error=short(exc), retry_in_s=round(delay, 2))
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)


def payload_text(data: bytes) -> str:
    return data[:PAYLOAD_LIMIT].decode("utf-8", errors="backslashreplace")


class ConnectionDropped(Exception):
    """The connection dropped while an answer was awaited (see ``Bus._answer``)."""


def status_of(msg: Msg) -> str | None:
    """The status of a server's answer about a message itself (empty payload), e.g. '503' for no
    responders; None for an answer with a body."""
    return msg.headers.get(STATUS_HEADER) if msg.headers and not msg.data else None


def short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


async def wait_any_for(seconds: float, event: asyncio.Event) -> None:
    """Sleep ``seconds``, or less when ``event`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def wait_any(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def server_has_all(nc: NATS, timeout: int = 10) -> None:
    """Return once the server has processed everything this connection sent before the call (a
    subscription made just before: messages published afterwards by anyone reach it).

    ``flush`` alone does not promise that with nats-py 2.16: it writes its PING straight to the
    socket, ahead of commands still waiting for the client's flusher task, so its PONG can come back
    before the server has seen a ``SUB`` queued a moment earlier. Seen as a lost message: the TLS
    role test's verdict, published by another connection after ``subscribe`` + ``flush``, was never
    delivered in 4 of 30 tries on this 2-core host (the server's connz: the publisher's message
    counted in, none out, the subscription present). The first round trip gives the flusher its turn
    (it is woken before any answer can be read), so the second PING goes out after those commands
    and is answered after the server has them."""
    await nc.flush(timeout=timeout)
    await nc.flush(timeout=timeout)
