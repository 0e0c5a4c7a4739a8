"""Per-GPU throughput and busy fraction: from a run's results (report.json, the progress line)
and from evaluators' live statistics (``kfoundry status``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from actors.report import build_report, write_report
from actors.runtime.gpu_usage import gpu_usage, live_rows, progress_part, usage_table
from schemas import DeviceInfo, DeviceKind, EvalResult, EvalStatus, StageTimes


def _device(gpu: int | None, host: str = "gpuhost", kind: DeviceKind = DeviceKind.CUDA) -> DeviceInfo:
    return DeviceInfo(kind=kind, name="NVIDIA H200", torch="2.11", python="3.12", host=host, gpu_index=gpu)


def _result(
    n: int, *, at: float, gpu: int | None, gpu_s: float | None, evaluator: str, device: bool = True
) -> EvalResult:
    return EvalResult(
        run_id="r",
        candidate_id=f"c{n}",
        island="i0",
        task_id="t",
        status=EvalStatus.CORRECT,
        summary="ok",
        device=_device(gpu) if device else None,
        stages=StageTimes(gpu_s=gpu_s, measure_s=gpu_s / 2 if gpu_s else None, total_s=2.0),
        evaluator=evaluator,
        created_at=at,
    )


def _stream() -> list[EvalResult]:
    # Window: the first receipt at 100 - 2 = 98 to the last verdict at 118: 20 s.
    out = [_result(i, at=100.0 + 2 * i, gpu=0, gpu_s=1.5, evaluator="evaluator-a") for i in range(10)]
    out += [_result(10 + i, at=102.0 + 4 * i, gpu=1, gpu_s=2.0, evaluator="evaluator-b") for i in range(5)]
    # A gate rejection of evaluator-b: no device, no GPU time, still its verdict.
    out.append(_result(99, at=110.0, gpu=None, gpu_s=None, evaluator="evaluator-b", device=False))
    return out


def test_results_are_grouped_per_gpu_over_one_window() -> None:
    usage = gpu_usage(_stream())
    assert [(u.gpu, u.evaluated) for u in usage] == [(0, 10), (1, 6)]
    a, b = usage
    assert a.window_s == b.window_s == pytest.approx(20.0)
    assert a.candidates_per_s == pytest.approx(10 / 20)
    assert a.busy_fraction == pytest.approx(15.0 / 20)
    assert b.busy_s == pytest.approx(10.0)
    assert b.busy_fraction == pytest.approx(0.5)
    assert b.evaluators == ("evaluator-b",)
    # per candidate that held the GPU (the gate rejection held nothing): held, and of it measured
    assert a.held_s_mean == pytest.approx(1.5)
    assert a.measured_s_mean == pytest.approx(0.75)
    assert b.held_s_mean == pytest.approx(2.0)
    assert b.measured_s_mean == pytest.approx(1.0)


def test_the_same_gpu_index_on_two_hosts_is_two_gpus() -> None:
    results = [
        _result(1, at=10.0, gpu=0, gpu_s=1.0, evaluator="e1").model_copy(update={"device": _device(0, host="h1")}),
        _result(2, at=12.0, gpu=0, gpu_s=1.0, evaluator="e2").model_copy(update={"device": _device(0, host="h2")}),
    ]
    assert [(u.host, u.gpu) for u in gpu_usage(results)] == [("h1", 0), ("h2", 0)]


def test_unpinned_evaluators_are_reported_one_row_each() -> None:
    results = [
        _result(1, at=10.0, gpu=None, gpu_s=None, evaluator="e1").model_copy(
            update={"device": _device(None, kind=DeviceKind.CPU)}
        ),
        _result(2, at=11.0, gpu=None, gpu_s=None, evaluator="e2").model_copy(
            update={"device": _device(None, kind=DeviceKind.CPU)}
        ),
    ]
    usage = gpu_usage(results)
    assert [(u.gpu, u.evaluators) for u in usage] == [(None, ("e1",)), (None, ("e2",))]
    assert progress_part(usage) == ""  # nothing per GPU to show


def test_the_progress_line_part_shows_each_gpu() -> None:
    assert progress_part(gpu_usage(_stream())) == "GPUs 0:0.500/s 75% 1:0.300/s 50%"


def test_the_report_holds_per_gpu_usage(tmp_path: Path) -> None:
    report = build_report(None, _stream())
    assert [(g.gpu, g.evaluated) for g in report.gpus] == [(0, 10), (1, 6)]
    write_report(report, tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["gpus"][0]["busy_fraction"] == pytest.approx(0.75)
    assert written["gpus"][1]["candidates_per_s"] == pytest.approx(0.3)


def test_live_statistics_give_each_evaluators_rate_over_its_serving_time() -> None:
    a = {"gpu": 0, "gpu_name": "NVIDIA H200", "evaluated": 30, "gpu_busy_s": 45.0, "serving_s": 60.0}
    b = {"gpu": 1, "gpu_name": "NVIDIA H200", "evaluated": 0, "gpu_busy_s": 0.0, "serving_s": None}
    rows: list[tuple[str, str, dict[str, Any]]] = [
        ("evaluator-a", "h", {"extra": a}),
        ("evaluator-b", "h", {"extra": b}),
        ("island-x", "h", {"extra": {}}),
    ]
    usage = live_rows(rows)
    assert [u.evaluators for u in usage] == [("evaluator-a",), ("evaluator-b",)]
    assert usage[0].candidates_per_s == pytest.approx(0.5)
    assert usage[0].busy_fraction == pytest.approx(0.75)
    assert usage[1].candidates_per_s is None  # not serving yet
    table = usage_table(usage)
    assert table[0].split()[:8] == ["HOST", "GPU", "NAME", "DONE", "CAND/S", "BUSY", "HELD/C", "MEAS/C"]
    assert table[1].split()[1:10] == ["0", "NVIDIA", "H200", "30", "0.500", "75%", "-", "-", "evaluator-a"]
    assert table[2].split()[5:7] == ["-", "-"]
    held = usage_table(gpu_usage(_stream()))
    assert held[1].split()[7:9] == ["1.50s", "0.75s"]
