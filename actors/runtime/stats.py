"""Statistics of one actor: counters and timings behind ``ActorStats`` snapshots."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from schemas import ActorStats


@dataclass
class StatsRecorder:
    """Mutable counters an actor and its bus update; ``snapshot()`` gives the wire form."""

    received: int = 0
    processed: int = 0
    errors: int = 0
    dead_lettered: int = 0
    redelivered: int = 0
    in_flight: int = 0
    last_error: str | None = None
    handle_s_total: float = 0.0
    extra: dict[str, float | int | str | None] = field(default_factory=dict)

    def start(self) -> float:
        """Count a message taken into handling; returns the start time for :meth:`done`."""
        self.received += 1
        self.in_flight += 1
        return time.perf_counter()

    def done(self, started: float, *, ok: bool, error: BaseException | None = None) -> None:
        """Count the end of a handling started at ``started``."""
        self.in_flight -= 1
        self.handle_s_total += time.perf_counter() - started
        if ok:
            self.processed += 1
        else:
            self.errors += 1
            if error is not None:
                self.last_error = f"{type(error).__name__}: {error}".splitlines()[0][:300]

    def invalid(self, error: str) -> None:
        """Count a message refused before handling (it goes to the dead-letter subject)."""
        self.received += 1
        self.errors += 1
        self.last_error = error.splitlines()[0][:300]

    def snapshot(self) -> ActorStats:
        """The wire form of the current counters."""
        handled = self.processed + self.errors
        return ActorStats(
            received=self.received,
            processed=self.processed,
            errors=self.errors,
            dead_lettered=self.dead_lettered,
            redelivered=self.redelivered,
            in_flight=self.in_flight,
            last_error=self.last_error,
            mean_handle_ms=(self.handle_s_total / handled * 1e3) if handled else None,
            extra=dict(self.extra),
        )
