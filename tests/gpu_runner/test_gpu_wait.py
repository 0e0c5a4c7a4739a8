"""Queueing for the GPU is not a candidate's time: a candidate whose timing waits for spares to
leave the GPU longer than its whole timeout still gets its verdict (the wait extends its deadline).
Runs on the CPU: the evaluator takes the same GPU lease there."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job

TIMEOUT_S = 20.0
HOLD_S = TIMEOUT_S + 5.0
"""How long the test's "spare" keeps the GPU once the candidate waits to time: longer than the
candidate's whole timeout, so counting the wait against it would time the candidate out."""


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_waiting_for_spares_to_leave_the_gpu_extends_the_candidates_deadline(tmp_path: Path) -> None:
    service = EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=1))
    await service.start()
    try:
        warm = await service.evaluate(job("add_relu", "honest_add_relu", timeout_s=120))
        assert warm.status is EvalStatus.CORRECT, warm.summary
        await service.wait_spares(timeout_s=100)
        await service.gpu.acquire_shared()  # a spare's GPU work, still running when the candidate wants to time
        evaluation = asyncio.create_task(service.evaluate(job("add_relu", "honest_add_relu", timeout_s=TIMEOUT_S)))
        try:
            async with asyncio.timeout(TIMEOUT_S):
                # The gate has no event for this; polling its counter is enough for a test.
                while not service.gpu.exclusive_waiting:  # noqa: ASYNC110  (the candidate waits to time)
                    await asyncio.sleep(0.05)
            waiting_since = time.monotonic()
            await asyncio.sleep(HOLD_S)
            if evaluation.done():
                early = evaluation.result()
                raise AssertionError(f"the candidate did not wait for the GPU: {early.status}: {early.summary}")
        finally:
            await service.gpu.release(exclusive=False)
        result = await evaluation
        waited = time.monotonic() - waiting_since
    finally:
        await service.aclose()
    assert waited > TIMEOUT_S
    assert result.status is EvalStatus.CORRECT, result.summary
    assert result.timing is not None
