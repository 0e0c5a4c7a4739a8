"""The rule diagnoser: failures from their logs, refusals from findings, wrong answers from the
correctness evidence, correct candidates from their measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.diagnosis.errors import DiagnoserConfigError
from actors.diagnosis.rules import RuleConfig, RuleDiagnoser
from schemas import (
    LOWER_PRECISION,
    CheatRule,
    Check,
    CheckName,
    CheckOutcome,
    Correctness,
    DeviceKind,
    DiagnosisCategory,
    EvalStatus,
    Finding,
    Severity,
    StageTimes,
)
from tests.evolution import factories as f

DATA = Path(__file__).with_name("data")
C = DiagnosisCategory
RULES = RuleDiagnoser()


def _corr(**kw: object) -> Correctness:
    base: dict[str, object] = {"trials": 5, "passed_trials": 0, "atol": 1e-5, "rtol": 1e-5}
    return Correctness.model_validate(base | kw)


def test_compile_error_is_read_from_the_nvcc_log_and_routed_to_repair() -> None:
    cand = f.candidate()
    log = (DATA / "nvcc_undefined_identifier.txt").read_text()
    d = RULES.diagnose(f.failed(cand, EvalStatus.COMPILE_ERROR, compile_log=log), cand)
    assert d.category is C.COMPILE_TYPE
    assert d.suggested_expert == "repair"
    assert any('identifier "yy" is undefined' in e for e in d.evidence)
    assert any(e == "location: nvcc_undefined_identifier.cu:3" for e in d.evidence)
    assert d.hints
    assert d.sol_distance is None
    assert d.candidate_id == cand.candidate_id
    assert d.diagnoser == "rules/1.0"


def test_interpreter_error_in_run_stage_is_named_a_compile_error_with_a_note() -> None:
    cand = f.candidate()
    log = (DATA / "triton_interp_broadcast.txt").read_text()
    d = RULES.diagnose(f.failed(cand, EvalStatus.RUNTIME_ERROR, runtime_log=log))
    assert d.category is C.COMPILE_TYPE
    assert any("reported as runtime_error" in e for e in d.evidence)


def test_shared_memory_overflow_goes_to_the_tiling_expert_with_the_specific_hint() -> None:
    cand = f.candidate()
    log = (DATA / "triton_out_of_resources_shared.txt").read_text()
    d = RULES.diagnose(f.failed(cand, EvalStatus.RUNTIME_ERROR, runtime_log=log))
    assert d.category is C.COMPILE_RESOURCES
    assert d.suggested_expert == "tiling"
    assert any("num_stages" in h for h in d.hints)


def test_unrecognised_failure_falls_back_with_low_confidence_and_the_log_tail() -> None:
    cand = f.candidate()
    res = f.failed(cand, EvalStatus.RUNTIME_ERROR, runtime_log="step 1\nstep 2\nworker went away", summary="died")
    d = RULES.diagnose(res)
    assert d.category is C.RUNTIME_EXCEPTION
    assert d.confidence < 0.5
    assert "worker went away" in d.evidence


@pytest.mark.parametrize(
    ("stages", "summary", "expected"),
    [
        (StageTimes(compile_s=60.0), "timeout: the compile stage exceeded the 60 s timeout", C.COMPILE_TIMEOUT),
        (StageTimes(compile_s=1.0), "timeout: the evaluation exceeded 60 s (last stage: run)", C.RUNTIME_TIMEOUT),
        (StageTimes(compile_s=1.0, run_s=30.0), "timeout", C.RUNTIME_TIMEOUT),
    ],
)
def test_timeout_is_placed_in_the_stage_that_ran_out(stages: StageTimes, summary: str, expected: C) -> None:
    cand = f.candidate()
    d = RULES.diagnose(f.failed(cand, EvalStatus.TIMEOUT, stages=stages, compile_log="ok", summary=summary))
    assert d.category is expected


def test_rejection_names_the_rule_with_its_line() -> None:
    cand = f.candidate()
    finding = Finding(rule=CheatRule.TORCH_COMPUTE, severity=Severity.REJECT, message="torch.relu in forward", line=12)
    d = RULES.diagnose(f.failed(cand, EvalStatus.REJECTED, findings=(finding,)))
    assert d.category is C.REJECTED_TORCH_COMPUTE
    assert d.evidence == ("KF012-torch-compute line 12: torch.relu in forward",)
    assert any("own kernel" in h for h in d.hints)


def test_rejection_without_findings_is_read_from_failed_checks_or_marked_other() -> None:
    cand = f.candidate()
    check = Check(name="kernels_launched", outcome=CheckOutcome.FAILED, detail="0 launches of own kernels")
    by_check = RULES.diagnose(f.failed(cand, EvalStatus.REJECTED, checks=(check,)))
    bare = RULES.diagnose(f.failed(cand, EvalStatus.REJECTED))
    assert by_check.category is C.REJECTED_NO_KERNEL_LAUNCHED
    assert bare.category is C.REJECTED_OTHER
    assert bare.confidence < by_check.confidence


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (CheckName.TIMED_LAUNCHES, C.REJECTED_NO_KERNEL_LAUNCHED),
        (CheckName.INPUTS_UNCHANGED, C.REJECTED_INPUT_MUTATED),
        (CheckName.OUTPUTS_NOT_ALIASED, C.REJECTED_OUTPUT_ALIASES_INPUT),
        (CheckName.DEFERRED_WORK_GUARD, C.REJECTED_DEFERRED_WORK),
        (CheckName.OUTPUT_TYPE, C.REJECTED_OUTPUT_TYPE),
        (CheckName.NO_THREADS_LEFT, C.REJECTED_OTHER),
        ("launch_type_alias", C.REJECTED_OTHER),
    ],
)
def test_rejection_category_comes_from_the_failed_checks_name_not_its_spelling(name: str, expected: C) -> None:
    check = Check(name=name, outcome=CheckOutcome.FAILED, detail="failed")
    d = RULES.diagnose(f.failed(f.candidate(), EvalStatus.REJECTED, checks=(check,)))
    assert d.category is expected


def test_a_truncated_tf32_kernel_is_told_to_round_where_the_reference_runs_tf32() -> None:
    """Precision parity admits the reference's own TF32: a kernel whose truncated TF32 missed the
    bar is told how to round its operands; where the reference runs in IEEE float32 it is not."""
    tf32 = _corr(err_vs_fp64=1.03e-3, ref_err_vs_fp64=5.5e-7, max_abs_err=0.01, mismatch_fraction=0.9)
    parity = tf32.model_copy(update={"ref_default_err_vs_fp64": 3.0e-4})
    d = RULES.diagnose(f.incorrect(f.candidate(), parity))
    assert d.category is C.INCORRECT_PRECISION
    assert any("round the fp32 operands to nearest" in h for h in d.hints)
    assert any("at PyTorch's defaults errs" in e for e in d.evidence)
    plain = RULES.diagnose(f.incorrect(f.candidate(), tf32))
    assert plain.category is C.INCORRECT_PRECISION
    assert not any("round the fp32 operands" in h for h in plain.hints)


def test_the_evaluator_s_precision_verdict_is_read_as_precision_though_another_trial_passed() -> None:
    """KernelBench L2-21 on an H100: five TF32 candidates of a task whose reference computes IEEE
    float32 were refused with the evaluator's precision verdict and diagnosed as races (the reading
    where a trial passed and the errors over all trials are past the small-error bound), so the
    mutations went after a race. The evaluator's own finding is read first now."""
    detail = (
        "output 0: relative L2 error 1.88e-04 against float64, the eager reference has 3.66e-07 "
        f"(bar 1.00e-05): {LOWER_PRECISION} (TF32/bf16?)"
    )
    seen = {"passed_trials": 1, "err_vs_fp64": 0.3, "ref_err_vs_fp64": 3.7e-7, "max_abs_err": 0.8}
    d = RULES.diagnose(f.incorrect(f.candidate(), _corr(**seen, mismatch_fraction=0.4, detail=detail)))
    assert d.category is C.INCORRECT_PRECISION
    without = RULES.diagnose(f.incorrect(f.candidate(), _corr(**seen, mismatch_fraction=0.4, detail="0.40% wrong")))
    assert without.category is C.INCORRECT_RACE


