"""The line ``kfoundry run`` ends with: a CPU run says its timings are not speedups."""

from __future__ import annotations

from pathlib import Path

from actors.controller import RunOutcome
from schemas import DeviceChoice, StopReason


def _outcome(device: DeviceChoice) -> RunOutcome:
    return RunOutcome(
        run_id="r1",
        reason=StopReason.CANDIDATES,
        evaluated=4,
        statuses={"correct": 4},
        best_fitness=0.014,
        best_candidate_id="c1",
        run_dir=Path("runs/r1"),
        device=device,
    )


def test_cpu_run_summary_says_interpreter_timings_are_not_speedups() -> None:
    text = _outcome(DeviceChoice.CPU).summary(12.0)
    assert "best 0.014x over eager" in text
    assert "not speedups" in text
    assert "GPU" in text


def test_gpu_run_summary_has_no_cpu_caveat() -> None:
    text = _outcome(DeviceChoice.CUDA).summary(12.0)
    assert "best 0.014x over eager" in text
    assert "not speedups" not in text
