"""Evaluations go by their candidates' rank (issue 34: the first verdict is the first starting
point's), and only ``RunnerConfig.max_running`` of them are past the compile line at once."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpu_runner.config import RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import job

pytestmark = pytest.mark.timeout(300)


async def test_evaluations_past_the_compile_line_are_bounded_and_go_by_rank() -> None:
    # An evaluator actor takes more candidates than it judges at once (to pick the best-ranked);
    # past the compile line only ``max_running`` go on at once (the memory plan counts its spares
    # and one running candidate), the best-ranked first.
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=2, compile_workers=2, timing_budget_s=0.3, max_running=1)
    most = 0
    done: list[str] = []
    async with EvaluationService(cfg) as service:

        async def sample() -> None:
            nonlocal most
            while True:
                past = sum(service.in_flight[p] for p in ("arm", "gpu_wait", "gpu", "verdict"))
                most = max(most, past)
                await asyncio.sleep(0.005)

        async def evaluate(rank: int) -> None:
            result = await service.evaluate(replace(job("softmax_sized", "softmax_any_shape"), rank=rank))
            assert result.status is EvalStatus.CORRECT, result.summary
            done.append(f"rank {rank}")

        watcher = asyncio.create_task(sample())
        await asyncio.gather(*(evaluate(rank) for rank in (5, 3, 0)))
        watcher.cancel()
    assert most == 1
    assert done == ["rank 0", "rank 3", "rank 5"]
