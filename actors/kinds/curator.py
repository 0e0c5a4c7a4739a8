"""Curator actor: keeps the experience library and answers retrieval queries.

Reads:  the ``KF_EXPERIENCE`` stream — ``kf.exp.record`` (``Experience``), ``kf.exp.outcome``
        (``ExperienceOutcome``) and ``kf.exp.batch`` (``ExperienceBatch``, both kinds in the order
        they were made, as islands write them) — from the sequence after its last snapshot, then
        live. The stream
        is the source of truth; snapshots are a cache, so a curator killed and restarted rebuilds
        or reloads its library without loss.
Serves: ``kf.exp.query`` (``ExperienceQuery`` → ``ExperienceHits``) in the queue group
        ``kf-curator``; several curators share the load, each with the whole library.
Writes: snapshots under its directory (``$KFOUNDRY_HOME/experience`` by default).

Embedding and FAISS searches run in worker threads, never on the event loop. Records are embedded
``batch`` at a time in stream order, so a stop waits for one batch at most: what was not embedded
yet stays in the stream, after the snapshot's last sequence, and the next curator replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from actors.runtime.base import Actor
from actors.runtime.bus import settled
from actors.runtime.nats_server import kfoundry_home
from schemas import (
    ActorKind,
    Experience,
    ExperienceBatch,
    ExperienceHits,
    ExperienceOutcome,
    ExperienceQuery,
    subjects,
)

if TYPE_CHECKING:
    from experience.embedders import Embedder

Pending = tuple[int, Experience | ExperienceOutcome | None]
"""A record delivered and not yet in the library: its stream sequence and the record (``None``
for a message the library has no use for, e.g. one dead-lettered as invalid)."""


def _take(pending: list[Pending], n: int) -> tuple[list[Pending], list[Pending]]:
    """The first ``n`` pending items and the rest, never splitting the items of one stream message
    (a batch): the last sequence applied then covers whole messages, so a stop between two parts
    cannot leave a snapshot that says a batch was applied when half of it was not."""
    end = min(n, len(pending))
    while end < len(pending) and pending[end][0] == pending[end - 1][0]:
        end += 1
    return pending[:end], pending[end:]


class CuratorActor(Actor):
    """The experience library on the bus (see the module docstring)."""

    kind = ActorKind.CURATOR
    description = "Experience library: records transitions, answers retrieval queries"

    def __init__(
        self,
        *,
        nats_url: str,
        directory: Path | None = None,
        embedder: str | Embedder = "minilm",
        snapshot_every_s: float = 30.0,
        batch: int = 32,
        actor_id: str | None = None,
        version: str | None = None,
        concurrency: int = 4,
    ) -> None:
        super().__init__(nats_url=nats_url, run_id=None, actor_id=actor_id, version=version)
        self.concurrency = concurrency
        """Experience queries answered at once."""
        self.directory = directory or kfoundry_home() / "experience"
        self.prefer = embedder
        """An embedder kind (``minilm``, ``hashing``), or an embedder itself."""
        self.snapshot_every_s = snapshot_every_s
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        """Records embedded at a time (a stop waits for one such batch at most)."""
        self.library: Any = None
        self.last_seq = 0
        self.saved_seq = 0
        self.replayed = 0
        self.queries = 0
        self.caught_up = asyncio.Event()
        self._pending: list[Pending] = []
        self._leaving = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._sub: Any = None

    async def setup(self) -> None:
        from experience.embedders import default_embedder
        from experience.library import ExperienceLibrary

        await self.bus.ensure_shared_streams()
        embedder = (
            await asyncio.to_thread(default_embedder, self.prefer, eager=True)
            if isinstance(self.prefer, str)
            else self.prefer
        )
        loaded = await asyncio.to_thread(ExperienceLibrary.load, self.directory, embedder)
        if loaded is None:
            self.library = ExperienceLibrary(embedder)
            self.log.info("experience library: new", embedder=embedder.name, dir=str(self.directory))
        else:
            self.library, self.last_seq = loaded
            self.saved_seq = self.last_seq
            self.log.info("experience library: snapshot loaded", size=len(self.library), last_seq=self.last_seq)
        info = await settled(
            "reading the experience stream's state", lambda: self.bus.js.stream_info(subjects.EXPERIENCE_STREAM)
        )
        end_seq = int(info.state.last_seq)
        if end_seq <= self.last_seq:
            self.caught_up.set()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last_seq + 1)
        self._target = end_seq
        self._sub = await self.bus.js.subscribe(
            f"{subjects.PREFIX}.exp.>",
            stream=subjects.EXPERIENCE_STREAM,
            ordered_consumer=True,
            config=config,
            cb=self._on_record,
        )
        self._tasks.append(asyncio.create_task(self._ingest_loop()))
        await self.bus.serve(
            self.service,
            name="query",
            subject=subjects.EXPERIENCE_QUERY,
            request_type=ExperienceQuery,
            handler=self.query,
            queue_group="kf-curator",
            concurrency=self.concurrency,
        )

    async def _on_record(self, msg: Msg) -> None:
        seq = int(msg.metadata.sequence.stream)
        try:
            # Typed by its subject (one JSON pass), not by the payload's ``type`` (two).
            items: tuple[Experience | ExperienceOutcome, ...] = (
                (Experience.model_validate_json(msg.data),)
                if msg.subject == subjects.EXPERIENCE_RECORD
                else ExperienceBatch.model_validate_json(msg.data).items
                if msg.subject == subjects.EXPERIENCE_BATCH
                else (ExperienceOutcome.model_validate_json(msg.data),)
                if msg.subject == subjects.EXPERIENCE_OUTCOME
                else ()
            )
        except ValueError as exc:
            await self.bus.dead_letter(msg.subject, msg.data, reason="invalid", error=str(exc), stream_seq=seq)
            items = ()
        # Queued even when of no use, so the last sequence passes it only with the records before it.
        self._pending += [(seq, item) for item in items] if items else [(seq, None)]

    async def _ingest_loop(self) -> None:
        """Embed what arrived, a batch at a time in stream order, until the curator leaves; save
        a snapshot every ``snapshot_every_s``."""
        last_save = time.monotonic()
        while not self._leaving.is_set():
            if len(self._pending) < self.batch:  # a backlog is worked off without pausing
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await self._leaving.wait()
                if self._leaving.is_set():
                    break
            if self._pending:
                batch, self._pending = _take(self._pending, self.batch)
                async with self._lock:
                    await asyncio.to_thread(self._apply, batch)
            if self.last_seq >= self._target:
                self.caught_up.set()
            if self.last_seq > self.saved_seq and time.monotonic() - last_save > self.snapshot_every_s:
                await self.save()
                last_save = time.monotonic()

    def _apply(self, batch: list[Pending]) -> None:
        self.library.apply_many([item for _, item in batch if item is not None])  # in stream order
        self.replayed += len(batch)
        self.last_seq = max(self.last_seq, max(seq for seq, _ in batch))

    async def save(self) -> None:
        """Write a snapshot with the last stream sequence it contains."""
        async with self._lock:
            seq = self.last_seq
            await asyncio.to_thread(self.library.save, self.directory, last_seq=seq)
        self.saved_seq = seq
        self.log.info("experience snapshot saved", size=len(self.library), last_seq=seq)

    async def query(self, q: ExperienceQuery) -> ExperienceHits:
        """Retrieve experiences for a query (after the initial replay, or 5 s at most)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self.caught_up.wait()
        self.queries += 1
        hits: ExperienceHits = await asyncio.to_thread(self.library.search, q)
        return hits

    async def on_drain(self) -> None:
        """Stop reading, finish the batch being embedded (not the backlog: a stop must not wait
        for it), and snapshot what the library holds. The records left are after the snapshot's
        last sequence in the stream: the next curator replays them."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
        self._leaving.set()
        for task in self._tasks:
            await task
        if self._pending:
            self.log.info(
                "records left to the stream for the next curator",
                count=len(self._pending),
                from_seq=self._pending[0][0],
            )
            self._pending = []
        if self.library is not None and self.last_seq > self.saved_seq:
            await self.save()

    def extra_stats(self) -> dict[str, float | int | str | None]:
        return {
            "library_size": len(self.library) if self.library is not None else 0,
            "last_seq": self.last_seq,
            "queries": self.queries,
            "replayed": self.replayed,
        }
