"""Builders of realistic messages for the policy tests: candidates, results with measurements,
diagnoses and feedback, as the evaluator and the diagnoser would produce them."""

from __future__ import annotations

import itertools

from schemas import (
    Baselines,
    Candidate,
    Correctness,
    DeviceInfo,
    DeviceKind,
    Diagnosis,
    DiagnosisCategory,
    EvalResult,
    EvalStatus,
    Feedback,
    KernelLanguage,
    ParamValue,
    Profile,
    Proposal,
    RunSpec,
    SpeedOfLight,
    Task,
    TaskSignature,
    TensorSpec,
    TimerKind,
    TimingStats,
)

REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
"""

KERNEL = """import torch
import triton
import triton.language as tl


@triton.jit
def relu_scale(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) * 2.0, mask=offs < n)
"""

_clock = itertools.count(1001)


def task() -> Task:
    sig = TaskSignature(
        ops=("relu", "mul"),
        inputs=(TensorSpec(shape=(4096, 4096), dtype="float32"),),
        outputs=(TensorSpec(shape=(4096, 4096), dtype="float32"),),
        flops=2 * 4096 * 4096,
        bytes_moved=2 * 4 * 4096 * 4096,
    )
    return Task.from_source("relu_scale", REFERENCE, sig)


def spec(**kw: object) -> RunSpec:
    """A run spec for the test task (2 islands, created at t = 1000 s unless given)."""
    return RunSpec.model_validate({"run_id": "run1", "task": task(), "islands": 2, "created_at": 1000.0, **kw})


def candidate(
    island: str = "i0",
    *,
    expert: str = "template",
    params: dict[str, ParamValue] | None = None,
    parent: Candidate | None = None,
    diagnosis: Diagnosis | None = None,
    source: str = KERNEL,
) -> Candidate:
    return Candidate(
        run_id="run1",
        island=island,
        task_id=task().task_id,
        parent_id=parent.candidate_id if parent else None,
        lineage=(*parent.lineage, parent.candidate_id) if parent else (),
        generation=parent.generation + 1 if parent else 0,
        expert=expert,
        proposal=Proposal(
            source=source,
            language=KernelLanguage.TRITON,
            strategy="test",
            params={"BLOCK_SIZE": 1024} if params is None else params,
        ),
        diagnosis=diagnosis,
    )


def timing(median_ms: float) -> TimingStats:
    return TimingStats(
        median_ms=median_ms,
        mean_ms=median_ms,
        std_ms=median_ms * 0.01,
        min_ms=median_ms * 0.98,
        max_ms=median_ms * 1.05,
        p10_ms=median_ms * 0.99,
        p90_ms=median_ms * 1.02,
        reps=100,
        rel_stderr=0.001,
        timer=TimerKind.CUDA_EVENT,
    )


def device(kind: DeviceKind = DeviceKind.CUDA) -> DeviceInfo:
    return DeviceInfo(kind=kind, name="test device", torch="2.13", python="3.11", host="h")


def correct(
    cand: Candidate,
    median_ms: float,
    *,
    eager_ms: float = 1.0,
    bound_ms: float = 0.1,
    limiter: str = "memory",
    launches: int = 1,
    review: tuple[str, ...] = (),
    kind: DeviceKind = DeviceKind.CUDA,
    at: float | None = None,
) -> EvalResult:
    """A correct result with timing, baselines, speed-of-light and profile."""
    sol = SpeedOfLight.model_validate(
        {
            "flops": 2 * 4096 * 4096,
            "bytes_moved": 2 * 4 * 4096 * 4096,
            "peak_tflops": 60.0,
            "peak_gbps": 4300.0,
            "bound_ms": bound_ms,
            "limiter": limiter,
            "fraction": bound_ms / median_ms,
        }
    )
    return EvalResult(
        run_id="run1",
        candidate_id=cand.candidate_id,
        island=cand.island,
        task_id=cand.task_id,
        status=EvalStatus.CORRECT,
        summary="correct",
        timing=timing(median_ms),
        baselines=Baselines(eager=timing(eager_ms)),
        speedup_vs_eager=eager_ms / median_ms,
        speedup_vs_compiled=0.8 * eager_ms / median_ms,
        sol=sol,
        profile=Profile(kernel_launches=launches, own_kernel_launches=launches),
        review=review,
        device=device(kind),
        created_at=float(next(_clock)) if at is None else at,
    )


def failed(cand: Candidate, status: EvalStatus = EvalStatus.COMPILE_ERROR, **kw: object) -> EvalResult:
    """A failed result (compile error by default) with the given evidence fields."""
    data: dict[str, object] = {
        "run_id": "run1",
        "candidate_id": cand.candidate_id,
        "island": cand.island,
        "task_id": cand.task_id,
        "status": status,
        "summary": f"{status.value}",
        "created_at": float(next(_clock)),
    }
    data.update(kw)
    return EvalResult.model_validate(data)


def incorrect(cand: Candidate, corr: Correctness, **kw: object) -> EvalResult:
    return failed(cand, EvalStatus.INCORRECT, correctness=corr, summary="outputs differ", **kw)


def diagnosis(cand: Candidate, category: DiagnosisCategory, role: str | None = None) -> Diagnosis:
    return Diagnosis(candidate_id=cand.candidate_id, category=category, summary=category.value, suggested_expert=role)


def feedback(cand: Candidate, result: EvalResult, diag: Diagnosis) -> Feedback:
    return Feedback(run_id="run1", island=cand.island, candidate=cand, result=result, diagnosis=diag)
