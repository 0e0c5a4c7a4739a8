"""The experience writer on a real server: feedbacks handled together share one batch, each write
returns only once its batch is in the stream, a full batch does not wait, and a failed publish
reaches every writer of the batch."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.kinds.island_experience import ExperienceWriter
from actors.runtime.bus import Bus
from schemas import Experience, ExperienceBatch, ExperienceOutcome, TaskSignature, subjects
from tests.bus.helpers import experience_record

pytestmark = pytest.mark.timeout(60)


async def _batches(bus: Bus, run_id: str) -> list[ExperienceBatch]:
    """The batches in the experience stream that hold this test's records, oldest first."""
    info = await bus.js.stream_info(subjects.EXPERIENCE_STREAM, subjects_filter=subjects.EXPERIENCE_BATCH)
    total = sum((info.state.subjects or {}).values())
    out: list[ExperienceBatch] = []
    if not total:
        return out
    sub = await bus.js.subscribe(subjects.EXPERIENCE_BATCH, stream=subjects.EXPERIENCE_STREAM, ordered_consumer=True)
    try:
        for _ in range(total):
            batch = ExperienceBatch.model_validate_json((await sub.next_msg(timeout=10.0)).data)
            if any(isinstance(i, Experience) and i.run_id == run_id for i in batch.items):
                out.append(batch)
    finally:
        await sub.unsubscribe()
    return out


def _record(run_id: str, i: int) -> Experience:
    """A record of a task no curator test queries (their hits must be their own records)."""
    return experience_record(run_id, i).model_copy(update={"signature": TaskSignature(ops=("writer-test",))})


def _outcome(run_id: str, i: int) -> ExperienceOutcome:
    return ExperienceOutcome(experience_ids=(f"{run_id}-e{i}",), candidate_id=f"c{i}", improved=i % 2 == 0)


async def test_writes_made_together_share_a_batch_and_return_once_it_is_stored(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-writer-{run_id}")
    await bus.ensure_shared_streams()
    writer = ExperienceWriter(bus, linger_s=0.2)
    try:
        writes = [(_record(run_id, i), _outcome(run_id, i)) for i in range(5)]
        started = time.monotonic()
        await asyncio.gather(*(writer.write(items) for items in writes))
        took = time.monotonic() - started
        batches = await _batches(bus, run_id)  # read after the writes returned: already stored
    finally:
        await bus.close()
    assert 0.15 <= took < 5.0  # they lingered for the batch, then went out together
    assert len(batches) == 1
    assert writer.batches == 1
    assert batches[0].items == tuple(item for items in writes for item in items)  # in order


async def test_a_full_batch_goes_out_without_lingering(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-writer-full-{run_id}")
    await bus.ensure_shared_streams()
    writer = ExperienceWriter(bus, linger_s=30.0, max_items=4)
    try:
        async with asyncio.timeout(10):  # far less than the linger
            await asyncio.gather(*(writer.write((_record(run_id, i),)) for i in range(8)))
        batches = await _batches(bus, run_id)
    finally:
        await bus.close()
    assert [len(b.items) for b in batches] == [4, 4]


async def test_a_failed_publish_reaches_every_writer_of_the_batch(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-writer-fail-{run_id}")
    writer = ExperienceWriter(bus, linger_s=0.05)
    await bus.nc.close()  # the publish of the batch cannot succeed
    outcomes = await asyncio.gather(*(writer.write((_record(run_id, i),)) for i in range(3)), return_exceptions=True)
    assert len(outcomes) == 3
    assert all(isinstance(o, Exception) for o in outcomes), outcomes
    assert writer.batches == 0
