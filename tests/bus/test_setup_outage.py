"""An actor's set-up reads (its run, its experts' configurations, saved state) and its consumers'
creation wait out a NATS server that cannot answer for a while, instead of ending the actor."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg

from actors.runtime.bus import Bus, ConsumerSpec, server_has_all, transient
from actors.runtime.errors import BusError
from actors.runtime.kv import get_run
from schemas import Control, ControlAction, Feedback, subjects
from tests.bus.helpers import RestartableServer, register_run

pytestmark = pytest.mark.timeout(120)

OUTAGE_S = 7.0
"""Longer than a JetStream API request's own 5 s timeout: one attempt alone cannot bridge it."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RestartableServer]:
    server = RestartableServer(tmp_path / "js")
    server.start()
    yield server
    server.stop()


@pytest.mark.slow  # a server restart: ~8 s; CI runs it in the slow suite
async def test_reading_the_run_waits_out_a_server_restart(server: RestartableServer) -> None:
    # as an actor connects: reconnecting for ever
    bus = await Bus.connect(server.url, name="t", actor_id="t-setup", connect_timeout=None)
    try:
        run = await register_run(bus, "outage1")
        server.stop()
        read = asyncio.create_task(get_run(bus, "outage1"))
        await asyncio.sleep(OUTAGE_S)
        assert not read.done(), read.exception() if read.done() else None
        await asyncio.to_thread(server.start)
        spec = await asyncio.wait_for(read, 60)
        assert spec.run_id == run.run_id
    finally:
        await bus.close()


@pytest.mark.slow  # a server restart: ~7 s; CI runs it in the slow suite
async def test_creating_a_consumer_waits_out_a_server_restart(server: RestartableServer) -> None:
    bus = await Bus.connect(server.url, name="t", actor_id="t-consume", connect_timeout=None)
    try:
        await register_run(bus, "outage2")
        server.stop()
        spec = ConsumerSpec(
            stream=subjects.run_stream("outage2"),
            durable="outage-feedback",
            filter_subject=subjects.feedback("outage2", "i0"),
        )

        async def on_feedback(_msg: Feedback, _delivery: object) -> None:
            return None

        consume = asyncio.create_task(bus.consume(spec, Feedback, on_feedback))
        await asyncio.sleep(OUTAGE_S)
        assert not consume.done(), consume.exception() if consume.done() else None
        await asyncio.to_thread(server.start)
        consumer = await asyncio.wait_for(consume, 60)
        assert consumer.spec.durable == "outage-feedback"
    finally:
        await bus.close()


@pytest.mark.slow  # a server kept away for its whole wait: ~10 s; CI runs it in the slow suite
async def test_a_server_that_stays_away_ends_the_wait_with_one_clear_error(
    server: RestartableServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("actors.runtime.bus.calls.SETTLE_S", 8.0)
    bus = await Bus.connect(server.url, name="t", actor_id="t-gone", connect_timeout=None)
    try:
        await register_run(bus, "outage3")
        server.stop()
        with pytest.raises(BusError, match=r"(opening bucket|reading 'outage3').* did not answer within 8 s"):
            await get_run(bus, "outage3")
    finally:
        server.start()
        await bus.close()


def test_only_a_server_that_cannot_answer_now_is_transient() -> None:
    assert transient(nats.errors.TimeoutError())
    assert transient(nats.js.errors.ServiceUnavailableError(code=503, description="JetStream not ready"))
    assert not transient(nats.js.errors.KeyNotFoundError())  # an answer: there is no such key
    assert not transient(nats.js.errors.NotFoundError(code=404, description="stream not found"))
    assert not transient(nats.errors.ConnectionClosedError())  # the client gave up: asking again cannot help
    # A cluster that has just formed cannot place three replicas yet; a name taken is an answer.
    assert transient(nats.js.errors.BadRequestError(code=400, err_code=10005, description="no suitable peers"))
    assert not transient(nats.js.errors.BadRequestError(code=400, err_code=10058, description="name in use"))


async def test_a_request_lost_with_the_server_is_asked_again_once_the_connection_is_back(
    server: RestartableServer,
) -> None:
    """An island's request to an expert that the server lost (the request or its reply) used to
    wait its whole timeout (minutes for an expert): the run stalled after a NATS restart."""
    asker = await Bus.connect(server.url, name="t", actor_id="t-asker", connect_timeout=None)
    answerer = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    seen: list[bytes] = []
    first = asyncio.Event()

    async def answer_all_but_the_first(msg: Msg) -> None:
        seen.append(msg.data)
        first.set()
        if len(seen) > 1:  # the first is lost, as it would be with the server going down
            await msg.respond(msg.data)

    try:
        await answerer.subscribe("t.lost.request", cb=answer_all_but_the_first)
        await server_has_all(answerer)
        sent = Control(action=ControlAction.DRAIN, reason="lost with the server")
        started = asyncio.get_running_loop().time()
        request = asyncio.create_task(asker.request("t.lost.request", sent, Control, timeout=40.0))
        await asyncio.wait_for(first.wait(), 10.0)
        server.stop()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)
        reply = await request
        assert reply == sent
        assert len(seen) == 2
        assert asyncio.get_running_loop().time() - started < 20.0  # not the 40 s timeout
    finally:
        await answerer.close()
        await asker.close()
