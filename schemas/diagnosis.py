"""A diagnosis: what went wrong (or what limits speed), on what evidence, and who should act."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import Message, now
from schemas.enums import DiagnosisCategory


class Diagnosis(Message):
    """Typed feedback on one evaluation, produced by a diagnoser."""

    type: Literal["diagnosis"] = "diagnosis"
    """Wire name of this message type."""
    candidate_id: str
    """The candidate diagnosed."""
    category: DiagnosisCategory
    """Category from the fixed taxonomy."""
    summary: str
    """One sentence a person or an expert can read."""
    evidence: tuple[str, ...] = ()
    """The facts the category rests on (log lines, measurements, findings), each short."""
    hints: tuple[str, ...] = ()
    """What to try next, in plain language an expert can act on."""
    suggested_expert: str | None = None
    """Expert role best placed to act (e.g. ``repair``, ``memory``, ``tiling``)."""
    sol_distance: float | None = Field(default=None, ge=0)
    """1 - fraction of speed-of-light reached; ``None`` when not measured."""
    confidence: float = Field(default=1.0, ge=0, le=1)
    """How sure the diagnoser is of the category."""
    diagnoser: str = ""
    """Id and version of the diagnoser that produced it."""
    created_at: float = Field(default_factory=now)
    """When it was produced."""