@pytest.mark.parametrize(
    ("corr", "expected"),
    [
        (_corr(max_abs_err=float("nan"), mismatch_fraction=1.0), C.INCORRECT_NAN_INF),
        (_corr(detail="output shape (4, 6) != reference (4, 5)"), C.INCORRECT_SHAPE),
        (_corr(max_abs_err=0.5, nondeterministic=True, mismatch_fraction=0.01), C.INCORRECT_RACE),
        (
            _corr(max_abs_err=3.0, mismatch_fraction=0.008, first_bad_index=(992,), output_shape=(1000,)),
            C.INCORRECT_BOUNDARY,
        ),
        (
            _corr(max_abs_err=3.0, mismatch_fraction=0.01, first_bad_index=(31, 990), output_shape=(32, 1000)),
            C.INCORRECT_BOUNDARY,
        ),
        (_corr(max_abs_err=4e-5, max_rel_err=3e-5, mismatch_fraction=0.6), C.INCORRECT_PRECISION),
        (_corr(err_vs_fp64=2e-6, ref_err_vs_fp64=1e-7, max_abs_err=2e-4, mismatch_fraction=0.9), C.INCORRECT_PRECISION),
        (_corr(passed_trials=3, max_abs_err=0.7, mismatch_fraction=0.02), C.INCORRECT_RACE),
        (_corr(max_abs_err=2.0, max_rel_err=5.0, mismatch_fraction=0.93), C.INCORRECT_INDEXING),
        (_corr(max_abs_err=2.0, mismatch_fraction=0.1, first_bad_index=(3,), output_shape=(1000,)), C.INCORRECT_OTHER),
        (
            _corr(err_vs_fp64=3e-3, ref_err_vs_fp64=1e-7, max_abs_err=0.02, mismatch_fraction=0.97),
            C.INCORRECT_PRECISION,
        ),
        (_corr(detail="2 outputs, the reference returns 1"), C.INCORRECT_SHAPE),
        (
            _corr(detail="output structure differs: the reference returns (tensor, (tensor,)), the candidate tensor"),
            C.INCORRECT_SHAPE,
        ),
        (_corr(max_abs_err=3.0, mismatch_fraction=0.01, first_bad_index=(7, 999)), C.INCORRECT_BOUNDARY),
    ],
    ids=[
        "nan",
        "shape",
        "race-flag",
        "tail-1d",
        "tail-2d",
        "precision-tol",
        "precision-fp64",
        "race-partial",
        "indexing",
        "other",
        "bf16-like",
        "output-count",
        "output-structure",
        "few-wrong-no-shape",
    ],
)
def test_wrong_answer_is_classified_from_correctness_evidence(corr: Correctness, expected: C) -> None:
    cand = f.candidate()
    d = RULES.diagnose(f.incorrect(cand, corr))
    assert d.category is expected
    assert any("trials passed" in e for e in d.evidence)


