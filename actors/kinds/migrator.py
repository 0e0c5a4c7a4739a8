"""Migrator actor: moves elites between the islands of a run.

Reads:  ``kf.<run>.elite.*`` (``EliteAnnouncement``) through the run's durable consumer
        ``migrators``; ``kf.<run>.status.*`` (``IslandStatus``, core) for stagnation.
Writes: ``kf.<run>.migrant.<island>`` (``Migration``) into the run stream, with dedup ids;
        its planner state to the ``kf_archives`` KV bucket (``<run>.migrator``), so a restarted
        migrator continues without resending.

Only islands that announced themselves (an ``IslandStatus``: islands publish one when they start)
receive migrants, so an island the run expects but nobody started gets nothing. Ring topology by
default, random on request, and a migration into any island that starts to stagnate
(``actors.evolution.migration.MigrationPlanner`` decides; this actor only moves data).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from actors.evolution.migration import MigrationPlanner
from actors.runtime.base import Actor
from actors.runtime.bus import ConsumerSpec, Delivery
from actors.runtime.kv import get_run, load_text, save_text
from schemas import ActorKind, EliteAnnouncement, IslandStatus, Migration, subjects


class MigratorActor(Actor):
    """Plans and sends migrations for one run (see the module docstring)."""

    kind = ActorKind.MIGRATOR
    description = "Moves elites between islands (ring, random, on stagnation)"

    def __init__(
        self,
        *,
        nats_url: str,
        run_id: str,
        tick_s: float = 0.5,
        actor_id: str | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__(nats_url=nats_url, run_id=run_id, actor_id=actor_id, version=version)
        self.tick_s = tick_s
        self._planner: MigrationPlanner | None = None
        self.sent = 0
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.disabled = False
        """The run turned migration off (``RunSpec.ablations.no_migration``): nothing is sent."""
        self.present: set[str] = set()
        """Islands that announced themselves (an ``IslandStatus``): the only destinations."""

    @property
    def planner(self) -> MigrationPlanner:
        if self._planner is None:
            raise RuntimeError("migrator used before setup")
        return self._planner

    @property
    def _key(self) -> str:
        return subjects.archive_key(self.rid, "migrator")

    async def setup(self) -> None:
        spec = await get_run(self.bus, self.rid)
        self.disabled = spec.ablations.no_migration
        if self.disabled:
            self.log.info("migration is turned off for this run (--no-migration): no elites will be sent")
        saved = await load_text(self.bus, subjects.ARCHIVE_BUCKET, self._key)
        if saved is not None:
            self._planner = MigrationPlanner.from_json(saved)
            self.log.info("migration planner restored")
        else:
            islands = [f"i{i}" for i in range(spec.islands)]
            self._planner = MigrationPlanner(self.rid, islands, spec.migration, seed=spec.seed)
        await self.bus.consume(
            ConsumerSpec(
                stream=subjects.run_stream(self.rid),
                durable=subjects.MIGRATORS,
                filter_subject=subjects.elites(self.rid),
                ack_wait_s=30.0,
                max_deliver=5,
            ),
            EliteAnnouncement,
            self.on_elite,
            concurrency=1,
        )
        await self.bus.subscribe(subjects.island_status(self.rid), IslandStatus, self.on_status, concurrency=1)
        self._timer = asyncio.create_task(self._tick())

    async def on_elite(self, announcement: EliteAnnouncement, delivery: Delivery) -> None:
        async with self._lock:
            self.present.add(announcement.elite.island)
            self.planner.on_elite(announcement)
            await self._save()

    async def on_status(self, status: IslandStatus, delivery: Delivery) -> None:
        async with self._lock:
            if status.island not in self.present:
                self.present.add(status.island)
                self.log.info("island present", island=status.island)
            await self._send(self.planner.on_status(status))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            async with self._lock:
                await self._send(self.planner.due(time.time(), self.present))

    async def _send(self, migrations: list[Migration]) -> None:
        if self.disabled:
            return
        for migration in migrations:
            await self.bus.publish_durable(
                subjects.migrants(self.rid, migration.dest_island), migration, msg_id=migration.migration_id
            )
            self.sent += 1
            self.log.info(
                "migration",
                source=migration.source_island,
                dest=migration.dest_island,
                reason=str(migration.reason),
                elites=[e.candidate.candidate_id for e in migration.elites],
            )
        if migrations:
            await self._save()

    async def _save(self) -> None:
        await save_text(self.bus, subjects.ARCHIVE_BUCKET, self._key, self.planner.to_json())

    async def on_drain(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer

    def extra_stats(self) -> dict[str, float | int | str | None]:
        return {"migrations_sent": self.sent}
