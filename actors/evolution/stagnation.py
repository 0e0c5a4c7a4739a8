"""Stagnation: no improvement of the best fitness by more than ``eps`` (relative) for a window of
feedbacks or of seconds.

An island that only produces failures stagnates too (its best stays ``None``). Improvements
smaller than ``eps`` do not reset the window, but they add up: the reference point moves only on
a real improvement.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StagnationDetector(BaseModel):
    """Watches the best fitness of an island; serialisable as it is."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    window: int = Field(default=20, ge=1)
    """Feedbacks without improvement that make an island stagnant."""
    seconds: float | None = Field(default=None, gt=0)
    """Seconds without improvement that make it stagnant (``None``: feedback count only)."""
    eps: float = Field(default=0.01, ge=0)
    """Smallest relative improvement that counts."""
    reference: float | None = None
    """Best fitness at the last improvement."""
    since: int = Field(default=0, ge=0)
    """Feedbacks since the last improvement (or reset)."""
    since_at: float | None = None
    """When the last improvement (or reset, or first feedback) happened."""

    def observe(self, best: float | None, at: float) -> bool:
        """Record one feedback with the island's best fitness after it; returns ``stagnating``."""
        if self.since_at is None:
            self.since_at = at
        if best is not None and (self.reference is None or best > self.reference * (1.0 + self.eps)):
            self.reference = best
            self.since = 0
            self.since_at = at
        else:
            self.since += 1
        return self.is_stagnating(at)

    def is_stagnating(self, at: float | None = None) -> bool:
        """Whether the window has passed without improvement."""
        if self.since >= self.window:
            return True
        return (
            self.seconds is not None
            and at is not None
            and self.since_at is not None
            and at - self.since_at >= self.seconds
        )

    def reset(self, at: float) -> None:
        """Start a new window (after migrants arrived, for example)."""
        self.since = 0
        self.since_at = at