def test_error_at_the_start_of_the_output_is_not_called_a_boundary_error() -> None:
    cand = f.candidate()
    corr = _corr(max_abs_err=3.0, mismatch_fraction=0.008, first_bad_index=(0,), output_shape=(1000,))
    assert RULES.diagnose(f.incorrect(cand, corr)).category is not C.INCORRECT_BOUNDARY


def test_wrong_only_at_a_held_out_shape_says_so_and_asks_for_run_time_sizes() -> None:
    from schemas import ShapeCheck

    cand = f.candidate()
    shapes = (
        ShapeCheck(shape="batch_size=7: inputs (7, 100)", outcome="wrong", detail="output 0: relative L2 error 0.4"),
        ShapeCheck(shape="batch_size=1: inputs (1, 100)", outcome="correct"),
    )
    corr = _corr(passed_trials=5, held_out=shapes, detail="wrong at held-out shape batch_size=7: inputs (7, 100)")
    d = RULES.diagnose(f.incorrect(cand, corr))
    assert d.category is C.INCORRECT_HELD_OUT
    assert d.summary == "Correct at the reference's input shapes, wrong at batch_size=7: inputs (7, 100)."
    assert any("hard-code" in h for h in d.hints)


def test_many_launches_of_tiny_kernels_are_launch_bound_and_go_to_fusion() -> None:
    cand = f.candidate()
    d = RULES.diagnose(f.correct(cand, median_ms=0.05, bound_ms=0.01, launches=4))
    assert d.category is C.SLOW_LAUNCH_BOUND
    assert d.suggested_expert == "fusion"
    assert d.sol_distance == pytest.approx(1 - 0.01 / 0.05)
    assert any("4 kernel launches" in e for e in d.evidence)


