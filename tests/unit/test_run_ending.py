"""A run's end is scheduled so that ``kfoundry run`` exits on its budget: the wall budget counts
from the process's start, the run ends its wind-down before the deadline, every wait of the end
is bounded (a little past the deadline; 3.5 s after an interrupt), and a process whose work is
done exits without the interpreter's teardown but with its ``atexit`` hooks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from actors.commands.ending import (
    ACTOR_STOP_S,
    INTERRUPT_END_S,
    INTERRUPT_WAIT_S,
    STOP_PAST_DEADLINE_S,
    WIND_DOWN_S,
    in_flight_wait_s,
    stop_by,
    wind_down_s,
)
from actors.commands.progress import Progress
from actors.runtime.process import process_started_at
from schemas import Budget, DeviceChoice, RunSpec, StopReason, Task

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n"


def _spec(wall_s: float | None = 40.0, device: DeviceChoice = DeviceChoice.CPU) -> RunSpec:
    budget = Budget(wall_s=wall_s, candidates=100)
    return RunSpec(task=Task.from_source("t", SOURCE), budget=budget, device=device, created_at=1000.0)


def test_a_run_ends_its_wind_down_before_its_deadline() -> None:
    spec = _spec(40.0)
    progress = Progress(spec, wind_down_s=wind_down_s(spec))
    assert progress.deadline == 1040.0
    assert progress.ends_at == 1040.0 - WIND_DOWN_S[DeviceChoice.CPU]
    assert progress.stop_reason(now=progress.ends_at - 0.01) is None
    assert progress.stop_reason(now=progress.ends_at) is StopReason.WALL_TIME


def test_the_wind_down_is_the_devices_and_at_most_a_quarter_of_a_short_budget() -> None:
    assert wind_down_s(_spec(40.0, DeviceChoice.CUDA)) == WIND_DOWN_S[DeviceChoice.CUDA]
    assert wind_down_s(_spec(4.0, DeviceChoice.CUDA)) == 1.0
    assert wind_down_s(_spec(None)) == WIND_DOWN_S[DeviceChoice.CPU]
    assert Progress(_spec(None), wind_down_s=1.5).ends_at is None


def test_actors_may_stop_until_a_little_past_the_deadline_after_the_wall_budget() -> None:
    deadline = 1040.0
    now = deadline - 1.5
    assert stop_by(StopReason.WALL_TIME, now=now, deadline=deadline, interrupted_at=None) == (
        deadline + STOP_PAST_DEADLINE_S
    )
    # a run that noticed its deadline late still gets the same short bound from then
    late = deadline + 3.0
    assert stop_by(StopReason.WALL_TIME, now=late, deadline=deadline, interrupted_at=None) == late + 0.5


def test_after_an_interrupt_the_actors_must_have_stopped_within_seconds_of_the_signal() -> None:
    signal_at = 1000.0
    until = stop_by(StopReason.INTERRUPTED, now=signal_at + 2.0, deadline=None, interrupted_at=signal_at)
    assert until == signal_at + INTERRUPT_END_S
    assert INTERRUPT_WAIT_S < INTERRUPT_END_S < 5.0  # room for the results and the exit within 5 s
    # the wall deadline, when nearer, bounds an interrupt's end too
    near = stop_by(StopReason.INTERRUPTED, now=signal_at, deadline=signal_at + 1.0, interrupted_at=signal_at)
    assert near == signal_at + 1.0 + STOP_PAST_DEADLINE_S


def test_other_budgets_give_the_actors_their_drain_but_never_past_the_wall_deadline() -> None:
    assert stop_by(StopReason.CANDIDATES, now=1000.0, deadline=None, interrupted_at=None) == 1000.0 + ACTOR_STOP_S
    assert stop_by(StopReason.CANDIDATES, now=1000.0, deadline=1005.0, interrupted_at=None) == 1005.5


def test_an_interrupt_waits_for_what_is_in_flight_only_briefly() -> None:
    wait = in_flight_wait_s(
        StopReason.INTERRUPTED, now=1000.5, ends_at=None, interrupted_at=1000.0, eval_timeout_s=180.0
    )  # fmt: skip
    assert wait == pytest.approx(INTERRUPT_WAIT_S - 0.5)
    # not past the wall budget's wind-down, nor longer than one evaluation may take
    assert in_flight_wait_s(StopReason.INTERRUPTED, now=1000.0, ends_at=1000.4, interrupted_at=1000.0,
                            eval_timeout_s=180.0) == pytest.approx(0.4)  # fmt: skip
    assert in_flight_wait_s(StopReason.INTERRUPTED, now=1000.0, ends_at=None, interrupted_at=1000.0,
                            eval_timeout_s=1.0) == 1.0  # fmt: skip


def test_the_wall_budget_waits_for_nothing_and_other_budgets_for_feedback_within_the_deadline() -> None:
    assert in_flight_wait_s(StopReason.WALL_TIME, now=1000.0, ends_at=1000.0, interrupted_at=None,
                            eval_timeout_s=180.0) == 0.0  # fmt: skip
    assert in_flight_wait_s(StopReason.CANDIDATES, now=1000.0, ends_at=None, interrupted_at=None,
                            eval_timeout_s=180.0) == 5.0  # fmt: skip
    assert in_flight_wait_s(StopReason.CANDIDATES, now=1000.0, ends_at=1002.0, interrupted_at=None,
                            eval_timeout_s=180.0) == 2.0  # fmt: skip
    assert in_flight_wait_s(StopReason.CANDIDATES, now=1003.0, ends_at=1002.0, interrupted_at=None,
                            eval_timeout_s=180.0) == 0.0  # fmt: skip


def test_the_process_start_counts_the_interpreters_start_up_and_imports() -> None:
    started = process_started_at()
    assert started <= time.time()
    # A child that sleeps before it asks: its start is before the sleep, to within a clock tick.
    code = "import time; time.sleep(0.6); from actors.runtime.process import process_started_at as p; print(p())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    child_started = float(out.stdout)
    assert before - 0.05 <= child_started <= before + 0.5, (before, child_started)  # the import came 0.6 s later


def test_a_prompt_exit_runs_the_atexit_hooks_and_keeps_the_exit_status(tmp_path: Path) -> None:
    marker = tmp_path / "hook-ran"
    script = textwrap.dedent(
        f"""
        import atexit, sys
        from actors.runtime.process import exit_promptly
        atexit.register(lambda: open({str(marker)!r}, "w").write("yes"))
        sys.stdout.write("said before the exit")
        exit_promptly(3)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "said before the exit"  # flushed, though not a whole line
    assert marker.read_text() == "yes"


