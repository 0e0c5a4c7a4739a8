"""Spares alive at once stay within what the memory plan counts (its spares beside the running
candidate), however many evaluations are past the compile line (``max_running``: the evaluator
actor's concurrency). On an 80 GB H100, KernelBench L1-57's plan held one spare of 15.7 GB; four
evaluations each took or made their own and the card ran out of memory. On the CPU here."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import job

pytestmark = pytest.mark.timeout(300)


def _job(service: EvaluationService, name: str) -> EvalJob:
    base = job("add_relu", "honest_add_relu")
    return dataclasses.replace(base, task_id=service.task_id(base.reference_source), candidate_id=name)


@pytest.mark.slow  # four evaluations side by side: ~20 s on a 2-core machine
async def test_evaluations_past_the_line_never_hold_more_spares_than_the_plan_counts() -> None:
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.5, max_running=0)
    async with EvaluationService(cfg) as service:
        results = await asyncio.gather(*(service.evaluate(_job(service, f"c{k}")) for k in range(4)))
        runs = service.runs
        assert runs is not None
        assert runs.plan is not None
        capacity = runs.capacity()
        peak = runs.peak_alive
        held = runs.held
    assert [r.status for r in results] == [EvalStatus.CORRECT] * 4, [r.summary for r in results]
    assert capacity == runs.plan.spares + 1 == 2
    assert 1 <= peak <= capacity
    assert held == 0  # every evaluation gave its spare back
