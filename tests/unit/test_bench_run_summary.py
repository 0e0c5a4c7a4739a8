"""bench/run_summary.py: where a run's time went, read back from its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.run_summary import main, summarise, table


def _event(t: float, name: str, **fields: object) -> str:
    stamp = f"2026-11-27T20:00:{t:06.3f}Z"
    return json.dumps({"event": name, "timestamp": stamp, **fields})


def _run(folder: Path) -> Path:
    run = folder / "a" / "run"
    run.mkdir(parents=True)
    report = {
        "evaluated": 12,
        "first_correct_s": 16.5,
        "best": {"speedup_vs_eager": 1.148},
        "gpus": [{"candidates_per_s": 0.5, "busy_fraction": 0.75, "held_s_mean": 1.5, "measured_s_mean": 1.2,
                  "compile_s_mean": 2.25}],
    }  # fmt: skip
    (run / "report.json").write_text(json.dumps(report))
    lines = [
        "Loading faiss.",  # not JSON: skipped
        _event(1.0, "actor running"),
        _event(4.8, "evaluator_started", phases={"process_s": 10.0, "probe_s": 3.8, "pools_s": 0.0}),
        _event(6.0, "fork_server_ready", mode="compile"),
        _event(9.8, "fork_server_ready", mode="run"),
        _event(10.0, "spare_prepared", startup_s=0.5, prepare_s=1.5, phases={"compiled_s": 1.0, "cuda_init_s": 0.3}),
        _event(11.0, "spare_prepared", startup_s=0.5, prepare_s=2.5, phases={"compiled_s": 2.0, "cuda_init_s": 0.5}),
        _event(12.7, "evaluated", candidate="c1"),
    ]
    (run / "run.log").write_text("\n".join(lines) + "\n")
    return run


def test_a_runs_row_gives_its_rate_start_up_spares_and_best(tmp_path: Path) -> None:
    row = summarise(_run(tmp_path))
    assert row["run"] == "a/run"
    assert (row["evaluated"], row["rate"], row["busy"], row["compiled"]) == (12, 0.5, 0.75, 2.25)
    assert round(row["start"], 3) == 3.8  # from the first log line
    assert round(row["forks"], 3) == 8.8  # the later fork server
    assert round(row["first_verdict"], 3) == 11.7
    assert row["spare"] == 2.5  # startup and preparation, averaged
    assert row["spare_phases"].startswith("compiled 1.50 cuda_init 0.40")
    line = table([row])[2]
    assert "| a/run | 12 | 0.500 | 75% | 1.50 | 1.20 | 2.25 | 3.8 (10.0, 3.8, 0.0) | 8.8 | 11.7 |" in line


def test_a_folder_without_results_gives_dashes_and_a_missing_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert table([summarise(empty)])[2].startswith("| empty | - | - |")
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err
