"""``bench/ablation.py``: one row per (problem, variant) and one summary line per variant; and, on
the CPU (slow), real runs with a switch on and off that the table reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from actors.kbench.results import ProblemResult, ProblemStatus
from bench.ablation import ALL_ON, AblationRow, main, render, summarise

ROOT = Path(__file__).resolve().parents[2]


def _result(name: str, status: ProblemStatus, speedup: float | None, first: float | None, n: int) -> ProblemResult:
    return ProblemResult(
        level=1, number=1, name=name, status=status, speedup_vs_eager=speedup, speedup_vs_compiled=None,
        first_correct_s=first, evaluated=n, wall_s=10.0, run_dir="runs/x",
    )  # fmt: skip


def test_summary_per_variant_has_geomean_time_to_first_correct_and_candidates() -> None:
    rows = [
        AblationRow(variant=ALL_ON, result=_result("a", ProblemStatus.CORRECT, 2.0, 10.0, 20)),
        AblationRow(variant=ALL_ON, result=_result("b", ProblemStatus.CORRECT, 0.5, 30.0, 18)),
        AblationRow(variant="--no-migration", result=_result("a", ProblemStatus.CORRECT, 1.5, 40.0, 12)),
        AblationRow(variant="--no-migration", result=_result("b", ProblemStatus.NO_CORRECT, None, None, 9)),
    ]
    on, off = summarise(rows)
    assert (on.variant, on.correct, on.problems, on.candidates) == (ALL_ON, 2, 2, 38)
    assert on.geomean_speedup == pytest.approx(math.sqrt(2.0 * 0.5))
    assert on.median_first_correct_s == pytest.approx(20.0)
    assert (off.correct, off.geomean_speedup, off.median_first_correct_s, off.candidates) == (1, 1.5, 40.0, 21)
    table = render(rows, on_cpu=True)
    assert "| b | --no-migration | no_correct | - | - | - | 9 |" in table
    assert "| --no-migration | 1/2 | 1.500x | 40 s | 21 |" in table
    assert "not speedups" in table
    assert "not speedups" not in render(rows, on_cpu=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ablation_bench_runs_each_variant_on_the_same_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KFOUNDRY_HOME", str(tmp_path / "home"))
    out = tmp_path / "ab"
    code = main([
        "--task", "examples/quickstart.py", "--device", "cpu", "--seconds", "300", "--candidates", "3",
        "--switches", "no-experience", "--run-arg=--embedder", "--run-arg=hashing", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    data = json.loads((out / "ablation.json").read_text())
    assert [r["variant"] for r in data["rows"]] == [ALL_ON, "--no-experience"]
    for row in data["rows"]:
        assert row["result"]["evaluated"] == 3, row
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*/runs/*/report.json"))]
    assert sorted(tuple(r["ablations"]) for r in reports) == [(), ("no_experience",)]
    assert "| variant | correct |" in (out / "ablation.md").read_text()
