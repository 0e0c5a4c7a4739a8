"""Precision parity on the CPU: a candidate may err against float64 as much as the user's model
does at PyTorch's defaults, and no more.

The CPU has no TF32, so the reference asks for TF32 matmuls (``allow_tf32 = True``) and rounds its
operands to TF32 itself whenever the flag is on; the evaluator's IEEE float32 run turns the flag
off, and the referee measures the error of both runs against float64. Candidates round their
operands in a Triton kernel (under ``TRITON_INTERPRET=1``): to TF32 (the reference's own
precision: admitted), to bfloat16 (narrower: refused), or compute in float16 (TF32's mantissa,
not its range: refused on the range trials). The GPU suite has the same against cuBLAS's own
TF32 (``test_precision_parity_gpu``)."""

from __future__ import annotations

import pytest

from actors.experts.template.ir import Unsupported
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalResult, EvalStatus, KernelLanguage, PrecisionMode
from tests.gpu_runner.conftest import candidate, reference

pytestmark = pytest.mark.timeout(600)


async def _run(ref: str, names: list[str], **overrides: object) -> dict[str, EvalResult]:
    return await _evaluate(reference(ref), {name: candidate(name) for name in names}, **overrides)


async def _evaluate(source: str, candidates: dict[str, str], **overrides: object) -> dict[str, EvalResult]:
    """Each of ``candidates`` (name -> source) evaluated against the reference ``source`` on the CPU."""
    base: dict[str, object] = {"device": DeviceChoice.CPU, "spares": 1, "compile_workers": 2, "timing_budget_s": 0.3}
    cfg = RunnerConfig(**{**base, **overrides})  # type: ignore[arg-type]
    out: dict[str, EvalResult] = {}
    async with EvaluationService(cfg) as service:
        for name, text in candidates.items():
            job = EvalJob(
                reference_source=source,
                candidate_source=text,
                language=KernelLanguage.TRITON,
                timeout_s=300.0,
                task_id=service.task_id(source),
                candidate_id=name,
            )
            out[name] = await service.evaluate(job)
    return out


