"""The island brain's state as one pydantic model: what ``IslandBrain.to_json`` saves to KV."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.archive import ArchiveState
from actors.evolution.credit import CreditState
from actors.evolution.headroom import Headroom
from actors.evolution.plans import FitnessPoint, IslandConfig
from actors.evolution.stagnation import StagnationDetector
from schemas import EvalOutcome, Feedback, StopReason


class BrainState(BaseModel):
    """The serialised brain."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    island: str
    seed: int
    config: IslandConfig
    archive: ArchiveState
    credit: CreditState
    stagnation: StagnationDetector
    rng: dict[str, Any]
    repair: list[Feedback]
    outcomes: dict[str, EvalOutcome]
    visits: dict[str, int]
    seen: list[str]
    history: list[FitnessPoint]
    evaluated: int
    in_flight: int
    tokens_used: int
    plans: int
    declines: int
    stopped: StopReason | None
    headroom: Headroom = Field(default_factory=Headroom)
    fresh_starts: int = 0
    """Fresh starts asked so far (a restarted island goes on to the next starting points)."""
    kernels: list[str] = Field(default_factory=list)
    """Fingerprints of the island's kernels, oldest first (none published twice after a restart)."""
