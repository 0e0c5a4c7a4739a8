"""The bench's totals (share correct, fast_p, geometric means) against hand-computed values, the
table, and how a run's report and exit status become a problem's status."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from actors.kbench.problems import Problem
from actors.kbench.results import BenchFile, ProblemResult, ProblemStatus, fast_p, geomean, markdown, totals
from actors.kbench.runner import classify
from actors.report import BestKernel, IslandReport, RunReport
from schemas import Decline, DeclineReason, KernelLanguage, StopReason


def _row(n: int, status: ProblemStatus, eager: float | None = None, compiled: float | None = None) -> ProblemResult:
    return ProblemResult(
        level=1, number=n, name=f"{n}_Op", status=status, speedup_vs_eager=eager, speedup_vs_compiled=compiled,
        wall_s=1.0, run_dir=f"runs/level1_{n:03d}",
    )  # fmt: skip


ROWS = [
    _row(1, ProblemStatus.CORRECT, eager=2.0, compiled=1.0),
    _row(2, ProblemStatus.CORRECT, eager=0.5, compiled=0.25),
    _row(3, ProblemStatus.CORRECT, eager=1.6, compiled=None),  # torch.compile could not be built
    _row(4, ProblemStatus.NO_CORRECT),
    _row(5, ProblemStatus.TASK_ERROR),
]


def test_fast_p_counts_correct_and_strictly_faster_over_all_problems() -> None:
    assert fast_p([2.0, 0.5, 1.6, None, None], 1.0) == pytest.approx(2 / 5)
    assert fast_p([2.0, 0.5, 1.6, None, None], 1.5) == pytest.approx(2 / 5)
    assert fast_p([1.0, 1.5, 1.51], 1.5) == pytest.approx(1 / 3)  # equal is not faster
    assert fast_p([], 1.0) is None


def test_geomean_of_hand_computed_values() -> None:
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    with pytest.raises(ValueError, match="non-positive"):
        geomean([1.0, 0.0])


def test_totals_over_a_mixed_bench() -> None:
    t = totals(ROWS)
    assert (t.problems, t.correct) == (5, 3)
    assert t.share_correct == pytest.approx(0.6)
    # vs eager: 2.0 and 1.6 beat 1.0 and 1.5 -> 2/5 each.
    assert t.fast_p["eager"] == {"1": pytest.approx(0.4), "1.5": pytest.approx(0.4)}
    # vs compile: 1.0 is not > 1.0; problem 3 has no compile baseline -> 0/5.
    assert t.fast_p["compiled"] == {"1": 0.0, "1.5": 0.0}
    assert t.geomean_correct["eager"] == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))  # 1.6^(1/3) = 1.1696
    assert t.geomean_all["eager"] == pytest.approx(1.6 ** (1 / 5))  # problems 4, 5 count as 1.0
    assert t.geomean_correct["compiled"] == pytest.approx(math.sqrt(0.25))
    assert t.geomean_all["compiled"] == pytest.approx(0.25 ** (1 / 5))
    assert t.by_status == {"correct": 3, "no_correct": 1, "declined": 0, "task_error": 1}


def test_totals_of_no_problems_are_not_measured() -> None:
    t = totals([])
    assert t.share_correct is None
    assert t.fast_p["eager"]["1"] is None
    assert t.geomean_all["eager"] is None


def test_a_speedup_only_counts_for_a_correct_problem() -> None:
    odd = _row(9, ProblemStatus.NO_CORRECT, eager=3.0)
    assert totals([odd]).fast_p["eager"]["1"] == 0.0


def test_markdown_table_has_a_row_per_problem_and_the_totals() -> None:
    rows = [*ROWS[:4], _row(5, ProblemStatus.DECLINED).model_copy(update={"detail": "needs ~9 GiB | of device memory"})]
    text = markdown(BenchFile(kernelbench_dir="/kb", level=1, problems_spec="1-5", results=tuple(rows)))
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 5
    assert "| 1_Op | best correct | 2x | 1x |" in text
    assert "| 4_Op | no correct candidate | – | – |" in text
    assert "declined: needs ~9 GiB \\| of device memory" in text
    assert "correct: 3/5 (60%)" in text
    assert "vs eager: fast_1 40%, fast_1.5 40%" in text
    assert "| wall (s) |" in text
    assert "past the budget" not in text  # no budget given: nothing to be past


def test_markdown_shows_each_run_s_wall_time_against_the_budget() -> None:
    rows = tuple(r.model_copy(update={"wall_s": w}) for r, w in zip(ROWS[:3], (41.0, 49.5, 43.0), strict=True))
    text = markdown(BenchFile(kernelbench_dir="/kb", level=1, problems_spec="1-3", seconds=40, results=rows))
    assert "Each run's budget: 40 s of wall time" in text
    assert "| 1_Op | best correct | 2x | 1x | – | – | – | 41 |" in text
    assert "- wall time past the budget: median +3.0 s, most +9.5 s" in text


def test_markdown_marks_a_derived_speedup_over_torch_compile() -> None:
    derived = _row(1, ProblemStatus.CORRECT, eager=2.0, compiled=1.5).model_copy(update={"compiled_derived": True})
    text = markdown(BenchFile(kernelbench_dir="/kb", level=1, problems_spec="1-2", results=(derived, ROWS[1])))
    assert "| 1_Op | best correct | 2x | 1.5x* |" in text
    assert "| 2_Op | best correct | 0.5x | 0.25x |" in text
    assert "\\* derived: the best's own process did not time torch.compile" in text
    plain = markdown(BenchFile(kernelbench_dir="/kb", level=1, problems_spec="2", results=(ROWS[1],)))
    assert "derived" not in plain


def test_markdown_lists_where_each_run_s_first_seconds_went() -> None:
    line = "first verdict (correct) at 30.5 s: proposed at 12.3 s, gate 0.9 s, compile 9.8 s, run 7.2 s"
    first = ROWS[0].model_copy(update={"first_verdict": line})
    text = markdown(BenchFile(kernelbench_dir="/kb", level=1, problems_spec="1-2", results=(first, ROWS[1])))
    assert f"- 1_Op: {line}" in text
    assert "2_Op: first verdict" not in text
    assert "first seconds" not in markdown(
        BenchFile(kernelbench_dir="/kb", level=1, problems_spec="2", results=(ROWS[1],))
    )


def _problem(tmp_path: Path) -> Problem:
    return Problem(level=1, number=19, path=tmp_path / "19_ReLU.py")


def _report(**kw: object) -> RunReport:
    base: dict[str, object] = {"run_id": "r1", "evaluated": 0, "status_counts": {}, "category_counts": {}}
    return RunReport.model_validate(base | kw)


def test_classify_a_run_with_a_best_kernel(tmp_path: Path) -> None:
    best = BestKernel(
        candidate_id="c1", island="i0", expert="template", fitness=1.7, speedup_vs_eager=1.7,
        speedup_vs_compiled=0.9, sol_fraction=0.4, language=KernelLanguage.TRITON, source="", lineage=(),
    )  # fmt: skip
    (tmp_path / "report.json").write_text(_report(evaluated=4, best=best, first_correct_s=12.0).model_dump_json())
    status, detail, report = classify(_problem(tmp_path), tmp_path, 0, "")
    assert status is ProblemStatus.CORRECT
    assert detail is None
    assert report is not None
    assert report.first_correct_s == 12.0


def test_classify_declines_with_the_experts_reason(tmp_path: Path) -> None:
    decline = Decline(reason=DeclineReason.UNSUPPORTED, detail="aten.conv2d has no template")
    island = IslandReport(island="i0", evaluated=0, declines=8, last_decline=decline, stopped=StopReason.NO_PROGRESS)
    (tmp_path / "report.json").write_text(_report(islands=(island,)).model_dump_json())
    status, detail, _ = classify(_problem(tmp_path), tmp_path, 1, "")
    assert status is ProblemStatus.DECLINED
    assert detail == "experts declined 8 request(s): unsupported: aten.conv2d has no template"


def test_classify_no_correct_candidate(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(_report(evaluated=3, status_counts={"incorrect": 3}).model_dump_json())
    assert classify(_problem(tmp_path), tmp_path, 1, "")[0] is ProblemStatus.NO_CORRECT


def test_classify_a_run_the_evaluator_could_not_judge(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(_report(evaluated=2, status_counts={"evaluator_error": 2}).model_dump_json())
    status, detail, _ = classify(_problem(tmp_path), tmp_path, 1, "")
    assert status is ProblemStatus.TASK_ERROR
    assert detail == "the evaluator gave no verdict on any of 2 candidate(s)"


def test_classify_without_a_report(tmp_path: Path) -> None:
    console = (
        "progress\nkfoundry: task needs ~30.0 GiB of device memory for one evaluation; this GPU has 20.0 GiB free\n"
    )
    assert classify(_problem(tmp_path), tmp_path, 3, console)[:2] == (
        ProblemStatus.DECLINED,
        "task needs ~30.0 GiB of device memory for one evaluation; this GPU has 20.0 GiB free",
    )
    bad = "kfoundry: x.py: not a KernelBench-format task, missing get_inputs\n"
    assert classify(_problem(tmp_path), tmp_path, 2, bad)[:2] == (
        ProblemStatus.TASK_ERROR,
        "x.py: not a KernelBench-format task, missing get_inputs (exit status 2)",
    )
    assert classify(_problem(tmp_path), tmp_path, -9, "Traceback\nMemoryError\n")[:2] == (
        ProblemStatus.TASK_ERROR,
        "MemoryError (killed by SIGKILL)",
    )


def test_classify_an_unreadable_report(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text("{not json")
    status, detail, _ = classify(_problem(tmp_path), tmp_path, 0, "")
    assert status is ProblemStatus.TASK_ERROR
    assert detail is not None
    assert "unreadable report.json" in detail
