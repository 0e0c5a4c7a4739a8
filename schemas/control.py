"""Control, discovery and dead letters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import Message, Model, now
from schemas.enums import ActorKind, ActorState, ControlAction


class Control(Message):
    """An instruction to one actor (``kf.ctl.<actor-id>``)."""

    type: Literal["control"] = "control"
    """Wire name of this message type."""
    action: ControlAction
    """What to do."""
    reason: str = ""
    """Why (logged by the actor)."""


class ActorStats(Model):
    """A statistics snapshot of one actor."""

    received: int = 0
    """Messages received (valid or not)."""
    processed: int = 0
    """Messages handled successfully."""
    errors: int = 0
    """Handler failures (retried or dead-lettered)."""
    dead_lettered: int = 0
    """Messages sent to the dead-letter subject."""
    redelivered: int = 0
    """JetStream messages received more than once."""
    in_flight: int = 0
    """Messages being handled now."""
    last_error: str | None = None
    """The most recent error, one line."""
    mean_handle_ms: float | None = None
    """Mean handler time."""
    extra: dict[str, float | int | str | None] = Field(default_factory=dict)
    """Actor-specific counters (e.g. best fitness of an island)."""


class ActorInfo(Message):
    """Who an actor is and how it is doing (reply to a control message, and ``$SRV`` metadata)."""

    type: Literal["actor_info"] = "actor_info"
    """Wire name of this message type."""
    actor_id: str
    """Unique id of the actor instance."""
    kind: ActorKind
    """Its kind."""
    name: str
    """Service name it registered under (e.g. ``kf-evaluator``, or the expert's name)."""
    version: str
    """Its version (semantic)."""
    host: str
    """Host it runs on."""
    pid: int
    """Its process id."""
    run_id: str | None = None
    """Run it serves; ``None`` for actors shared between runs (experts, curator)."""
    island: str | None = None
    """Island it owns, for island actors."""
    state: ActorState
    """Lifecycle state."""
    started_at: float
    """When it started."""
    stats: ActorStats = ActorStats()
    """Its statistics snapshot."""
    at: float = Field(default_factory=now)
    """When this snapshot was taken."""


class DeadLetter(Message):
    """A message an actor could not accept or handle, kept with the reason (``kf.dlq.<run>``)."""

    type: Literal["dead_letter"] = "dead_letter"
    """Wire name of this message type."""
    subject: str
    """Subject the message arrived on."""
    reason: Literal["invalid", "poison", "max_deliveries", "handler_error"]
    """Why it was dead-lettered."""
    error: str
    """The validation error or exception, as text."""
    payload: str
    """The payload as text (truncated to 64 KiB; undecodable bytes escaped)."""
    actor_id: str
    """Actor that gave up on it."""
    deliveries: int | None = None
    """JetStream delivery count, where known."""
    stream_seq: int | None = None
    """Sequence in its stream, where known."""
    at: float = Field(default_factory=now)
    """When it was dead-lettered."""
