"""Precision parity on a GPU: the reference's matmuls run in cuBLAS's own TF32 (the task file turns
``allow_tf32`` on); a Triton candidate rounding its operands to TF32 is admitted, one rounding
to bfloat16 or computing in float16 is not; at ``--precision exact`` the TF32 one is refused too.
The CPU suite has the same with TF32 emulated (``test_precision_parity.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalResult, EvalStatus, PrecisionMode
from tests.gpu_runner.conftest import fast_config, job

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

CANDIDATES = ("rounded_tf32_matmul", "rounded_bf16_matmul", "fp16_matmul")


async def _run(tmp: Path, precision: str, names: tuple[str, ...]) -> dict[str, EvalResult]:
    out: dict[str, EvalResult] = {}
    async with EvaluationService(fast_config(DeviceChoice.CUDA, tmp)) as service:
        for name in names:
            out[name] = await service.evaluate(job("matmul_tf32_cublas", name, timeout_s=300.0, precision=precision))
    return out


async def test_cublas_tf32_is_granted_and_narrower_formats_are_not(tmp_path: Path) -> None:
    got = await _run(tmp_path, "reference", CANDIDATES)
    tf32 = got["rounded_tf32_matmul"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    corr = tf32.correctness
    assert corr is not None
    assert corr.precision is PrecisionMode.REFERENCE
    assert corr.ref_default_err_vs_fp64 is not None
    assert corr.ref_err_vs_fp64 is not None
    assert corr.ref_default_err_vs_fp64 > 100 * corr.ref_err_vs_fp64
    assert got["rounded_bf16_matmul"].status is EvalStatus.INCORRECT, got["rounded_bf16_matmul"].summary
    assert got["fp16_matmul"].status is EvalStatus.INCORRECT, got["fp16_matmul"].summary


async def test_exact_refuses_tf32_on_a_gpu(tmp_path: Path) -> None:
    got = await _run(tmp_path, "exact", ("rounded_tf32_matmul",))
    assert got["rounded_tf32_matmul"].status is EvalStatus.INCORRECT, got["rounded_tf32_matmul"].summary


async def test_parity_is_measured_for_outputs_past_four_gib(tmp_path: Path) -> None:
    """A 4.5 GiB output (KernelBench L1-63's is 8.5 GB) is measured at PyTorch's defaults where the
    GPU has the room: the TF32 candidate is admitted, the bfloat16 one is not."""
    got: dict[str, EvalResult] = {}
    async with EvaluationService(fast_config(DeviceChoice.CUDA, tmp_path)) as service:
        for name in ("rounded_tf32_matmul", "rounded_bf16_matmul"):
            got[name] = await service.evaluate(job("matmul_tf32_cublas_large", name, timeout_s=400.0))
    tf32 = got["rounded_tf32_matmul"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.precision is PrecisionMode.REFERENCE
    assert tf32.correctness.ref_default_err_vs_fp64 is not None
    assert got["rounded_bf16_matmul"].status is EvalStatus.INCORRECT, got["rounded_bf16_matmul"].summary