async def test_the_reference_s_own_tf32_is_granted_and_narrower_formats_are_not() -> None:
    got = await _run("matmul_tf32_flag", ["rounded_tf32_matmul", "rounded_bf16_matmul", "fp16_matmul"])
    tf32, bf16, fp16 = got["rounded_tf32_matmul"], got["rounded_bf16_matmul"], got["fp16_matmul"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    corr = tf32.correctness
    assert corr is not None
    assert corr.precision is PrecisionMode.REFERENCE
    assert corr.ref_default_err_vs_fp64 is not None
    assert corr.ref_err_vs_fp64 is not None
    # the reference at its defaults errs far more than in IEEE float32, and the candidate as much
    assert corr.ref_default_err_vs_fp64 > 100 * corr.ref_err_vs_fp64
    assert corr.err_vs_fp64 is not None
    assert corr.err_vs_fp64 < 3 * corr.ref_default_err_vs_fp64
    assert bf16.status is EvalStatus.INCORRECT, bf16.summary
    assert "lower precision than the reference" in bf16.summary
    assert fp16.status is EvalStatus.INCORRECT, fp16.summary  # its range trials overflow


@pytest.mark.slow  # ~4 s on a 2-core host; the default run keeps the IEEE reference's refusal below
async def test_exact_precision_refuses_the_reference_s_own_tf32() -> None:
    got = await _run("matmul_tf32_flag", ["rounded_tf32_matmul"], precision="exact")
    tf32 = got["rounded_tf32_matmul"]
    assert tf32.status is EvalStatus.INCORRECT, tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.precision is PrecisionMode.EXACT
    assert tf32.correctness.ref_default_err_vs_fp64 is None


async def test_tf32_is_a_downcast_where_the_reference_runs_in_ieee_float32() -> None:
    """PyTorch's default for matmuls is IEEE float32: its defaults give the exact outputs, so no
    precision is granted (and no float64 run is spent on measuring it)."""
    got = await _run("matmul_ieee", ["rounded_tf32_matmul"])
    tf32 = got["rounded_tf32_matmul"]
    assert tf32.status is EvalStatus.INCORRECT, tf32.summary
    assert "lower precision than the reference" in tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.precision is PrecisionMode.REFERENCE
    assert tf32.correctness.ref_default_err_vs_fp64 is None


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps the granted TF32 and refused narrower formats
async def test_a_reference_whose_ieee_runs_differ_in_the_last_bits_keeps_its_parity() -> None:
    """cuDNN's transposed convolutions sum with atomics in IEEE float32 (KernelBench L2-2: two
    runs differ by 1e-8 where its TF32 errs 7e-5): the defaults' error is still the precision
    granted, and narrower formats are still refused."""
    got = await _run("matmul_tf32_flag_atomic", ["rounded_tf32_matmul", "rounded_bf16_matmul"])
    tf32, bf16 = got["rounded_tf32_matmul"], got["rounded_bf16_matmul"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.precision is PrecisionMode.REFERENCE
    assert tf32.correctness.ref_default_err_vs_fp64 is not None
    assert bf16.status is EvalStatus.INCORRECT, bf16.summary
    assert "lower precision than the reference" in bf16.summary


async def test_a_calibration_that_fell_back_is_raised_by_a_later_trial_s_measure() -> None:
    """The referee's calibration and a spare's first trials measure the defaults on an IEEE
    fallback (cuDNN without its TF32 workspace at start-up: KernelBench L3-25 on an H100); a later
    trial of the same spare measures the TF32 the user's model runs. That measure raises the
    task's calibration, so the fallen-back trials judge by it: the reference's own TF32 is granted
    (refused without the raise), bfloat16 is still refused."""
    got = await _run("matmul_tf32_late", ["rounded_tf32_matmul", "rounded_bf16_matmul"])
    tf32, bf16 = got["rounded_tf32_matmul"], got["rounded_bf16_matmul"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.precision is PrecisionMode.REFERENCE
    assert tf32.correctness.ref_default_err_vs_fp64 is not None
    assert tf32.correctness.ref_err_vs_fp64 is not None
    assert tf32.correctness.ref_default_err_vs_fp64 > 100 * tf32.correctness.ref_err_vs_fp64  # TF32's, raised
    assert bf16.status is EvalStatus.INCORRECT, bf16.summary
    assert "lower precision than the reference" in bf16.summary


@pytest.mark.slow  # ~4 s on a 2-core host; the default run keeps the granted TF32 and the IEEE reference's downcast
async def test_a_reference_whose_ieee_runs_spread_as_far_as_its_tf32_keeps_the_exact_rule() -> None:
    """Runs that differ by 1e-5 (within the float tolerance, so the task stands) are noise of the
    same order as TF32's error: no precision is granted for it."""
    noisy = reference("matmul_tf32_flag_atomic").replace("\nNOISE = 0.0\n", "\nNOISE = 1e-5\n")
    assert noisy != reference("matmul_tf32_flag_atomic")
    got = await _evaluate(noisy, {"rounded_tf32_matmul": candidate("rounded_tf32_matmul")})
    tf32 = got["rounded_tf32_matmul"]
    assert tf32.status is EvalStatus.INCORRECT, tf32.summary
    assert "lower precision than the reference" in tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.ref_default_err_vs_fp64 is None


TF32_CONV_CALL = "x = F.conv2d(_tf32(x), _tf32(self.conv.weight), self.conv.bias)"


def _template_candidates() -> list[tuple[str, str]]:
    """The template expert's first TF32 candidate for ``conv_bn_tf32_flag`` (rendered from its
    plain twin, ``self.conv(x)``), and the same with its operands rounded to bfloat16 instead."""
    from actors.experts.template import analyse, default_params, render
    from actors.experts.template.hardware import lookup

    plain = reference("conv_bn_tf32_flag").replace(TF32_CONV_CALL, "x = self.conv(x)")
    assert plain != reference("conv_bn_tf32_flag")
    plan = analyse(plain)
    assert not isinstance(plan, Unsupported), plan
    tf32 = render(plan, default_params(plan, lookup("H200"), tf32=True))
    assert "+ 0x1000) & -0x2000)" in tf32
    bf16 = tf32.replace("+ 0x1000) & -0x2000)", "+ 0x8000) & -0x10000)")
    return [("template_tf32", tf32), ("template_bf16", bf16)]


@pytest.mark.slow  # 9-15 s each on a 2-core machine: the default suite stays under 15 minutes
async def test_range_trials_are_held_to_the_reference_s_own_error_at_their_scale() -> None:
    """The referee measures the defaults' error at the range trials' scales too: the template's
    TF32 convolution + batch norm errs there as the user's model does (it was refused on 1 of 5
    trials, 47% of elements outside, on KernelBench L2-52), and bfloat16 operands still fail."""
    got = await _evaluate(reference("conv_bn_tf32_flag"), dict(_template_candidates()))
    tf32, bf16 = got["template_tf32"], got["template_bf16"]
    assert tf32.status is EvalStatus.CORRECT, tf32.summary
    assert tf32.correctness is not None
    assert tf32.correctness.passed_trials == tf32.correctness.trials
    assert tf32.correctness.precision is PrecisionMode.REFERENCE
    assert bf16.status is EvalStatus.INCORRECT, bf16.summary
