"""A model with 256 MiB or more of parameters (``-m gpu``): the reference, the candidate and the
judge all build it on the GPU itself (an 8 GB MLP took 11 s to initialise on the host's CPU and
0.4 s on the GPU), under the same seed, so their weights agree; the compile stage builds the
candidate with empty parameters and still compiles every kernel ahead of time. A constructor that
needs the host (``.numpy()``) makes the spare build on the CPU, and the candidate and judge follow."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job, reference

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    # device_verdict_bytes=0: the judge rebuilds the reference for its float64 truth too.
    service = EvaluationService(fast_config(DeviceChoice.CUDA, gpu_runner_tmp / "large-model", device_verdict_bytes=0))
    await service.start()
    yield service
    await service.aclose()


@pytest.mark.timeout(600)
async def test_a_large_model_is_built_on_the_gpu_by_the_reference_the_candidate_and_the_judge(
    service: EvaluationService,
) -> None:
    await service.prepare(reference("big_linear_relu"))
    await service.wait_spares(timeout_s=300)
    result = await service.evaluate(job("big_linear_relu", "honest_big_linear_relu", timeout_s=300))
    # Correct only if the reference's weights were created on the GPU (its `where` is 1.0) and the
    # candidate's, built there too under the same seed, are the same weights.
    assert result.status is EvalStatus.CORRECT, result.summary
    assert service.runs is not None
    assert service.runs.plan is not None
    assert service.runs.plan.device_verdict
    compile_check = next(c for c in result.checks if c.name == "compile")
    assert compile_check.detail is not None
    assert "complete" in compile_check.detail, compile_check.detail


@pytest.mark.timeout(600)
async def test_a_large_model_whose_constructor_needs_the_host_is_built_there_by_all_three(
    service: EvaluationService,
) -> None:
    await service.prepare(reference("big_linear_relu_host_init"))
    await service.wait_spares(timeout_s=300)
    result = await service.evaluate(job("big_linear_relu_host_init", "honest_linear_relu", timeout_s=300))
    # The spare fell back to the CPU, and the candidate and the judge followed it: same weights.
    assert result.status is EvalStatus.CORRECT, result.summary
