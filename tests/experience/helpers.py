"""Builders of experience records and queries shared by the experience tests."""

from __future__ import annotations

from schemas import (
    DiagnosisCategory,
    EvalStatus,
    Experience,
    ExperienceOutcome,
    ExperienceQuery,
    TaskSignature,
    TensorSpec,
    new_id,
)


def signature(
    ops: tuple[str, ...] = ("softmax",), shape: tuple[int, ...] = (256, 1024), dtype: str = "float32"
) -> TaskSignature:
    """A one-input task signature."""
    spec = TensorSpec(shape=shape, dtype=dtype)
    return TaskSignature(ops=ops, inputs=(spec,), outputs=(spec,))


def record(
    description: str = "online softmax with one pass over each row",
    *,
    ops: tuple[str, ...] = ("softmax",),
    shape: tuple[int, ...] = (256, 1024),
    dtype: str = "float32",
    diagnosis: DiagnosisCategory | None = DiagnosisCategory.SLOW_MEMORY_BOUND,
    run_id: str = "run-a",
    expert: str = "memory",
    improved: bool = True,
    experience_id: str | None = None,
) -> Experience:
    """An experience; ``improved`` makes the child faster than its parent (else it failed)."""
    return Experience(
        experience_id=experience_id or new_id(),
        run_id=run_id,
        task_id="task",
        signature=signature(ops, shape, dtype),
        candidate_id="child",
        parent_id="parent",
        diagnosis=diagnosis,
        expert=expert,
        strategy="s",
        status=EvalStatus.CORRECT if improved else EvalStatus.INCORRECT,
        parent_fitness=1.0,
        child_fitness=1.6 if improved else None,
        description=description,
    )


def query(
    *,
    ops: tuple[str, ...] = ("softmax",),
    shape: tuple[int, ...] = (256, 1024),
    dtype: str = "float32",
    diagnosis: DiagnosisCategory | None = DiagnosisCategory.SLOW_MEMORY_BOUND,
    text: str = "",
    k: int = 5,
    exclude_run: str | None = None,
    min_utility: float | None = None,
) -> ExperienceQuery:
    """A query for a task and a diagnosis."""
    return ExperienceQuery(
        signature=signature(ops, shape, dtype),
        diagnosis=diagnosis,
        text=text,
        k=k,
        exclude_run=exclude_run,
        min_utility=min_utility,
    )


def outcome(*experience_ids: str, improved: bool, outcome_id: str | None = None) -> ExperienceOutcome:
    """An outcome of advice drawn from ``experience_ids``."""
    return ExperienceOutcome(
        outcome_id=outcome_id or new_id(), experience_ids=experience_ids, candidate_id="cand", improved=improved
    )
