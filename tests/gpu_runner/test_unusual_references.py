"""Unusual valid references, on the CPU (Triton's interpreter): one whose outputs hold NaN (``log``
of a normal draw) is judged on matching positions and the verdict says so, its range trials
keeping the NaN where they are; one that modifies its input in place is judged on its outputs,
each side on its own copy, and the verdict says that too; one whose sizes the memory plan cannot
measure (``.item()`` at construction) and whose inputs dwarf its outputs is judged as any other."""

from __future__ import annotations

import pytest

from gpu_runner.config import RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import CheckName, CheckOutcome, DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import job

pytestmark = pytest.mark.timeout(300)


async def test_a_nan_reference_is_judged_on_matching_positions_and_said_so() -> None:
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        honest = await service.evaluate(job("log_of_normal", "honest_log"))
        zeroed = await service.evaluate(job("log_of_normal", "log_zero_where_nan"))
    assert honest.status is EvalStatus.CORRECT, honest.summary
    assert "the reference's outputs hold NaN/Inf" in honest.summary
    assert honest.correctness is not None
    share = honest.correctness.reference_nonfinite_share  # what a run's end line says (RunOutcome)
    assert share is not None
    assert 0.3 < share < 0.7  # log of a normal draw: about half are NaN
    ranged = next(c for c in honest.checks if c.name == CheckName.RANGE_TRIALS)
    assert ranged.outcome is CheckOutcome.PASSED, ranged.detail
    assert "NaN/Inf where they are" in (ranged.detail or "")
    assert zeroed.status is EvalStatus.INCORRECT, zeroed.summary
    assert "finite values where it has NaN/Inf" in zeroed.summary
    assert "the reference's outputs hold NaN/Inf" in zeroed.summary


async def test_an_in_place_reference_is_judged_on_its_outputs_and_said_so() -> None:
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        result = await service.evaluate(job("inplace_scale_relu", "honest_scale_relu"))
    assert result.status is EvalStatus.CORRECT, result.summary
    assert "the reference modifies its input(s) 0 in place" in result.summary


async def test_a_reference_of_unmeasured_sizes_with_large_inputs_is_judged() -> None:
    """Its trials' frames carry its inputs: their cap came from the memory plan's input size, which
    was 0 when unmeasured (every SwinMLP candidate failed with a FrameError on an H200)."""
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        result = await service.evaluate(job("unmeasured_row_sum", "honest_unmeasured_row_sum"))
    assert result.status is EvalStatus.CORRECT, result.summary
