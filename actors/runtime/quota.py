"""The run's candidate quota: an exact count of candidates issued, shared by every island.

``--candidates N`` means N candidates evaluated, with several islands in several processes. Each
island reserves slots before it publishes candidates, by compare-and-set on one key of the
``kf_runs`` bucket (``<run>.issued``): a reservation never takes the count past N, so at most N
candidates are ever published, and each published candidate is evaluated (JetStream keeps it
until an evaluator acknowledges its result). Slots are reserved a few at a time (fewer as the
quota runs out) and unused ones are given back when an island stops, so the count stays exact.
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from actors.runtime.bus import Bus
from actors.runtime.errors import BusError
from actors.runtime.kv import bucket
from actors.runtime.logs import get_logger
from schemas import subjects

_ATTEMPTS = 64

log = get_logger(__name__)


def issued_key(run_id: str) -> str:
    """Key of the run's issued-candidates counter in the runs bucket."""
    return f"{run_id}.issued"


class CandidateQuota:
    """Reservations against the run's candidate budget (see the module docstring)."""

    def __init__(self, bus: Bus, run_id: str, limit: int | None, *, islands: int = 1) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        self.bus, self.run_id, self.limit = bus, run_id, limit
        self.islands = max(1, islands)
        self.held = 0
        """Slots this holder reserved and has not used yet."""
        self.exhausted = False
        """Set once a reservation found no slot left (sticky)."""
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await bucket(self.bus, subjects.RUNS_BUCKET)
        return self._kv

    async def _read(self, kv: KeyValue) -> tuple[int, int]:
        """(value, revision); revision 0 when the key does not exist yet."""
        try:
            entry = await kv.get(issued_key(self.run_id))
        except nats.js.errors.KeyNotFoundError:
            return 0, 0
        return int(entry.value or b"0"), int(entry.revision or 0)

    async def _add(self, want: int, *, floor: int = 0) -> int:
        """Add up to ``want`` (negative: give back) without passing the limit; returns the change."""
        kv = await self._bucket()
        key = issued_key(self.run_id)
        for _ in range(_ATTEMPTS):
            try:
                value, revision = await self._read(kv)
            except (TimeoutError, nats.errors.Error) as exc:
                # NATS is away (a restart): the counter is safe in the stream; ask again shortly.
                log.warning("candidate quota unreadable, retrying", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                continue
            room = want if self.limit is None or want < 0 else min(want, self.limit - value)
            if want >= 0 and room < floor:
                return 0
            new = max(0, value + room)
            try:
                if revision == 0:
                    await kv.create(key, str(new).encode())
                else:
                    await kv.update(key, str(new).encode(), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another island moved the counter first: read it again
            except (TimeoutError, nats.errors.Error) as exc:
                # Unknown whether the update landed. If it did, its slots are lost to this run, which
                # then ends when every island has stopped with nothing in flight (never past N).
                log.warning("candidate quota update unconfirmed, retrying", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                continue
            return new - value
        raise BusError(f"candidate quota of run {self.run_id}: no compare-and-set succeeded in {_ATTEMPTS} tries")

    async def take(self) -> bool:
        """One slot for a candidate about to be published; False when the budget is spent."""
        if self.limit is None:
            return True
        async with self._lock:
            return await self._take()

    async def _take(self) -> bool:
        assert self.limit is not None
        if self.held == 0 and not self.exhausted:
            value, _ = await self._read(await self._bucket())
            remaining = self.limit - value
            chunk = max(1, min(64, remaining // (4 * self.islands)))
            self.held += await self._add(chunk, floor=1)
            if self.held == 0:
                self.exhausted = True
        if self.held == 0:
            return False
        self.held -= 1
        return True

    async def give_back(self) -> None:
        """Return the slots held and not used (an island that stops)."""
        async with self._lock:
            if self.held and self.limit is not None:
                n, self.held = self.held, 0
                await self._add(-n)

    async def issued(self) -> int:
        """Candidates issued so far in the whole run."""
        value, _ = await self._read(await self._bucket())
        return value
