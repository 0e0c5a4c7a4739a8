"""A concurrency limit per LLM endpoint, shared by every client of that endpoint in the process.

:func:`endpoint_limiter` returns one :class:`EndpointLimiter` per ``base_url`` and event loop
(asyncio primitives belong to one loop). Its capacity is the latest configured for that URL and
can change while callers wait, so a live reconfiguration of ``concurrency`` takes effect at once.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class EndpointLimiter:
    """A counting limiter whose capacity can change while callers wait (FIFO)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def capacity(self) -> int:
        """Calls allowed at once."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Calls holding a slot now."""
        return self._in_use

    def set_capacity(self, capacity: int) -> None:
        """Change the capacity; waiters are admitted at once if it grew."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._wake()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``."""
        await self._acquire()
        try:
            yield
        finally:
            self._in_use -= 1
            self._wake()

    async def _acquire(self) -> None:
        if self._in_use < self._capacity and not self._waiters:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._in_use -= 1  # granted just as we were cancelled: hand it on
                self._wake()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def _wake(self) -> None:
        while self._waiters and self._in_use < self._capacity:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_use += 1
                waiter.set_result(None)


_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, EndpointLimiter]] = (
    weakref.WeakKeyDictionary()
)


def endpoint_limiter(base_url: str, capacity: int) -> EndpointLimiter:
    """The limiter of ``base_url`` in the running loop; ``capacity`` is the latest configured."""
    per_loop = _LIMITERS.setdefault(asyncio.get_running_loop(), {})
    key = base_url.rstrip("/")
    limiter = per_loop.get(key)
    if limiter is None:
        limiter = per_loop[key] = EndpointLimiter(capacity)
    elif limiter.capacity != capacity:
        limiter.set_capacity(capacity)
    return limiter
