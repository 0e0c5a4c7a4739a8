"""The experience library's records, queries and hits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import Message, Model, new_id, now
from schemas.enums import DiagnosisCategory, EvalStatus
from schemas.task import TaskSignature


class Experience(Message):
    """One parent→child transition: what was tried, under which diagnosis, with what effect."""

    type: Literal["experience"] = "experience"
    """Wire name of this message type."""
    experience_id: str = Field(default_factory=new_id)
    """Unique id (also the JetStream dedup id)."""
    run_id: str
    """Run it was observed in."""
    task_id: str
    """Task it was observed on."""
    signature: TaskSignature
    """Ops, shapes and dtypes of that task."""
    candidate_id: str
    """The child candidate."""
    parent_id: str | None = None
    """The parent candidate; ``None`` for a first-generation candidate."""
    diagnosis: DiagnosisCategory | None = None
    """The parent's diagnosis that the child answered; ``None`` at the start."""
    expert: str
    """Expert that produced the child."""
    strategy: str = ""
    """Role, template or mutation operator the expert used."""
    status: EvalStatus
    """The child's verdict."""
    parent_fitness: float | None = None
    """Parent's speedup over eager, if it had one."""
    child_fitness: float | None = None
    """Child's speedup over eager, if clean."""
    description: str
    """Short description of the change (what differs between parent and child)."""
    params: dict[str, int | float | str | bool] = Field(default_factory=dict)
    """Template or tuning parameters of the child, where it has them."""
    source_excerpt: str = ""
    """The child's kernel source, shortened, for experts to learn from."""
    created_at: float = Field(default_factory=now)
    """When it was recorded."""

    @property
    def delta(self) -> float | None:
        """Change in fitness from parent to child (a failed child counts as 0 fitness)."""
        if self.child_fitness is None and self.parent_fitness is None:
            return None
        return (self.child_fitness or 0.0) - (self.parent_fitness or 0.0)


class ExperienceQuery(Message):
    """A request for experiences relevant to a task and a diagnosis."""

    type: Literal["experience_query"] = "experience_query"
    """Wire name of this message type."""
    signature: TaskSignature
    """The task being worked on."""
    diagnosis: DiagnosisCategory | None = None
    """The diagnosis being answered, if any."""
    text: str = ""
    """Free text added to the query (e.g. the diagnosis summary)."""
    k: int = Field(default=5, ge=1, le=100)
    """Hits wanted."""
    exclude_run: str | None = None
    """Leave out experiences from this run (to measure transfer from other runs)."""
    min_utility: float | None = None
    """Leave out experiences whose utility fell below this."""


class ExperienceHit(Model):
    """One retrieved experience and how well it matched."""

    experience: Experience
    """The stored transition."""
    score: float
    """Similarity of the query to it (inner product of normalised embeddings)."""
    utility: float
    """Its current utility (updated by later outcomes of advice drawn from it)."""


class ExperienceHits(Message):
    """The reply to an :class:`ExperienceQuery`."""

    type: Literal["experience_hits"] = "experience_hits"
    """Wire name of this message type."""
    hits: tuple[ExperienceHit, ...] = ()
    """Best first."""
    embedder: str
    """Embedder behind the index (vectors of different embedders never mix)."""
    library_size: int = Field(ge=0)
    """Experiences in the library when the query ran."""


class ExperienceOutcome(Message):
    """Reports how advice drawn from experiences turned out, so their utility can be updated."""

    type: Literal["experience_outcome"] = "experience_outcome"
    """Wire name of this message type."""
    outcome_id: str = Field(default_factory=new_id)
    """Unique id (JetStream dedup id)."""
    experience_ids: tuple[str, ...]
    """Experiences that were shown to the expert that produced the candidate."""
    candidate_id: str
    """The candidate whose outcome is reported."""
    improved: bool
    """Whether the candidate beat its parent (or, without a parent, was clean)."""
    delta: float | None = None
    """Change in fitness from parent to candidate."""
    created_at: float = Field(default_factory=now)
    """When it was reported."""


ExperienceItem = Annotated[Experience | ExperienceOutcome, Field(discriminator="type")]
"""A record or an outcome, told apart by its ``type``."""


class ExperienceBatch(Message):
    """Experience records and outcomes published together, in the order they were made.

    An island writes what its feedbacks teach as one message every few tens of milliseconds
    instead of one message per record: the experience path was a third of the fabric's cost per
    candidate. Readers apply the items in order, as if each had been a message of its own."""

    type: Literal["experience_batch"] = "experience_batch"
    """Wire name of this message type."""
    batch_id: str = Field(default_factory=new_id)
    """Unique id (JetStream dedup id)."""
    items: tuple[ExperienceItem, ...] = Field(min_length=1)
    """The records and outcomes, oldest first."""
