"""GPU-only behaviour (``-m gpu``): the A/A test, CUDA extensions, ahead-of-time Triton, warm overhead."""

from __future__ import annotations

import statistics
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.config import EvalJob
from gpu_runner.service import EvaluationService
from schemas import CheckName, CheckOutcome, DeviceChoice, EvalStatus, KernelLanguage, TimerKind
from tests.gpu_runner.conftest import fast_config, job, reference

pytestmark = [pytest.mark.gpu, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gpu(gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = EvaluationService(fast_config(DeviceChoice.CUDA, gpu_runner_tmp / "gpu-only", timing_budget_s=4.0))
    await service.start()
    yield service
    await service.aclose()


@pytest.mark.timeout(600)
async def test_aa_identical_kernel_scores_one(gpu: EvaluationService) -> None:
    await gpu.prepare(reference("aa_add_relu"))
    await gpu.wait_spares(timeout_s=300)
    speedups = []
    for _ in range(3):
        result = await gpu.evaluate(job("aa_add_relu", "honest_add_relu"))
        assert result.status is EvalStatus.CORRECT, result.summary
        assert result.timing is not None
        assert result.timing.timer is TimerKind.CUDA_EVENT
        assert result.speedup_vs_eager is not None
        speedups.append(result.speedup_vs_eager)
    assert 0.98 <= statistics.median(speedups) <= 1.02, speedups


@pytest.mark.timeout(600)
async def test_aa_identical_kernel_scores_one_at_the_held_out_shapes_too(
    gpu_runner_tmp: Path, record_property: Callable[[str, object], None]
) -> None:
    # The same kernel as candidate and as reference, timed at every held-out shape ("all"): the
    # shapes' own harness must say 1.0 there too (the smallest shape, a launch, is reported only).
    cfg = fast_config(DeviceChoice.CUDA, gpu_runner_tmp / "held-out-aa", timing_budget_s=4.0, held_out_timing="all")
    ratios: dict[str, list[float]] = {}
    async with EvaluationService(cfg) as service:
        for _ in range(3):
            result = await service.evaluate(job("aa_add_relu", "honest_add_relu"))
            assert result.status is EvalStatus.CORRECT, result.summary
            assert result.correctness is not None
            for shape in result.correctness.held_out:
                assert shape.outcome == "correct", shape
                assert shape.speedup_vs_eager is not None, shape
                ratios.setdefault(shape.shape, []).append(shape.speedup_vs_eager)
    record_property("held_out_speedups", {k: [round(x, 4) for x in v] for k, v in ratios.items()})  # in the junit xml
    assert len(ratios) >= 2, ratios
    large = {k: v for k, v in ratios.items() if not k.startswith("N=1:")}
    assert large, ratios
    for name, values in large.items():
        assert 0.95 <= statistics.median(values) <= 1.05, (name, values)


@pytest.mark.timeout(600)
async def test_cuda_extension_passes_and_hits_the_cache(gpu: EvaluationService) -> None:
    await gpu.prepare(reference("add_relu"))
    first = await gpu.evaluate(job("add_relu", "honest_cuda_add_relu", timeout_s=500))
    second = await gpu.evaluate(job("add_relu", "honest_cuda_add_relu", timeout_s=500))
    assert first.status is EvalStatus.CORRECT, first.summary
    assert second.status is EvalStatus.CORRECT, second.summary
    assert second.stages.compile_cache_hit
    assert first.profile is not None
    assert any("add_relu_kernel" in name for name in first.profile.kernel_names)


@pytest.mark.timeout(600)
async def test_triton_kernels_compile_ahead_of_time_and_warm_overhead_is_small(gpu: EvaluationService) -> None:
    await gpu.prepare(reference("add_relu"))
    await gpu.wait_spares(timeout_s=300)
    result = await gpu.evaluate(job("add_relu", "honest_add_relu"))
    assert result.status is EvalStatus.CORRECT, result.summary
    compile_check = next(c for c in result.checks if c.name == "compile")
    assert compile_check.detail is not None
    assert "complete" in compile_check.detail
    warm = next(c for c in result.checks if c.name == "warm_worker")
    assert warm.outcome.value == "passed"
    assert result.baselines is not None
    assert result.baselines.compiled is not None or result.baselines.compiled_error


@pytest.mark.timeout(600)
async def test_launches_of_kept_compiled_kernels_count_as_the_candidates_own(gpu: EvaluationService) -> None:
    """The template's launch sites call a kept compiled kernel's launcher after the first launch,
    not ``triton.jit``: the evaluator counts those launches too, in the trials and while timed."""
    from actors.experts.template import Plan, analyse, default_params, render

    source = reference("add_relu")
    plan = analyse(source)
    assert isinstance(plan, Plan)
    rendered = render(plan, default_params(plan))
    assert "_KfLaunch(" in rendered
    await gpu.prepare(source)
    result = await gpu.evaluate(
        EvalJob(
            reference_source=source,
            candidate_source=rendered,
            language=KernelLanguage.TRITON,
            timeout_s=120.0,
            candidate_id="launch_sites",
        )
    )
    assert result.status is EvalStatus.CORRECT, result.summary
    outcomes = {c.name: c for c in result.checks}
    assert outcomes[CheckName.KERNELS_LAUNCHED].outcome is CheckOutcome.PASSED
    timed = outcomes[CheckName.TIMED_LAUNCHES]
    assert timed.outcome is CheckOutcome.PASSED, timed.detail
    assert timed.detail is not None
    assert not timed.detail.startswith("0 own launches"), timed.detail


@pytest.mark.timeout(600)
async def test_the_reference_and_the_candidates_kernels_are_timed_one_by_one_on_the_gpu(
    gpu: EvaluationService,
) -> None:
    """The referee's op profile (CUDA events per op) and the candidate's kernel times (CUDA events
    per launch, its template-named kernel and its kept launch sites) on a real GPU: both present,
    and the candidate's kernel times add up to about its timed median."""
    from actors.experts.template import Plan, analyse, default_params, render

    source = reference("linear_relu")
    plan = analyse(source)
    assert isinstance(plan, Plan)
    await gpu.prepare(source)
    result = await gpu.evaluate(
        EvalJob(
            reference_source=source,
            candidate_source=render(plan, default_params(plan)),
            language=KernelLanguage.TRITON,
            timeout_s=120.0,
            candidate_id="timed_one_by_one",
        )
    )
    assert result.status is EvalStatus.CORRECT, result.summary
    assert result.baselines is not None
    assert result.baselines.profile is not None
    assert result.baselines.profile.timer == "cuda events per op"
    assert {o.op for o in result.baselines.profile.ops} >= {"aten::addmm", "aten::relu"}
    assert result.profile is not None
    assert result.profile.kernel_timer == "cuda events per launch"
    names = [k.name for k in result.profile.kernel_times]
    assert names, result.profile
    assert all(name.startswith("_kf_") for name in names), names
    assert result.timing is not None
    total_ms = sum(k.time_us for k in result.profile.kernel_times) / 1e3
    assert 0.2 * result.timing.median_ms <= total_ms <= 5 * result.timing.median_ms, (total_ms, result.timing)
