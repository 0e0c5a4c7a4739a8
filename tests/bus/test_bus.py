"""The typed bus against a real nats-server: round trips, dead letters, durable consumers."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.runtime.bus import Bus, ConsumerSpec, Delivery
from actors.runtime.errors import NoResponders, Poison, RemoteError, Retry
from schemas import Control, ControlAction, DeadLetter, Diagnosis, DiagnosisCategory, subjects


def _diag(i: int) -> Diagnosis:
    return Diagnosis(candidate_id=f"c{i}", category=DiagnosisCategory.SLOW_MEMORY_BOUND, summary=f"d{i}")


async def _bus(url: str, run_id: str, name: str = "t") -> Bus:
    bus = await Bus.connect(url, name=name, actor_id=f"{name}-{run_id}", dlq_run=run_id)
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    return bus


async def _dead_letters(bus: Bus, run_id: str, want: int, timeout: float = 5.0) -> list[DeadLetter]:
    sub = await bus.js.subscribe(subjects.dead_letters(run_id), ordered_consumer=True)
    out: list[DeadLetter] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < want:
                msg = await sub.next_msg(timeout=timeout)
                out.append(DeadLetter.model_validate_json(msg.data))
    finally:
        await sub.unsubscribe()
    return out


async def test_typed_messages_round_trip_on_core_subjects(nats_url: str, run_id: str) -> None:
    bus = await _bus(nats_url, run_id)
    got: list[Diagnosis] = []
    done = asyncio.Event()

    async def handler(msg: Diagnosis, delivery: Delivery) -> None:
        got.append(msg)
        if len(got) == 20:
            done.set()

    subject = subjects.feedback(run_id, "i0")
    await bus.subscribe(subject, Diagnosis, handler, concurrency=4)
    for i in range(20):
        await bus.publish(subject, _diag(i))
    await asyncio.wait_for(done.wait(), 5)
    assert sorted(d.candidate_id for d in got) == sorted(f"c{i}" for i in range(20))
    assert all(isinstance(d, Diagnosis) for d in got)
    await bus.close()


async def test_malformed_message_is_dead_lettered_and_the_actor_keeps_serving(nats_url: str, run_id: str) -> None:
    bus = await _bus(nats_url, run_id)
    got: list[Diagnosis] = []
    good = asyncio.Event()

    async def handler(msg: Diagnosis, delivery: Delivery) -> None:
        got.append(msg)
        good.set()

    subject = subjects.feedback(run_id, "i0")
    await bus.subscribe(subject, Diagnosis, handler)
    await bus.nc.publish(subject, b'{"type": "diagnosis", "candidate_id": 7}')
    await bus.publish(subject, _diag(1))
    await asyncio.wait_for(good.wait(), 5)
    letters = await _dead_letters(bus, run_id, 1)
    assert letters[0].reason == "invalid"
    assert letters[0].subject == subject
    assert "candidate_id" in letters[0].error
    assert json.loads(letters[0].payload)["candidate_id"] == 7
    assert [d.candidate_id for d in got] == ["c1"]
    assert bus.stats.dead_lettered == 1
    await bus.close()


async def test_typed_request_reply_and_typed_errors(nats_url: str, run_id: str) -> None:
    server = await _bus(nats_url, run_id, "srv")
    client = await _bus(nats_url, run_id, "cli")
    service = await server.add_service(name="kf-test", version="0.1.0", description="t", metadata={})

    async def echo(msg: Control) -> Diagnosis:
        if msg.reason == "boom":
            raise ValueError("exploded")
        return _diag(len(msg.reason))

    subject = f"kf.test.{run_id}.echo"
    await server.serve(service, name="echo", subject=subject, request_type=Control, handler=echo)
    reply = await client.request(subject, Control(action=ControlAction.INFO, reason="abc"), Diagnosis, timeout=5)
    assert reply.candidate_id == "c3"
    with pytest.raises(RemoteError, match="exploded") as info:
        await client.request(subject, Control(action=ControlAction.INFO, reason="boom"), Diagnosis, timeout=5)
    assert info.value.code == "500"
    bad = await client.nc.request(subject, b"{not json", timeout=5)
    assert bad.headers is not None
    assert bad.headers["Nats-Service-Error-Code"] == "400"
    with pytest.raises(NoResponders):
        await client.request(f"kf.test.{run_id}.nobody", Control(action=ControlAction.INFO), Diagnosis, timeout=2)
    await client.close()
    await server.close()


async def test_a_reply_past_the_servers_max_payload_is_an_error_the_caller_gets_at_once(
    nats_url: str, run_id: str
) -> None:
    """The embedded server takes messages of up to 8 MB (a whole model's candidate is one: 1.2 MB
    for KernelBench L3-15, past nats-server's default 1 MB); a larger reply is a typed error the
    caller gets at once (code 413), never silence that waits out the caller's timeout."""
    from actors.runtime.nats_server import MAX_PAYLOAD

    server = await _bus(nats_url, run_id, "srv")
    client = await _bus(nats_url, run_id, "cli")
    assert server.nc.max_payload == MAX_PAYLOAD == 8 * 1024 * 1024
    service = await server.add_service(name="kf-big", version="0.1.0", description="t", metadata={})

    async def big(msg: Control) -> Diagnosis:
        return Diagnosis(candidate_id="c", category=DiagnosisCategory.SLOW_MEMORY_BOUND, summary="x" * int(msg.reason))

    subject = f"kf.test.{run_id}.big"
    await server.serve(service, name="big", subject=subject, request_type=Control, handler=big)
    fits = await client.request(subject, Control(action=ControlAction.INFO, reason=str(2 << 20)), Diagnosis, timeout=10)
    assert len(fits.summary) == 2 << 20  # 2 MB: past the default, within the embedded server's
    started = asyncio.get_running_loop().time()
    with pytest.raises(RemoteError, match="max_payload") as info:
        await client.request(subject, Control(action=ControlAction.INFO, reason=str(9 << 20)), Diagnosis, timeout=30)
    assert info.value.code == "413"
    assert asyncio.get_running_loop().time() - started < 10
    await client.close()
    await server.close()


async def test_durable_consumer_acks_retries_and_dead_letters(nats_url: str, run_id: str) -> None:
    bus = await _bus(nats_url, run_id)
    subject = subjects.results(run_id, "i0")
    attempts: dict[str, int] = {}
    succeeded: set[str] = set()
    finished = asyncio.Event()

    async def handler(msg: Diagnosis, delivery: Delivery) -> None:
        attempts[msg.candidate_id] = delivery.num_delivered
        if msg.candidate_id == "c1" and delivery.num_delivered < 2:
            raise Retry("not yet", delay_s=0.05)
        if msg.candidate_id == "c2":
            raise Poison("never handleable")
        if msg.candidate_id == "c3":
            raise RuntimeError("always fails")
        succeeded.add(msg.candidate_id)
        if succeeded == {"c0", "c1"}:
            finished.set()

    spec = ConsumerSpec(
        stream=subjects.run_stream(run_id),
        durable="t",
        filter_subject=subject,
        ack_wait_s=2,
        max_deliver=3,
        backoff_s=(0.05,),
    )
    await bus.consume(spec, Diagnosis, handler, concurrency=4)
    for i in range(4):
        await bus.publish_durable(subject, _diag(i), msg_id=f"{run_id}-{i}")
    await bus.publish_durable(subject, _diag(0), msg_id=f"{run_id}-0")  # a duplicate: dropped by the server
    letters = await _dead_letters(bus, run_id, 2)
    await asyncio.wait_for(finished.wait(), 5)
    reasons = {json.loads(letter.payload)["candidate_id"]: letter.reason for letter in letters}
    assert reasons == {"c2": "poison", "c3": "max_deliveries"}
    assert attempts["c1"] == 2
    assert attempts["c3"] == 3
    await bus.close()
    observer = await _bus(nats_url, run_id, "obs")
    info = await observer.js.consumer_info(spec.stream, spec.durable)
    await observer.close()
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
    assert info.delivered.stream_seq == 4  # the duplicate publish never entered the stream


async def test_closing_the_bus_finishes_the_messages_in_hand_and_acks_them(nats_url: str, run_id: str) -> None:
    """The graceful drain: what the handlers hold when the bus closes is finished and acknowledged
    before the connection goes, not cancelled and left for JetStream to deliver again after the
    ack wait."""
    bus = await _bus(nats_url, run_id)
    subject = subjects.results(run_id, "i0")
    held: set[str] = set()
    finished: set[str] = set()
    all_held = asyncio.Event()

    async def slow(msg: Diagnosis, delivery: Delivery) -> None:
        held.add(msg.candidate_id)
        if len(held) == 4:
            all_held.set()
        await asyncio.sleep(2.0)  # longer than the pull loop takes to stop fetching
        finished.add(msg.candidate_id)

    spec = ConsumerSpec(stream=subjects.run_stream(run_id), durable="slow", filter_subject=subject, ack_wait_s=30)
    await bus.consume(spec, Diagnosis, slow, concurrency=8)  # free slots: the loop is not waiting for one
    for i in range(4):
        await bus.publish_durable(subject, _diag(i), msg_id=f"{run_id}-{i}")
    await asyncio.wait_for(all_held.wait(), 10)
    await bus.close()
    assert finished == {"c0", "c1", "c2", "c3"}, f"cancelled in hand: {sorted(held - finished)}"
    observer = await _bus(nats_url, run_id, "obs")
    info = await observer.js.consumer_info(spec.stream, spec.durable)
    await observer.close()
    assert info.num_ack_pending == 0, "the closed bus left messages unacknowledged (redelivered after the ack wait)"
    assert info.num_redelivered == 0
    assert info.ack_floor is not None
    assert info.ack_floor.stream_seq == 4