def test_launch_overhead_depends_on_the_device_that_ran() -> None:
    cand = f.candidate()
    # 3 launches x 1.8 ms on the CPU interpreter dwarf 4 ms; the same on a GPU costs 0.03 ms.
    cpu = RULES.diagnose(f.correct(cand, median_ms=4.0, bound_ms=1.0, launches=3, kind=DeviceKind.CPU))
    gpu = RULES.diagnose(f.correct(cand, median_ms=4.0, bound_ms=1.0, launches=3, kind=DeviceKind.CUDA))
    assert cpu.category is C.SLOW_LAUNCH_BOUND
    assert gpu.category is C.SLOW_MEMORY_BOUND


@pytest.mark.parametrize(
    ("median_ms", "limiter", "expected", "role"),
    [
        (0.11, "memory", C.AT_SOL, "tiling"),
        (0.25, "memory", C.SLOW_MEMORY_BOUND, "memory"),
        (0.25, "compute", C.SLOW_COMPUTE_BOUND, "tiling"),
        (5.0, "memory", C.SLOW_FAR_FROM_SOL, "algorithm"),
    ],
)
def test_correct_kernel_is_split_by_speed_of_light_measurement(
    median_ms: float, limiter: str, expected: C, role: str
) -> None:
    cand = f.candidate()
    d = RULES.diagnose(f.correct(cand, median_ms=median_ms, bound_ms=0.1, limiter=limiter))
    assert d.category is expected
    assert d.suggested_expert == role
    assert d.sol_distance == pytest.approx(max(0.0, 1 - 0.1 / median_ms))


def test_thresholds_move_the_split() -> None:
    cand = f.candidate()
    result = f.correct(cand, median_ms=0.25, bound_ms=0.1)  # 40 % of the bound
    assert RuleDiagnoser(RuleConfig(at_sol_fraction=0.35)).diagnose(result).category is C.AT_SOL
    assert RuleDiagnoser(RuleConfig(far_from_sol_fraction=0.5)).diagnose(result).category is C.SLOW_FAR_FROM_SOL


def test_result_flagged_for_review_is_diagnosed_by_its_review_finding() -> None:
    cand = f.candidate()
    res = f.correct(cand, median_ms=0.01, bound_ms=0.1, review=("faster than the speed-of-light bound",))
    res = res.model_copy(
        update={"findings": (Finding(rule=CheatRule.IMPLAUSIBLE_SPEED, severity=Severity.REVIEW, message="10x SOL"),)}
    )
    d = RULES.diagnose(res)
    assert d.category is C.REJECTED_IMPLAUSIBLE_SPEED
    assert "faster than the speed-of-light bound" in d.evidence
    assert d.confidence < 1


def test_correct_result_without_speed_of_light_is_low_confidence() -> None:
    cand = f.candidate()
    res = f.correct(cand, median_ms=0.2).model_copy(update={"sol": None})
    d = RULES.diagnose(res)
    assert d.category is C.SLOW_FAR_FROM_SOL
    assert d.sol_distance is None
    assert d.confidence <= 0.3


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"at_sol_fraction": 1.5}, "at_sol_fraction"),
        ({"far_from_sol_fraction": 0.9}, "far_from_sol_fraction"),
        ({"precision_factor": 0.5}, "precision_factor"),
        ({"launch_overhead_ms_cuda": -1.0}, "launch_overhead_ms_cuda"),
        ({"boundary_max_fraction": 1.0}, "boundary_max_fraction"),
    ],
)
def test_bad_config_fails_loudly_naming_the_setting(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(DiagnoserConfigError) as info:
        RuleConfig(**kwargs)
    assert info.value.name == name


def test_a_run_process_killed_by_a_signal_is_a_crash() -> None:
    cand = f.candidate()
    res = f.failed(cand, EvalStatus.RUNTIME_ERROR, summary="runtime_error: the run process killed by SIGSEGV")
    d = RULES.diagnose(res)
    assert d.category is C.RUNTIME_CRASH
    assert "killed by SIGSEGV" in d.summary


def test_every_diagnosis_category_outside_the_rejections_has_its_own_hint_and_role() -> None:
    """A category added to the taxonomy without advice would reach the experts as the generic
    anti-cheat sentence (the fallback meant for ``rejected.*`` only)."""
    from actors.diagnosis.hints import hints_for, suggested_role
    from schemas import DiagnosisCategory

    generic = hints_for(DiagnosisCategory("rejected.other"))
    for category in DiagnosisCategory:
        hints = hints_for(category)
        assert hints, category
        assert suggested_role(category), category
        if category.family != "rejected":
            assert hints != generic, f"{category.value} has no hint of its own"