def test_an_error_said_at_once_bounds_the_exit_though_the_event_loops_teardown_hangs() -> None:
    # ``kfoundry run`` refusing its task: the line is said when the run stops on it, and a thread
    # of the default executor that never returns (what asyncio.run's teardown waits for) cannot
    # hold the process; without ``on_error``'s status the same process is still there.
    script = textwrap.dedent(
        """
        import asyncio, sys, time
        import actors.runtime.process as process
        process.EXIT_GRACE_S = 1.0

        class Refused(Exception):
            pass

        async def main(stop):
            asyncio.get_running_loop().run_in_executor(None, time.sleep, 60)
            raise Refused("task needs too much")

        def said(exc):
            if sys.argv[1] != "say":
                return None
            print(f"kfoundry: {exc}", file=sys.stderr, flush=True)
            return 3

        process.run_async(main, on_error=said)
        """
    )
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", script, "say"], capture_output=True, text=True, cwd=ROOT, check=False, timeout=20
    )
    assert out.returncode == 3, out.stderr
    assert out.stderr.startswith("kfoundry: task needs too much"), out.stderr
    assert time.monotonic() - started < 12.0
    with pytest.raises(subprocess.TimeoutExpired):  # the teardown waits for the thread's 60 s
        subprocess.run([sys.executable, "-c", script, "quiet"], capture_output=True, cwd=ROOT, check=False, timeout=6)
