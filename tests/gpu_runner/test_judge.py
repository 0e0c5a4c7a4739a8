"""The judge path (outputs compared in a trusted worker after the candidate's process is gone), on
the CPU: forced for small outputs with ``device_verdict_bytes=0``; the same verdicts as the host path."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus, KernelLanguage
from tests.gpu_runner.conftest import CANDIDATES, REFERENCES

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def judged() -> AsyncIterator[EvaluationService]:
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=1.0, device_verdict_bytes=0
    )
    async with EvaluationService(cfg) as service:
        yield service


async def _evaluate(service: EvaluationService, candidate: str) -> tuple[EvalStatus, str]:
    ref = (REFERENCES / "add_relu.py").read_text()
    job = EvalJob(
        reference_source=ref,
        candidate_source=(CANDIDATES / candidate).read_text(),
        language=KernelLanguage.TRITON,
        timeout_s=120.0,
        task_id=service.task_id(ref),
        candidate_id=candidate,
    )
    result = await service.evaluate(job)
    return result.status, result.summary


async def test_judged_task_accepts_an_honest_candidate_and_names_the_plan(judged: EvaluationService) -> None:
    status, summary = await _evaluate(judged, "honest_add_relu.py")
    assert status is EvalStatus.CORRECT, summary
    assert judged.runs is not None
    plan = judged.runs.plan
    assert plan is not None
    assert plan.device_verdict
    assert judged.judge is not None
    assert judged.judge.compared >= 1  # the verdict came from the judge, not from the parent's numpy


async def test_judged_task_catches_a_partial_output_and_lower_precision(judged: EvaluationService) -> None:
    status, summary = await _evaluate(judged, "partial_output.py")
    assert status is EvalStatus.INCORRECT, summary
    status, summary = await _evaluate(judged, "precision_downcast.py")
    assert status is EvalStatus.INCORRECT, summary
    assert "float64" in summary or "outside" in summary
