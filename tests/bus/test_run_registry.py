"""The run registry on a real nats-server: a run id the server knows is never registered again
(not even by two runs started at once), each run's state is read from its stream and its readers,
a stop request reaches the controller's count, and a removed run leaves nothing behind (its id is
free again, other runs are untouched)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from actors.commands.progress import Progress, RunWatcher
from actors.commands.run_registry import (
    RunState,
    find_run,
    list_runs,
    read_run,
    register_new_run,
    remove_run,
)
from actors.runtime.bus import Bus
from actors.runtime.errors import ConfigError, RunIdTaken
from actors.runtime.kv import bucket, get_run, save_text
from actors.runtime.quota import CandidateQuota, issued_key
from schemas import RunEnd, RunSpec, RunStop, StopReason, Task, subjects
from tests.bus.helpers import REFERENCE

pytestmark = pytest.mark.timeout(60)

OTHER_TASK = REFERENCE.replace("torch.relu(x)", "torch.tanh(x)")


def _spec(run_id: str, source: str = REFERENCE, name: str = "relu") -> RunSpec:
    return RunSpec(run_id=run_id, task=Task.from_source(name, source))


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-registry-{uuid.uuid4().hex[:6]}")
    await bus.ensure_shared_streams()
    try:
        yield bus
    finally:
        await bus.close()


async def _end(bus: Bus, run_id: str, reason: StopReason = StopReason.CANDIDATES) -> None:
    end = RunEnd(run_id=run_id, reason=reason, evaluated=3, best_fitness=1.5, best_candidate_id="c1")
    await bus.publish_durable(subjects.run_end(run_id), end, msg_id=f"end-{run_id}")


async def test_a_registered_run_id_is_refused_to_a_new_run_and_its_entry_is_kept(bus: Bus, run_id: str) -> None:
    first = _spec(run_id)
    await register_new_run(bus, first)
    await _end(bus, run_id)
    with pytest.raises(RunIdTaken) as refused:
        await register_new_run(bus, _spec(run_id, OTHER_TASK, "tanh"))
    text = str(refused.value)
    assert text.startswith(f"run id {run_id} is already used (ended (candidates), registered ")
    assert f"task relu {first.task.task_id})" in text  # the holder, not the newcomer
    assert text.endswith("; choose another --run-id")
    assert await get_run(bus, run_id) == first  # the registry entry was not overwritten
    with pytest.raises(RunIdTaken) as again:
        await register_new_run(bus, _spec(run_id))
    assert "the same task" in str(again.value)  # a run cannot be resumed under its id


async def test_a_run_id_whose_stream_holds_messages_is_refused_without_a_registry_entry(bus: Bus, run_id: str) -> None:
    await bus.ensure_run_stream(run_id)
    await _end(bus, run_id)
    with pytest.raises(RunIdTaken, match=r"no registry entry, 1 message\(s\) in its stream"):
        await register_new_run(bus, _spec(run_id))


async def test_of_two_runs_registered_at_once_with_one_id_exactly_one_is_refused(bus: Bus, run_id: str) -> None:
    specs = [_spec(run_id), _spec(run_id, OTHER_TASK, "tanh")]
    outcomes = await asyncio.gather(*(register_new_run(bus, s) for s in specs), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, RunIdTaken)]
    assert len(refused) == 1, outcomes
    winner = specs[outcomes.index(None)]
    assert await get_run(bus, run_id) == winner


async def test_a_run_is_running_while_a_controller_reads_it_abandoned_without_one_and_ended_by_its_end(
    bus: Bus, run_id: str
) -> None:
    spec = _spec(run_id)
    await register_new_run(bus, spec)
    run = await find_run(bus, run_id)
    assert run.state is RunState.ABANDONED  # registered; nobody reads its stream
    watcher = RunWatcher(bus, Progress(spec))
    await watcher.start()
    try:
        run = await find_run(bus, run_id)
        assert run.state is RunState.RUNNING
        assert "controller" in run.readers
    finally:
        await watcher.stop()
    await bus.publish_durable(subjects.run_stop(run_id), RunStop(run_id=run_id, by="ops@host"), msg_id="stop-1")
    await _end(bus, run_id, StopReason.INTERRUPTED)
    run = await find_run(bus, run_id)
    assert run.state is RunState.ENDED
    assert run.state_text() == "ended (stopped by ops@host)"
    assert (run.evaluated, run.best) == (3, 1.5)


async def test_a_stop_request_in_the_run_stream_ends_the_controllers_count_as_an_interrupt(
    bus: Bus, run_id: str
) -> None:
    spec = _spec(run_id)
    await register_new_run(bus, spec)
    progress = Progress(spec)
    watcher = RunWatcher(bus, progress)
    await watcher.start()
    try:
        assert progress.stop_reason() is None
        request = RunStop(run_id=run_id, by="ops@host", reason="wrong task")
        await bus.publish_durable(subjects.run_stop(run_id), request, msg_id="stop-1")
        async with asyncio.timeout(10):
            while progress.stop_request is None:
                watcher.changed.clear()
                await watcher.changed.wait()
    finally:
        await watcher.stop()
    assert progress.stop_request == request
    assert progress.stop_reason() is StopReason.INTERRUPTED


async def test_a_removed_run_leaves_no_stream_keys_or_dead_letters_and_its_id_is_free_again(
    bus: Bus, run_id: str
) -> None:
    other = run_id + "x"  # shares the prefix: a removal by prefix would take it too
    for rid in (run_id, other):
        await register_new_run(bus, _spec(rid))
        assert await CandidateQuota(bus, rid, 10).take()
        await save_text(bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(rid, "i0"), "{}")
        await save_text(bus, subjects.PROMPTS_BUCKET, f"{rid}.i0.fusion", "{}")
        await bus.js.publish(subjects.dead_letters(rid), b"{}", stream=subjects.DLQ_STREAM)
        await _end(bus, rid)
    issued = await CandidateQuota(bus, other, 10).issued()
    assert issued >= 1
    removed = await remove_run(bus, await find_run(bus, run_id))
    assert (removed.messages, removed.dead_letters) == (1, 1)
    assert await read_run(bus, run_id) is None
    for name, key in (
        (subjects.RUNS_BUCKET, run_id),
        (subjects.RUNS_BUCKET, issued_key(run_id)),
        (subjects.ARCHIVE_BUCKET, subjects.archive_key(run_id, "i0")),
        (subjects.PROMPTS_BUCKET, f"{run_id}.i0.fusion"),
    ):
        assert (name, key, await _keys(bus, name, key)) == (name, key, 0)
    dlq = await bus.js.stream_info(subjects.DLQ_STREAM, subjects_filter=subjects.dead_letters(run_id))
    assert not dlq.state.subjects
    kept = await find_run(bus, other)
    assert (kept.state, kept.issued, kept.messages) == (RunState.ENDED, issued, 1)
    assert await _keys(bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(other, "i0")) == 1
    await register_new_run(bus, _spec(run_id, OTHER_TASK, "tanh"))  # the id is free again
    assert (await get_run(bus, run_id)).task.name == "tanh"
    assert [r.run_id for r in await list_runs(bus) if r.run_id in (run_id, other)] == [run_id, other]


async def test_a_run_whose_stream_is_being_read_is_not_removed(bus: Bus, run_id: str) -> None:
    spec = _spec(run_id)
    await register_new_run(bus, spec)
    await _end(bus, run_id)
    watcher = RunWatcher(bus, Progress(spec))  # a controller still writing its results, say
    await watcher.start()
    try:
        with pytest.raises(ConfigError, match=f"run {run_id}'s stream is being read by controller"):
            await remove_run(bus, await find_run(bus, run_id))
    finally:
        await watcher.stop()
    assert (await find_run(bus, run_id)).messages == 1


async def _keys(bus: Bus, bucket_name: str, key: str) -> int:
    """Messages (any revision, delete markers included) the bucket holds for ``key``."""
    kv_stream = f"KV_{bucket_name}"
    await bucket(bus, bucket_name)
    info = await bus.js.stream_info(kv_stream, subjects_filter=f"$KV.{bucket_name}.{key}")
    return sum((info.state.subjects or {}).values())


async def test_status_shows_the_backlog_of_runs_not_ended_unless_asked_for_all(bus: Bus) -> None:
    """``kfoundry status`` lists consumer lag of live runs only (runs that ended days ago showed as
    lag); ``--all`` shows every run's, and a named run is always shown."""
    from nats.js.api import ConsumerConfig

    from actors.runtime.observe import Lag, consumer_lag

    live, ended = f"tl{uuid.uuid4().hex[:8]}", f"te{uuid.uuid4().hex[:8]}"
    for run in (live, ended):
        await bus.ensure_run_stream(run)
        await bus.js.add_consumer(subjects.run_stream(run), ConsumerConfig(durable_name="controller"))
    await _end(bus, ended)

    def streams(lags: list[Lag]) -> set[str]:
        return {lag.stream for lag in lags} & {subjects.run_stream(r) for r in (live, ended)}

    assert streams(await consumer_lag(bus.nc)) == {subjects.run_stream(live)}
    assert streams(await consumer_lag(bus.nc, ended=True)) == {subjects.run_stream(r) for r in (live, ended)}
    assert streams(await consumer_lag(bus.nc, run_id=ended)) == {subjects.run_stream(ended)}


async def test_the_controllers_count_catches_up_with_every_candidate_already_in_the_stream(
    bus: Bus, run_id: str
) -> None:
    """The run's end decides what was in flight from this count: a candidate published just before
    it must be counted (CI saw a RunEnd whose ``cancelled`` missed the one candidate in flight)."""
    spec = _spec(run_id)
    await register_new_run(bus, spec)
    progress = Progress(spec)
    watcher = RunWatcher(bus, progress)
    await watcher.start()
    try:
        ids = [f"c{i:03d}" for i in range(200)]
        for cid in ids:
            await bus.js.publish(subjects.candidates(run_id, "i0", cid), b"{}")
        assert await watcher.catch_up(10.0)
        assert progress.issued == set(ids)
    finally:
        await watcher.stop()
    await bus.js.publish(subjects.candidates(run_id, "i0", "late"), b"{}")
    assert not await watcher.catch_up(0.2)  # nobody reads any more: it says so instead of waiting
    assert "late" not in progress.issued
