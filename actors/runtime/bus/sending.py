"""Sending: core publishes, JetStream publishes acknowledged by the stream (``publish_durable``),
typed requests (``request``), all answers awaited on one reply subscription, and dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import json

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from actors.runtime.bus.calls import (
    DESCRIPTION_HEADER,
    MSG_ID_HEADER,
    PAYLOAD_LIMIT,
    ConnectionDropped,
    payload_text,
    short,
    status_of,
    wait_any,
)
from actors.runtime.bus.core import BusCore
from actors.runtime.bus.delivery import R
from actors.runtime.errors import BusError, NoResponders, RemoteError, RequestTimeout
from actors.runtime.logs import get_logger
from schemas import DeadLetter, Message

log = get_logger(__name__)


NO_RESPONDERS_RETRY_S = 0.05
"""How long a request that found no responders waits before asking once more."""
MAX_DROPS = 10
"""Connection drops one request or durable publish is sent again across before it fails."""
RECONNECT_WAIT_S = 60.0
"""How long a durable publish whose connection dropped waits for the reconnect."""


class Sending(BusCore):
    """What a bus sends and the answers it waits for (see the docstring of ``actors.runtime.bus``)."""

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
                    raise BusError(f"publish to {subject} not acknowledged: {short(exc)}") from exc
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
                    await wait_any(self.online, self.lost)
        return self.online.is_set() and not self._closed

    async def _stored(self, subject: str, payload: bytes, headers: dict[str, str], *, timeout: float) -> int:
        """Publish into JetStream once and wait for the stream's acknowledgement; its sequence
        (what ``JetStreamContext.publish`` does, through :meth:`_answer`)."""
        ack = await self._answer(subject, payload, headers, timeout=timeout)
        status = status_of(ack)
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
            except nats.errors.ConnectionClosedError as exc:  # closed for good (the actor is stopping)
                raise BusError(f"request to {subject}: the connection to NATS is closed") from exc
            if status_of(reply) != "503":
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
            error=error[:PAYLOAD_LIMIT],
            payload=payload_text(data),
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
            log.error("dead-letter stream unavailable, sent on core NATS only", error=short(exc))
            await self.nc.publish(self.dlq_subject, letter.to_bytes())
