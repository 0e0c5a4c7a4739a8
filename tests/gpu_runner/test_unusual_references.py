"""Unusual valid references, on the CPU (Triton's interpreter): one whose outputs hold NaN (``log``
of a normal draw) is judged on matching positions and the verdict says so, its range trials
keeping the NaN where they are; one that modifies its input in place is judged on its outputs,
each side on its own copy, and the verdict says that too; one whose sizes the memory plan cannot
measure (``.item()`` at construction) and whose inputs dwarf its outputs is judged as any other."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.slow  # ~4 s on a 2-core host; the default run keeps the NaN reference above
async def test_an_in_place_reference_is_judged_on_its_outputs_and_said_so() -> None:
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        result = await service.evaluate(job("inplace_scale_relu", "honest_scale_relu"))
    assert result.status is EvalStatus.CORRECT, result.summary
    assert "the reference modifies its input(s) 0 in place" in result.summary


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps the NaN and in-place references above
async def test_a_reference_of_unmeasured_sizes_with_large_inputs_is_judged() -> None:
    """Its trials' frames carry its inputs: their cap came from the memory plan's input size, which
    was 0 when unmeasured (every SwinMLP candidate failed with a FrameError on an H200)."""
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        result = await service.evaluate(job("unmeasured_row_sum", "honest_unmeasured_row_sum"))
    assert result.status is EvalStatus.CORRECT, result.summary


_GUARD_CHILD = """
import torch, triton, triton.language as tl
from gpu_runner.sandboxed.measure import KernelOnMeta, _no_kernel_launches, measured_sizes

@triton.jit
def fill(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 1.0, mask=offs < n)

class Model(torch.nn.Module):
    def forward(self, x):
        fill[(1,)](x, x.numel(), BLOCK=8)
        return x

ns = {"Model": Model, "get_inputs": lambda: [torch.empty(8)], "get_init_inputs": lambda: []}
with _no_kernel_launches():
    try:
        measured_sizes(ns, "meta")
    except KernelOnMeta as exc:
        print("refused:", exc)
print("restored:", "refuse" not in type(fill).run.__qualname__)
"""


def test_a_reference_launching_triton_kernels_is_not_run_on_meta_tensors(tmp_path: Path) -> None:
    # On a GPU such a launch gets null pointers: an illegal memory access that left the measuring
    # worker's CUDA context unusable. Triton's own launcher (not its interpreter) is what a GPU runs.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    child = tmp_path / "child.py"  # Triton reads a kernel's source from its file
    child.write_text(_GUARD_CHILD, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(child)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert "refused: the reference launches the Triton kernel fill" in done.stdout, done.stdout + done.stderr
    assert "restored: True" in done.stdout, done.stdout
