"""Receiving: core subscriptions with bounded handlers, and durable pull consumers (explicit ack,
``in_progress`` heartbeats, nak with backoff, dead letter at the last delivery,
``Retry``/``Drop``/``Poison``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import nats
import nats.errors
import nats.js.errors
import pydantic
from nats.aio.msg import Msg
from nats.js.api import (
    DEFAULT_PREFIX,
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
)

from actors.runtime.bus.calls import (
    DESCRIPTION_HEADER,
    server_has_all,
    settled,
    short,
    status_of,
    wait_any,
    wait_any_for,
)
from actors.runtime.bus.delivery import (
    ConsumerSpec,
    CoreSub,
    Delivery,
    Handler,
    M,
    PullConsumer,
    Workers,
    delivered_and_seq,
)
from actors.runtime.bus.sending import Sending
from actors.runtime.errors import Drop, Poison, Retry
from actors.runtime.latency import Outcome, Transport, observe_handle
from actors.runtime.logs import get_logger

log = get_logger(__name__)


class Receiving(Sending):
    """What a bus receives: core messages and a stream's messages through pull consumers."""

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
        workers = Workers(concurrency)

        async def on_msg(raw: Msg) -> None:
            message = await self._decode(raw, msg_type)
            if message is None:
                return
            delivery = Delivery(subject=raw.subject, headers=dict(raw.headers or {}))
            await workers.spawn(self._run_core(handler, message, delivery))

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg, pending_msgs_limit=1_000_000)
        self._core.append(CoreSub(sub, workers))
        await server_has_all(self.nc)

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
        """Start a durable pull consumer loop (see the docstring of ``actors.runtime.bus`` for its guarantees)."""
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
            workers=Workers(concurrency),
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
                await wait_any(consumer.stopping, self._running)
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
                log.warning("pull request failed", consumer=spec.durable, error=short(exc))
                await asyncio.sleep(0.5)
                continue
            # Until the request has ended; a request lost in a reconnect ends with its wait.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(spec.poll_s + 1.0):
                    await wait_any(consumer.request_over, consumer.stopping)
            if consumer.trouble:
                log.warning("pull request refused", consumer=spec.durable, status=consumer.trouble)
                consumer.trouble = ""
                await wait_any_for(0.5, consumer.stopping)

    async def _on_pulled(self, raw: Msg, consumer: PullConsumer, msg_type: type[M], handler: Handler[M]) -> None:
        """A message of the consumer's inbox: a status that ends a pull request, or a message for a
        worker (nak'ed at once when it comes after the stop)."""
        status = status_of(raw)
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
        delivered, seq = delivered_and_seq(raw)
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
                error=short(exc),
                deliveries=delivery.num_delivered,
                stream_seq=delivery.stream_seq,
            )
            await raw.term()
        else:
            await raw.nak(delay=delay)
