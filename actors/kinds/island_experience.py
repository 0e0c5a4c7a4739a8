"""Writing what islands learn into the experience stream, a batch at a time.

Each feedback an island takes teaches one ``Experience`` record and often an ``ExperienceOutcome``.
Published as a message each, they cost two JetStream publishes (and their acknowledgements) in
the island and two deliveries in every curator per candidate: a third of the whole loop's CPU in
``bench/loop_bench.py``. The writer gathers the items of the feedbacks an island handles within
``linger_s`` into one ``ExperienceBatch`` on ``kf.exp.batch``.

``write`` returns once the batch holding its items is stored in the stream (or raises what the
publish raised), so an island acknowledges a feedback only after what it taught is kept: an island
killed with items waiting loses nothing, its feedback comes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from actors.runtime.bus import Bus
from schemas import ExperienceBatch, ExperienceItem, subjects

MAX_ITEMS = 32
"""Items per batch at most: an item carries up to 4,000 characters of kernel source, so a full
batch stays far below the NATS server's default 1 MB payload limit."""


class ExperienceWriter:
    """Batches experience records and outcomes into ``kf.exp.batch`` (see the module docstring)."""

    def __init__(self, bus: Bus, *, linger_s: float = 0.05, max_items: int = MAX_ITEMS) -> None:
        if linger_s < 0:
            raise ValueError(f"linger_s must be >= 0, got {linger_s}")
        if not 1 <= max_items <= MAX_ITEMS:
            raise ValueError(f"max_items must be within 1..{MAX_ITEMS}, got {max_items}")
        self.bus = bus
        self.linger_s = linger_s
        self.max_items = max_items
        self.batches = 0
        """Batches stored so far."""
        self.items = 0
        """Items stored so far."""
        self._items: list[ExperienceItem] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._publishing: set[asyncio.Task[None]] = set()

    async def write(self, items: Sequence[ExperienceItem]) -> None:
        """Queue ``items`` (in order) and wait until the batch holding them is stored."""
        if not items:
            return
        loop = asyncio.get_running_loop()
        if self._items and len(self._items) + len(items) > self.max_items:
            self._send()  # a write's items go in one batch (one bigger than max_items alone)
        stored: asyncio.Future[None] = loop.create_future()
        self._items.extend(items)
        self._waiters.append(stored)
        if len(self._items) >= self.max_items:
            self._send()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self._send)
        await stored

    async def flush(self) -> None:
        """Send what is queued now and wait for every batch on its way (a stop's last step)."""
        self._send()
        if self._publishing:
            await asyncio.gather(*self._publishing, return_exceptions=True)

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, waiters = self._items, self._waiters
        self._items, self._waiters = [], []
        if items:
            task = asyncio.create_task(self._publish(tuple(items), waiters))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)

    async def _publish(self, items: tuple[ExperienceItem, ...], waiters: list[asyncio.Future[None]]) -> None:
        batch = ExperienceBatch(items=items)
        try:
            await self.bus.publish_durable(subjects.EXPERIENCE_BATCH, batch, msg_id=batch.batch_id)
        except Exception as exc:  # noqa: BLE001 - handed to every writer of the batch (their feedbacks are nak'ed)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        except asyncio.CancelledError:
            for waiter in waiters:
                waiter.cancel()
            raise
        self.batches += 1
        self.items += len(items)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
