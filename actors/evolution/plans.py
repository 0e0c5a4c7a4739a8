"""Values the island brain hands out: its config, request plans, feedback outcomes and the
fitness points of its history, plus the instructions written for an expert."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.archive import AddStatus
from actors.evolution.descriptors import DescriptorSpace
from schemas import (
    Candidate,
    Diagnosis,
    Elite,
    EvalResult,
    ExperienceHit,
    GenerateRequest,
    Proposal,
    Role,
    RunSpec,
)


class ParentSource(StrEnum):
    """Where the parent of a request came from."""

    FRESH = "fresh"
    EXPLOIT = "exploit"
    EXPLORE = "explore"
    REPAIR = "repair"


class IslandConfig(BaseModel):
    """Knobs of the island policy, validated at construction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    descriptors: DescriptorSpace = Field(default_factory=DescriptorSpace.default)
    """Axes of the archive."""
    exploit: float = Field(default=0.7, ge=0, le=1)
    """Probability of a tournament among elites (else an exploratory draw)."""
    stagnant_exploit: float = Field(default=0.3, ge=0, le=1)
    """The same while the island stagnates."""
    tournament: int = Field(default=3, ge=1)
    """Tournament size."""
    curiosity: float = Field(default=0.5, ge=0)
    """Down-weighting of often-chosen elites in exploratory draws."""
    fresh: float = Field(default=0.05, ge=0, le=1)
    """Probability of a fresh start once elites exist (doubled while stagnating)."""
    repair: float = Field(default=0.2, ge=0, le=1)
    """Probability of repairing a recent failure once elites exist."""
    repair_when_empty: float = Field(default=0.6, ge=0, le=1)
    """Probability of repairing (rather than starting fresh) while no elite exists."""
    repair_pool: int = Field(default=8, ge=1)
    """Recent failures kept for repair."""
    stagnation_window: int = Field(default=20, ge=1)
    """Feedbacks without improvement that make the island stagnant."""
    stagnation_seconds: float | None = Field(default=None, gt=0)
    """Seconds without improvement that make it stagnant."""
    stagnation_eps: float = Field(default=0.01, ge=0)
    """Smallest relative improvement of the best that counts."""
    improve_eps: float = Field(default=0.0, ge=0)
    """Relative gain over the parent that earns a full reward."""
    prior_strength: float = Field(default=2.0, gt=0)
    """Pseudo-observations behind the routing prior of the bandit."""
    family_share: float = Field(default=0.5, ge=0, le=1)
    """Share of a sibling category's evidence the bandit borrows."""
    n_per_request: int = Field(default=1, ge=1, le=64)
    """Candidates asked of an expert per request."""
    min_tries_per_expert: int = Field(default=2, ge=0)
    """Answered requests every expert of the run gets on this island before credit decides."""
    uniform_experts: bool = False
    """Choose experts uniformly, ignoring diagnosis routing and credit (an ablation)."""
    headroom: bool = True
    """Weight parents by gap to speed-of-light × measured gain, and stop refining elites near it."""
    near_sol: float = Field(default=0.03, ge=0, le=1)
    """An elite this close to the target fraction of speed-of-light is no longer refined."""


@dataclass(frozen=True)
class RequestPlan:
    """What to ask next: parent (with result and diagnosis), expert, instructions and seed."""

    plan_id: str
    island: str
    expert: str
    role: Role
    key: str
    """Routing key the expert was chosen under (the parent's diagnosis category, or start)."""
    source: ParentSource
    parent: Candidate | None
    parent_result: EvalResult | None
    diagnosis: Diagnosis | None
    instructions: str
    seed: int
    n: int
    start: int = 0
    """A fresh start's index among the expert's starting points (``GenerateRequest.start``)."""
    rank: int | None = None
    """The plan's turn among the run's plans (its island's plan count, interleaved with the other
    islands'): its candidates' ``Candidate.rank`` is ``rank * n`` plus their place in the reply."""

    def request(
        self,
        spec: RunSpec,
        *,
        experiences: Sequence[ExperienceHit] = (),
        meta_prompt: str = "",
        meta_prompt_section: str | None = None,
        token_budget: int | None = None,
        avoid: Sequence[str] = (),
    ) -> GenerateRequest:
        """The ``GenerateRequest`` for this plan."""
        return GenerateRequest(
            run_id=spec.run_id,
            island=self.island,
            task=spec.task,
            language=spec.language,
            parent=self.parent,
            parent_result=self.parent_result,
            diagnosis=self.diagnosis,
            experiences=tuple(experiences),
            instructions=self.instructions,
            meta_prompt=meta_prompt,
            meta_prompt_section=meta_prompt_section,
            n=self.n,
            seed=self.seed,
            start=self.start,
            avoid=tuple(avoid),
            token_budget=token_budget,
            torch_ops=spec.torch_ops,
            precision=spec.precision,
        )

    def candidate(
        self,
        spec: RunSpec,
        proposal: Proposal,
        *,
        expert: str | None = None,
        experience_ids: Sequence[str] = (),
        place: int = 0,
    ) -> Candidate:
        """A child candidate of this plan, with lineage, the diagnosis it answers and its rank
        (``place``: its position among the plan's proposals)."""
        parent = self.parent
        return Candidate(
            run_id=spec.run_id,
            island=self.island,
            task_id=spec.task.task_id,
            parent_id=parent.candidate_id if parent else None,
            lineage=(*parent.lineage, parent.candidate_id) if parent else (),
            generation=parent.generation + 1 if parent else 0,
            expert=expert or self.expert,
            proposal=proposal,
            experience_ids=tuple(experience_ids),
            diagnosis=self.diagnosis,
            rank=None if self.rank is None else self.rank * self.n + min(place, self.n - 1),
        )


class Reward(BaseModel):
    """The credit one outcome gave to a (diagnosis, expert) pair."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    expert: str
    value: float


@dataclass(frozen=True)
class FeedbackOutcome:
    """What one feedback did to the island."""

    candidate_id: str
    add_status: AddStatus
    elite: Elite | None
    """The new elite, when the candidate entered the archive."""
    improved_best: bool
    reward: Reward | None
    stagnating: bool
    duplicate: bool = False
    """The feedback was seen before (a redelivery); nothing changed."""


class FitnessPoint(BaseModel):
    """The island after one feedback or migration (for the report)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: float
    candidate_id: str
    status: str
    fitness: float | None = None
    best: float | None = None
    expert: str = ""
    key: str = ""
    migrant: bool = False


def instructions_for(role: Role, source: ParentSource, diagnosis: Diagnosis | None) -> str:
    """Plain-language instructions for the expert, from the role and the parent's diagnosis."""
    lines = [f"Role: {role}."]
    if source is ParentSource.FRESH:
        lines.append("Write a first kernel for this reference: correct first, then fast.")
    elif source is ParentSource.REPAIR:
        lines.append("The parent failed; fix it and keep what already works.")
    else:
        lines.append("The parent is correct; make it faster without breaking correctness.")
    if diagnosis is not None:
        lines.append(f"Diagnosis ({diagnosis.category.value}): {diagnosis.summary}")
        if diagnosis.sol_distance is not None:
            lines.append(f"It is {1 - diagnosis.sol_distance:.0%} of the speed-of-light bound.")
        lines.extend(f"- {h}" for h in diagnosis.hints[:3])
    elif source is not ParentSource.FRESH:
        lines.append("No diagnosis came with the parent.")
    return "\n".join(lines)
