"""The line ``kfoundry run`` ends with and its exit status: a CPU run says its timings are not
speedups, and a GPU run whose best is not faster than eager says so plainly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from actors.commands.outcome import ExitCode, RunOutcome, RunVerdict, model_header_note
from schemas import DeviceChoice, StopReason


def _outcome(device: DeviceChoice, best: float | None = 0.014, compiled: float | None = None) -> RunOutcome:
    return RunOutcome(
        run_id="r1",
        reason=StopReason.CANDIDATES,
        evaluated=4,
        statuses={"correct": 4},
        best_fitness=best,
        best_candidate_id="c1" if best is not None else None,
        run_dir=Path("runs/r1"),
        device=device,
        best_vs_compiled=compiled,
    )


def test_cpu_run_summary_says_interpreter_timings_are_not_speedups() -> None:
    outcome = _outcome(DeviceChoice.CPU)
    text = outcome.summary(12.0)
    assert "best 0.014x over eager" in text
    assert "not speedups" in text
    assert "GPU" in text
    assert outcome.verdict is RunVerdict.NOT_TIMED_ON_GPU
    assert outcome.exit_code == ExitCode.FASTER
    assert outcome.exit_code == 0


def test_gpu_run_whose_best_is_slower_than_eager_says_so_and_exits_4() -> None:
    outcome = _outcome(DeviceChoice.CUDA, best=0.845, compiled=0.84)
    text = outcome.summary(12.0)
    assert "no candidate beat eager PyTorch; the best was 0.845x" in text
    assert "slower than torch.compile (0.840x)" in text
    assert "over eager" not in text
    assert "not speedups" not in text
    assert outcome.verdict is RunVerdict.NOT_FASTER_THAN_EAGER
    assert outcome.exit_code == 4


def test_gpu_run_faster_than_eager_exits_0_and_compares_with_torch_compile() -> None:
    slower = _outcome(DeviceChoice.CUDA, best=1.15, compiled=0.98)
    assert "best 1.150x over eager; slower than torch.compile (0.980x)" in slower.summary(5.0)
    assert slower.exit_code == 0
    faster = _outcome(DeviceChoice.CUDA, best=1.15, compiled=1.14)
    assert "best 1.150x over eager; 1.140x over torch.compile" in faster.summary(5.0)
    unmeasured = _outcome(DeviceChoice.CUDA, best=1.15, compiled=None)
    assert "torch.compile" not in unmeasured.summary(5.0)
    derived = dataclasses.replace(faster, best_compiled_derived=True)
    assert "1.140x over torch.compile (derived from the measured compiled/eager ratio)" in derived.summary(5.0)
    assert "derived" not in faster.summary(5.0)


def test_run_without_a_correct_candidate_exits_1() -> None:
    outcome = _outcome(DeviceChoice.CUDA, best=None)
    outcome.statuses = {"incorrect": 4}
    assert "no correct candidate found" in outcome.summary(3.0)
    assert outcome.exit_code == 1


def test_correct_candidates_none_admitted_as_best_are_not_called_no_correct_candidate() -> None:
    # seen on an H100: 14 correct tf32x3 GEMMs, each flagged for review (faster than the bound)
    outcome = _outcome(DeviceChoice.CUDA, best=None)
    text = outcome.summary(3.0)
    assert "no correct candidate found" not in text
    assert "4 correct but flagged for review or not timed" in text
    assert outcome.exit_code == 1


@pytest.mark.parametrize(
    ("verdict", "eager", "compiled", "marks"),
    [
        (RunVerdict.NOT_FASTER_THAN_EAGER, 0.85, 0.7, ("NOT FASTER", "0.850x", "slower than torch.compile (0.700x)")),
        (RunVerdict.FASTER_THAN_EAGER, 1.2, 0.9, ("slower than torch.compile (0.900x)",)),
        (RunVerdict.FASTER_THAN_EAGER, 1.2, 1.1, ()),
        (RunVerdict.NOT_TIMED_ON_GPU, 0.01, 0.01, ()),
    ],
)
def test_best_model_header_marks_a_kernel_slower_than_a_measured_baseline(
    verdict: RunVerdict, eager: float, compiled: float, marks: tuple[str, ...]
) -> None:
    note = model_header_note(verdict, eager, compiled)
    for mark in marks:
        assert mark in note
    assert all(line.startswith("# ") for line in note.splitlines())
    assert bool(note) == bool(marks)


def test_a_run_that_evaluated_nothing_names_the_declines_and_what_to_try() -> None:
    from actors.report.model import IslandReport, declines_sentence
    from schemas import Decline, DeclineReason

    why = Decline(
        reason=DeclineReason.UNSUPPORTED,
        detail="function torch.randn_like is not covered by the templates",
        op="function torch.randn_like",
    )
    islands = [
        IslandReport(island="i0", evaluated=0, declines=9, last_decline=why),
        IslandReport(island="i1", evaluated=0, declines=7, last_decline=why),
        IslandReport(island="i2", evaluated=0),
    ]
    said = declines_sentence(islands)
    assert said is not None
    assert said.startswith("the experts declined 16 request(s): unsupported: function torch.randn_like"), said
    assert "--torch-ops reference" in said
    outcome = dataclasses.replace(_outcome(DeviceChoice.CPU, best=None), evaluated=0, statuses={}, declined=said)
    text = outcome.summary(20.0)
    assert "0 evaluated: the experts declined 16 request(s)" in text, text
    assert "()" not in text, text
    assert declines_sentence([IslandReport(island="i0", evaluated=3)]) is None
    timeout = Decline(reason=DeclineReason.TIMEOUT, detail="no reply in 60 s")
    other = declines_sentence([IslandReport(island="i0", evaluated=0, declines=2, last_decline=timeout)])
    assert other == "the experts declined 2 request(s): timeout: no reply in 60 s"


def test_a_decline_that_leaving_ops_to_pytorch_cannot_help_suggests_no_torch_ops() -> None:
    from actors.report.model import IslandReport, declines_sentence
    from schemas import Decline, DeclineReason, TorchOpsPolicy

    def said(why: Decline, policy: TorchOpsPolicy = TorchOpsPolicy.FORBID) -> str:
        sentence = declines_sentence([IslandReport(island="i0", evaluated=0, declines=3, last_decline=why)], policy)
        assert sentence is not None
        return sentence

    llm = "(try an LLM expert: kfoundry expert set NAME --kind llm ..., then --experts template,NAME)"
    for detail in (
        "input x is torch.float64; only float32 (and bool masks) is covered",
        "input x is torch.int32; only float32 (and bool masks) is covered",
    ):
        dtype = said(Decline(reason=DeclineReason.UNSUPPORTED, detail=detail))  # no op: the template's own
        assert "--torch-ops" not in dtype, dtype
        assert dtype.endswith(llm), dtype
    op = Decline(reason=DeclineReason.UNSUPPORTED, detail="function torch.fft.fft is not covered", op="torch.fft.fft")
    assert "(try --torch-ops reference, which leaves the reference's own ops to PyTorch, or an LLM" in said(op)
    already = said(op, TorchOpsPolicy.REFERENCE)  # the run already leaves them: no use saying it
    assert "--torch-ops" not in already, already
    assert already.endswith(llm), already


def test_the_end_line_says_when_the_references_outputs_hold_nan() -> None:
    from pathlib import Path

    from actors.commands.outcome import RunOutcome
    from schemas import DeviceChoice, StopReason

    outcome = RunOutcome(
        run_id="r1", reason=StopReason.CANDIDATES, evaluated=2, statuses={"correct": 2}, best_fitness=1.5,
        best_candidate_id="c1", run_dir=Path("runs/r1"), device=DeviceChoice.CUDA, reference_nonfinite_share=0.497,
    )  # fmt: skip
    lines = outcome.summary(10.0).splitlines()
    assert lines[-1] == (
        "note: the reference's own outputs hold NaN/Inf (49.7% of elements): candidates were judged on "
        "matching NaN/Inf positions and finite values elsewhere"
    )
    plain = RunOutcome(
        run_id="r1", reason=StopReason.CANDIDATES, evaluated=2, statuses={"correct": 2}, best_fitness=1.5,
        best_candidate_id="c1", run_dir=Path("runs/r1"), device=DeviceChoice.CUDA,
    )  # fmt: skip
    assert "NaN" not in plain.summary(10.0)


def test_a_run_whose_experts_never_answered_says_so() -> None:
    from actors.report.experts import ExpertReport
    from actors.report.model import unanswered_sentence

    waited = ExpertReport(expert="template", requests=4, declines=4, declined_by={"unavailable": 4})
    said = unanswered_sentence([waited])
    assert said is not None
    assert said.startswith("no expert answered in time: 4 request(s) to template unanswered when the run ended"), said
    assert "more --seconds" in said
    outcome = dataclasses.replace(_outcome(DeviceChoice.CPU, best=None), evaluated=0, statuses={}, declined=said)
    assert "0 evaluated: no expert answered in time" in outcome.summary(20.0)
    published = ExpertReport(expert="llm", requests=2, published=1)
    assert unanswered_sentence([waited, published]) is None
    refused = ExpertReport(expert="template", requests=2, declines=2, declined_by={"refused": 2})
    assert unanswered_sentence([refused]) is None


def test_a_run_that_ended_while_its_task_was_checked_says_so() -> None:
    from actors.report.model import checking_sentence

    said = checking_sentence(12.4, 30.0)
    assert said == (
        "the evaluator was still checking the task when the run ended (its reference's first load and run: "
        "12 s so far; one that never returns is refused after 30 s)"
    )
    outcome = dataclasses.replace(_outcome(DeviceChoice.CPU, best=None), evaluated=0, statuses={}, declined=said)
    assert "0 evaluated: the evaluator was still checking the task" in outcome.summary(20.0)


def test_a_best_that_raises_at_held_out_shapes_is_called_specialised_in_the_end_line_and_its_file() -> None:
    from actors.commands.outcome import held_out_note
    from schemas import Correctness, ShapeCheck

    shapes = (
        ShapeCheck(shape="batch_size=31: inputs (31, 256)", outcome="raised", detail="ValueError: x has shape"),
        ShapeCheck(shape="batch_size=1: inputs (1, 256)", outcome="correct"),
    )
    text = dataclasses.replace(_outcome(DeviceChoice.CUDA, best=1.3), held_out=shapes).summary(5.0)
    assert text.splitlines()[1] == (
        "note: the best is specialised to the reference's input shapes: it raises at 1 of the 2 held-out "
        "shapes the evaluator tried (batch_size=31: inputs (31, 256))"
    )
    generic = shapes[0].model_copy(update={"outcome": "correct", "detail": ""})
    assert (
        len(dataclasses.replace(_outcome(DeviceChoice.CUDA, best=1.3), held_out=(generic,)).summary(5.0).splitlines())
        == 1
    )
    corr = Correctness(trials=5, passed_trials=5, atol=1e-4, rtol=1e-4, held_out=shapes)
    assert held_out_note(corr) == (
        "# held-out shapes (drawn by the evaluator): correct at batch_size=1: inputs (1, 256); raises at "
        "batch_size=31: inputs (31, 256) (specialised to the reference's shapes)\n"
    )
    none = Correctness(trials=5, passed_trials=5, atol=1e-4, rtol=1e-4, held_out_note="no tensor input")
    assert held_out_note(none) == "# held-out shapes: none checked (no tensor input)\n"
