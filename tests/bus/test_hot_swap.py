"""Hot swap of a diagnoser under continuous load: start v2, drain v1; nothing lost or doubled.

Every feedback publish is counted on a core subscription (the run stream's de-duplication of
``feedback-<id>`` would hide a result handled twice), and the diagnosers' consumer must show no
redelivery: the drained diagnoser finished the results it held instead of leaving them to come
back after the ack wait."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from nats.aio.msg import Msg

from actors.runtime.bus import Bus
from schemas import (
    ActorInfo,
    Control,
    ControlAction,
    EvalStatus,
    Feedback,
    subjects,
)
from tests.bus.helpers import (
    candidate,
    collect,
    register_run,
    result_for,
    spawn_actor,
    stop_process,
    stopped_stats,
    wait_up,
)

TOTAL = 300
ACK_WAIT_S = 30.0
"""The diagnosers' consumer's ack wait (``actors.kinds.diagnoser``): a message a drained diagnoser
dropped would come back only after it."""


async def test_diagnoser_hot_swap_under_load_loses_and_doubles_nothing(
    nats_url: str, run_id: str, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test-swap")
    run = await register_run(bus, run_id)
    common = ["--nats", nats_url, "--run", run_id]
    v1 = spawn_actor("diagnoser", "--id", "diag-v1", "--version", "1.0.0", *common, log=tmp_path / "v1.log")
    v2 = None
    published: Counter[str] = Counter()

    async def count(msg: Msg) -> None:
        published[Feedback.model_validate_json(msg.data).candidate_id] += 1

    tally = await bus.nc.subscribe(subjects.feedback(run_id), cb=count)
    try:
        await wait_up(bus, "diag-v1")

        produced = 0
        stop_producing = asyncio.Event()

        async def produce() -> None:
            # Continuous load for as long as the swap takes (however slowly v2 starts), at least TOTAL.
            nonlocal produced
            while produced < TOTAL or not stop_producing.is_set():
                cand = candidate(run, produced)
                await bus.publish_durable(
                    subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id
                )
                result = result_for(
                    cand, EvalStatus.COMPILE_ERROR, "compile error", compile_log="SyntaxError: invalid syntax (line 3)"
                )
                await bus.publish_durable(subjects.results(run_id, "i0"), result, msg_id=f"result-{cand.candidate_id}")
                produced += 1
                await asyncio.sleep(0.01)  # continuous load: about 100 results per second

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.8)
        v2 = spawn_actor("diagnoser", "--id", "diag-v2", "--version", "2.0.0", *common, log=tmp_path / "v2.log")
        await wait_up(bus, "diag-v2")
        drained = await bus.request(
            subjects.control("diag-v1"), Control(action=ControlAction.DRAIN, reason="swap"), ActorInfo, timeout=5
        )
        assert drained.version == "1.0.0"
        drain_started = time.monotonic()
        assert await asyncio.to_thread(v1.wait, 30) == 0  # v1 left cleanly while the load went on
        drain_s = time.monotonic() - drain_started
        await asyncio.sleep(0.5)  # v2 alone takes the load for a while
        stop_producing.set()
        await producer
        feedback = await collect(
            bus, subjects.run_stream(run_id), subjects.feedback(run_id), Feedback, want=produced, timeout=60
        )
        consumer = await bus.js.consumer_info(subjects.run_stream(run_id), subjects.DIAGNOSERS)
        await tally.unsubscribe()
        feedback_s = time.monotonic() - drain_started
    finally:
        if v2 is not None:
            assert stop_process(v2) == 0
        stop_process(v1)
        await bus.close()
    # What each diagnoser received more than once (JetStream's delivery count), from its last word.
    redelivered = {name: stopped_stats(tmp_path / f"{name}.log")["redelivered"] for name in ("v1", "v2")}
    counts = Counter(f.candidate_id for f in feedback)
    assert len(counts) == produced, f"lost {produced - len(counts)}"
    assert max(counts.values()) == 1, f"doubled: {[c for c, n in counts.items() if n > 1]}"
    by = Counter(f.diagnosis.diagnoser.split("/")[0] for f in feedback)
    assert by["diag-v1"] > 0
    assert by["diag-v2"] > 0
    assert by["diag-v1"] + by["diag-v2"] == produced
    assert all(f.diagnosis.category.family == "compile" for f in feedback)
    # Each result was diagnosed exactly once: one feedback publish per candidate, no second
    # attempt that the stream's de-duplication would have hidden.
    assert len(published) == produced
    doubled = {c: n for c, n in published.items() if n > 1}
    assert not doubled, f"results handled more than once: {doubled}"
    # The drained diagnoser finished what it held: nothing came back after the ack wait.
    assert consumer.num_redelivered == 0, f"{consumer.num_redelivered} results were redelivered"
    assert consumer.num_ack_pending == 0
    assert redelivered == {"v1": 0, "v2": 0}, f"deliveries after the first: {redelivered}"
    assert drain_s < ACK_WAIT_S, f"drain took {drain_s:.1f} s, as long as a redelivery"
    assert feedback_s < ACK_WAIT_S, f"the last feedback came {feedback_s:.1f} s after the drain: a redelivery"
