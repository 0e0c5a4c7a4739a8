"""C++ extensions through ``load_inline``: built once in the compile stage, loaded by the run process."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpu_runner.service import EvaluationService
from schemas import CheckOutcome, DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_cpp_extension_builds_once_and_passes_on_cpu(tmp_path: Path) -> None:
    async with EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=1)) as service:
        first = await service.evaluate(job("add_relu", "honest_cpp_add_relu", timeout_s=500))
        second = await service.evaluate(job("add_relu", "honest_cpp_add_relu", timeout_s=500))
    assert first.status is EvalStatus.CORRECT, first.summary
    assert second.status is EvalStatus.CORRECT, second.summary
    assert not first.stages.compile_cache_hit
    assert second.stages.compile_cache_hit
    assert first.compile_log is not None
    assert first.profile is not None
    assert first.profile.own_kernel_launches == 1
    # the extension's function, timed alone in one more forward after the timed calls
    assert [(k.name, k.launches) for k in first.profile.kernel_times] == [("add_relu", 1)]
    assert first.profile.kernel_times[0].time_us > 0
    assert first.profile.kernel_timer == "cpu clock per launch"
    compile_checks = [c for c in second.checks if c.name == "compile"]
    assert compile_checks
    assert compile_checks[0].outcome is CheckOutcome.PASSED


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_cpp_extension_compile_error_is_reported_with_log(tmp_path: Path) -> None:
    honest = job("add_relu", "honest_cpp_add_relu", timeout_s=500)
    broken = replace(honest, candidate_source=honest.candidate_source.replace("return out;", "return out"))
    async with EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=0)) as service:
        result = await service.evaluate(broken)
    assert result.status is EvalStatus.COMPILE_ERROR, result.summary
    assert result.compile_log is not None
    assert "error" in result.compile_log.lower()
