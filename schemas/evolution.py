"""Evolution: feedback to islands, elites, migrations and progress reports."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import Message, Model, new_id, now
from schemas.candidate import Candidate, Decline, ParamValue
from schemas.diagnosis import Diagnosis
from schemas.enums import MigrationReason, StopReason
from schemas.evaluation import EvalResult


class Feedback(Message):
    """An evaluation and its diagnosis, delivered to the island that produced the candidate."""

    type: Literal["feedback"] = "feedback"
    """Wire name of this message type."""
    run_id: str
    """Run it belongs to."""
    island: str
    """Island it is addressed to."""
    candidate: Candidate | None = None
    """The candidate evaluated (its source and lineage), or ``None``, as diagnosers send it: the
    island that published the candidate has it, and anyone else reads it by its id from the run
    stream (``kf.<run>.cand.<island>.<candidate>``). Carrying it again was a fifth of the fabric's
    bytes per candidate."""
    result: EvalResult
    """The evaluator's verdict with evidence."""
    diagnosis: Diagnosis
    """The diagnoser's reading of it."""

    @property
    def candidate_id(self) -> str:
        """The id of the candidate evaluated."""
        return self.result.candidate_id

    def judged(self) -> Candidate:
        """The candidate evaluated; ``ValueError`` for feedback that does not carry it (as a
        diagnoser sends it, before the island has put its candidate back)."""
        if self.candidate is None:
            raise ValueError(f"feedback on candidate {self.candidate_id} does not carry the candidate")
        return self.candidate


class Elite(Model):
    """A candidate that holds a cell of an island's archive."""

    candidate: Candidate
    """The candidate (source, lineage)."""
    fitness: float
    """Speedup over eager PyTorch."""
    speedup_vs_compiled: float | None = None
    """Speedup over torch.compile, where measured."""
    median_ms: float
    """Its median time per forward."""
    sol_fraction: float | None = None
    """Fraction of the speed-of-light bound reached."""
    cell: tuple[int, ...]
    """Archive cell (bin index per descriptor)."""
    descriptors: dict[str, ParamValue] = Field(default_factory=dict)
    """Descriptor values behind the cell."""
    island: str
    """Island whose archive holds it."""
    found_at: float = Field(default_factory=now)
    """When it entered the archive."""
    result: EvalResult | None = None
    """Its measured evaluation, so an island that receives it as a migrant keeps the evidence."""
    diagnosis: Diagnosis | None = None
    """Its diagnosis (what limits its speed), carried along with it."""


class EliteAnnouncement(Message):
    """Published by an island when a candidate enters its archive."""

    type: Literal["elite"] = "elite"
    """Wire name of this message type."""
    run_id: str
    """Run it belongs to."""
    elite: Elite
    """The new elite."""
    island_best: bool
    """Whether it is now the island's best."""


class Migration(Message):
    """Elites sent from one island to another."""

    type: Literal["migration"] = "migration"
    """Wire name of this message type."""
    migration_id: str = Field(default_factory=new_id)
    """Unique id (JetStream dedup id)."""
    run_id: str
    """Run it belongs to."""
    source_island: str
    """Island the elites come from."""
    dest_island: str
    """Island that receives them."""
    reason: MigrationReason
    """Ring, random, or stagnation of the destination."""
    elites: tuple[Elite, ...] = Field(min_length=1)
    """The migrants, lineage kept."""
    created_at: float = Field(default_factory=now)
    """When it was sent."""


class IslandStatus(Message):
    """An island's progress, published after every feedback it handles."""

    type: Literal["island_status"] = "island_status"
    """Wire name of this message type."""
    run_id: str
    """Run it belongs to."""
    island: str
    """The island."""
    evaluated: int = Field(ge=0)
    """Feedback handled so far."""
    in_flight: int = Field(ge=0)
    """Candidates out for evaluation or generation."""
    archive_size: int = Field(ge=0)
    """Occupied cells."""
    best_fitness: float | None = None
    """Best speedup over eager so far."""
    best_candidate_id: str | None = None
    """Id of the best candidate so far."""
    stagnating: bool = False
    """Whether the island has gone too long without improving."""
    tokens_used: int = Field(default=0, ge=0)
    """LLM tokens spent by this island's requests."""
    stopped: StopReason | None = None
    """Set when the island has stopped, with why."""
    declines: int = Field(default=0, ge=0)
    """Requests an expert answered with a decline (no candidate) so far."""
    last_decline: Decline | None = None
    """The most recent decline, with its reason and detail (why no candidate came)."""
    at: float = Field(default_factory=now)
    """When the status was taken."""


class RunEnd(Message):
    """Published by the run controller when the run stops."""

    type: Literal["run_end"] = "run_end"
    """Wire name of this message type."""
    run_id: str
    """The run."""
    reason: StopReason
    """Why it stopped."""
    best_candidate_id: str | None = None
    """Best clean candidate, if any."""
    best_fitness: float | None = None
    """Its speedup over eager."""
    evaluated: int = Field(ge=0)
    """Candidates evaluated."""
    cancelled: tuple[str, ...] = ()
    """Candidates whose evaluation was cancelled because the run ended (its deadline passed, or
    a second interrupt): evaluators stop them at once and publish no result."""
    at: float = Field(default_factory=now)
    """When it stopped."""


class RunStop(Message):
    """An operator's request that a run stop (``kfoundry runs stop``), stored in the run's stream.

    The run's controller reads it with the rest of the stream and ends the run as on an interrupt:
    the candidates in flight get a short grace, then they are cancelled, ``RunEnd`` (reason
    ``interrupted``) is published and the results are written."""

    type: Literal["run_stop"] = "run_stop"
    """Wire name of this message type."""
    run_id: str
    """The run asked to stop."""
    by: str = Field(min_length=1, max_length=200)
    """Who asked, as ``user@host``."""
    reason: str | None = Field(default=None, max_length=500)
    """Why, in the operator's words; ``None`` when they gave none."""
    at: float = Field(default_factory=now)
    """When it was asked."""

    def sentence(self) -> str:
        """``stop requested by USER@HOST (REASON)``, as the run and ``kfoundry runs`` say it."""
        return f"stop requested by {self.by}" + (f" ({self.reason})" if self.reason else "")


class EvalOutcome(Model):
    """A compact view of an evaluation kept in archives and reports."""

    status: str
    """The verdict (an ``EvalStatus`` value)."""
    fitness: float | None = None
    """Speedup over eager if clean."""

    @classmethod
    def of(cls, result: EvalResult) -> EvalOutcome:
        """The outcome of a result."""
        return cls(status=result.status.value, fitness=result.fitness)
