"""The curator on a real server: records in, queries answered, and a SIGKILL loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from actors.kinds.curator import CuratorActor
from actors.runtime.bus import Bus
from actors.runtime.errors import BusError
from actors.runtime.nats_server import start_server, stop_server
from experience import ExperienceLibrary, HashingEmbedder
from experience.embedders import Matrix
from schemas import (
    DiagnosisCategory,
    Experience,
    ExperienceBatch,
    ExperienceHits,
    ExperienceQuery,
    subjects,
)
from tests.bus.helpers import SIG, experience_record, spawn_actor, stop_process


async def _query(bus: Bus, run_id: str, want_size: int, timeout: float = 60.0) -> ExperienceHits:
    query = ExperienceQuery(signature=SIG, diagnosis=DiagnosisCategory.SLOW_MEMORY_BOUND, text="memory bound", k=5)
    async with asyncio.timeout(timeout):
        while True:
            try:
                hits = await bus.request(subjects.EXPERIENCE_QUERY, query, ExperienceHits, timeout=5.0)
            except BusError:
                hits = None
            if hits is not None and hits.library_size >= want_size:
                return hits
            await asyncio.sleep(0.2)


async def _records_in_stream(bus: Bus) -> int:
    """Experiences other tests on this server already recorded, one a message or in islands' batches
    (their outcome updates add none)."""
    info = await bus.js.stream_info(subjects.EXPERIENCE_STREAM, subjects_filter=subjects.EXPERIENCE_RECORD)
    records = sum((info.state.subjects or {}).values())
    batches = await bus.js.stream_info(subjects.EXPERIENCE_STREAM, subjects_filter=subjects.EXPERIENCE_BATCH)
    if not batches.state.subjects:
        return records
    sub = await bus.js.subscribe(subjects.EXPERIENCE_BATCH, stream=subjects.EXPERIENCE_STREAM, ordered_consumer=True)
    try:
        for _ in range(sum(batches.state.subjects.values())):
            batch = ExperienceBatch.model_validate_json((await sub.next_msg(timeout=10.0)).data)
            records += sum(isinstance(item, Experience) for item in batch.items)
    finally:
        await sub.unsubscribe()
    return records


async def test_curator_killed_and_restarted_keeps_its_library(nats_url: str, run_id: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test-curator")
    await bus.ensure_shared_streams()
    before = await _records_in_stream(bus)
    args = ["--nats", nats_url, "--embedder", "hashing", "--library-dir", str(tmp_path / "lib")]
    first = spawn_actor("curator", "--id", "curator-a", *args, log=tmp_path / "a.log")
    second = None
    try:
        for i in range(40):
            record = experience_record(run_id, i)
            await bus.publish_durable(subjects.EXPERIENCE_RECORD, record, msg_id=record.experience_id)
        hits = await _query(bus, run_id, before + 40)
        assert len(hits.hits) == 5
        assert hits.embedder.startswith("hash")
        os.killpg(first.pid, signal.SIGKILL)  # no snapshot on the way out
        first.wait(timeout=10)
        for i in range(40, 50):
            record = experience_record(run_id, i)
            await bus.publish_durable(subjects.EXPERIENCE_RECORD, record, msg_id=record.experience_id)
        stream_end = int((await bus.js.stream_info(subjects.EXPERIENCE_STREAM)).state.last_seq)
        second = spawn_actor("curator", "--id", "curator-b", *args, log=tmp_path / "b.log")
        hits = await _query(bus, run_id, before + 50)
        assert hits.library_size == before + 50
        ids = {h.experience.experience_id for h in hits.hits}
        assert all(i.startswith(run_id) for i in ids)
        # The best hits answer the same diagnosis as the query.
        assert hits.hits[0].experience.diagnosis is DiagnosisCategory.SLOW_MEMORY_BOUND
    finally:
        if second is not None:
            assert stop_process(second) == 0
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        await bus.close()
    # The clean stop of the second curator wrote a snapshot with everything it had replayed.
    loaded = ExperienceLibrary.load(tmp_path / "lib", HashingEmbedder())
    assert loaded is not None
    library, last_seq = loaded
    assert len(library) == before + 50
    assert last_seq >= stream_end


class _SlowHashing(HashingEmbedder):
    """The hashing embedder at about MiniLM's pace on a busy machine (20 ms a text); ``busy`` is
    set once it has embedded ``busy_after`` texts."""

    def __init__(self, busy_after: int) -> None:
        super().__init__()
        self.embedded = 0
        self.busy_after = busy_after
        self.busy = threading.Event()

    def embed(self, texts: Sequence[str]) -> Matrix:
        time.sleep(0.02 * len(texts))
        self.embedded += len(texts)
        if self.embedded >= self.busy_after:
            self.busy.set()
        return super().embed(texts)


@pytest.fixture
def own_nats_url(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own: its experience stream holds only what the test writes."""
    info = start_server(tmp_path / "nats")
    try:
        yield info.url
    finally:
        stop_server(info.pid)


@pytest.mark.parametrize("per_message", [1, 7], ids=["records", "batches"])
async def test_curator_stops_without_embedding_its_backlog_and_the_next_one_replays_it(
    own_nats_url: str, run_id: str, tmp_path: Path, per_message: int
) -> None:
    """With batches of 7 (as islands write them) and a curator that embeds 8 records at a time,
    the stop falls between two parts of a batch unless the curator keeps batches whole: the next
    curator would then start after a batch half of which was never embedded."""
    nats_url = own_nats_url
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-curator-backlog-{run_id}")
    await bus.ensure_shared_streams()
    n = 301  # 6 s of embedding at 20 ms a record: far more than a stop may take
    records = [experience_record(run_id, i) for i in range(n)]
    if per_message == 1:
        await asyncio.gather(
            *(bus.publish_durable(subjects.EXPERIENCE_RECORD, r, msg_id=r.experience_id) for r in records)
        )
    else:
        for start in range(0, n, per_message):
            batch = ExperienceBatch(items=tuple(records[start : start + per_message]))
            await bus.publish_durable(subjects.EXPERIENCE_BATCH, batch, msg_id=batch.batch_id)
    total = await _records_in_stream(bus)  # this test's records and those of earlier tests
    stream_end = int((await bus.js.stream_info(subjects.EXPERIENCE_STREAM)).state.last_seq)
    embedder = _SlowHashing(busy_after=16)
    first = CuratorActor(nats_url=nats_url, directory=tmp_path / "lib", embedder=embedder, batch=8)
    running = asyncio.create_task(first.run())
    try:
        assert await asyncio.to_thread(embedder.busy.wait, 30)  # it is working off the backlog
        asked = time.monotonic()
        first.request_stop("test")
        async with asyncio.timeout(30):
            await running
        took = time.monotonic() - asked
    finally:
        first.request_stop("test")
        await asyncio.gather(running, return_exceptions=True)
    assert took < 2.0  # one batch of 8 (0.16 s) and a snapshot, not the backlog
    saved = ExperienceLibrary.load(tmp_path / "lib", HashingEmbedder())
    assert saved is not None
    library, last_seq = saved
    assert 16 <= len(library) < total  # the backlog was left to the stream ...
    assert last_seq < stream_end  # ... after the snapshot's last sequence
    # The next curator starts from the snapshot and replays the rest from the stream: all of it.
    second = CuratorActor(nats_url=nats_url, directory=tmp_path / "lib", embedder="hashing")
    running = asyncio.create_task(second.run())
    try:
        hits = await _query(bus, run_id, total)
        assert hits.library_size == total
    finally:
        second.request_stop("test")
        await running
        await bus.close()
