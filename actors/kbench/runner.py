"""One problem as its own ``kfoundry run`` subprocess, watched from outside and classified.

The run gets its own session (so a crash, or a signal meant for it, stays with it), its output
goes to ``<run_dir>/console.log``, its process tree's memory is sampled while it lives, and the
outcome is read from what ``kfoundry run`` leaves: ``report.json`` and its exit status (0 a
correct candidate faster than eager, 4 correct but not faster, 1 none, 2 a bad task or option, 3 a
task refused as too large for this machine; anything else a crash). A stop request (SIGINT to the
bench) is passed on as SIGINT, then SIGTERM, then SIGKILL to the run's process group if it does not end in time.
Nothing of a run outlives it: the processes of its tree that left its group get a moment to end
with it (the evaluator's janitor cleans up when its evaluator goes) and are then killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from actors.kbench.errors import Interrupted
from actors.kbench.monitor import TreeMonitor, reap
from actors.kbench.problems import Problem
from actors.kbench.results import ProblemResult, ProblemStatus, held_out_summary
from actors.kbench.slots import Slot
from actors.report import RunReport
from actors.runtime.logs import get_logger
from actors.runtime.nats_server import EmbeddedServer

log = get_logger(__name__)

EXIT_NO_CORRECT = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
"""``kfoundry`` exit status for a task the evaluator refuses (too large for this machine)."""
EXIT_NOT_FASTER = 4
"""``kfoundry`` exit status for correct kernels none of which beat eager PyTorch."""
EVALUATOR_ERROR = "evaluator_error"
"""The verdict of a candidate the evaluator could not judge (its own fault, not the candidate's)."""


@dataclass(frozen=True)
class RunOptions:
    """How each problem's ``kfoundry run`` is started."""

    device: str = "auto"
    seconds: float | None = None
    run_args: tuple[str, ...] = ()
    """More ``kfoundry run`` arguments, passed unchanged."""
    eval_timeout_s: float = 180.0
    """The runs' ``--eval-timeout`` (it bounds how long a run may take to drain)."""
    host_memory_share: float | None = None
    """The runs' ``--host-memory-share``: runs side by side plan with a share of the host's memory
    each (``None``: one run at a time, all of it)."""
    grace_s: float = 30.0
    """How long a run gets after SIGINT (then SIGTERM, then 10 s later SIGKILL)."""
    sample_s: float = 1.0
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds={self.seconds!r}: must be positive")
        if self.grace_s <= 0 or self.sample_s <= 0:
            raise ValueError(f"grace_s={self.grace_s!r}, sample_s={self.sample_s!r}: must be positive")

    def hard_limit_s(self) -> float:
        """Wall time after which a run is killed as stuck: its budget, a drain, and start-up."""
        budget = self.seconds if self.seconds is not None else 1800.0
        # a run ends within a minute of its budget (its actors are stopped at once after 20 s of
        # draining), and a GPU run's start (NATS, CUDA, the fork servers) takes well under two
        return budget + 180.0

    def command(self, problem: Problem, run_dir: Path) -> list[str]:
        cmd = [self.python, "-m", "actors.cli", "run", str(problem.path), "--run-dir", str(run_dir)]
        cmd += ["--device", self.device, "--eval-timeout", f"{self.eval_timeout_s:g}"]
        if self.seconds is not None:
            cmd += ["--seconds", f"{self.seconds:g}"]
        if self.host_memory_share is not None:
            cmd += ["--host-memory-share", f"{self.host_memory_share:.6g}"]
        return cmd + list(self.run_args)


def _tail_message(text: str) -> str:
    """The error a failed ``kfoundry`` printed: its ``kfoundry: …`` line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("kfoundry: "):
            return line.removeprefix("kfoundry: ")
    return lines[-1][:500] if lines else "no output"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def classify(
    problem: Problem, run_dir: Path, exit_code: int | None, console: str
) -> tuple[ProblemStatus, str | None, RunReport | None]:
    """The problem's status, its detail, and the run's report (if one was written and is readable)."""
    report: RunReport | None = None
    path = run_dir / "report.json"
    if path.is_file():
        try:
            report = RunReport.model_validate_json(path.read_text())
        except (ValidationError, ValueError) as exc:
            return ProblemStatus.TASK_ERROR, f"unreadable report.json: {str(exc)[:300]}", None
    if report is None:
        if exit_code == EXIT_REFUSED:
            return ProblemStatus.DECLINED, _tail_message(console), None
        return ProblemStatus.TASK_ERROR, f"{_tail_message(console)} ({_exit_text(exit_code)})", None
    if report.best is not None:
        return ProblemStatus.CORRECT, None, report
    unjudged = report.status_counts.get(EVALUATOR_ERROR, 0)
    if report.evaluated > 0 and unjudged == report.evaluated:
        return ProblemStatus.TASK_ERROR, f"the evaluator gave no verdict on any of {unjudged} candidate(s)", report
    if report.evaluated > 0:
        return ProblemStatus.NO_CORRECT, None, report
    declines = [i for i in report.islands if i.last_decline is not None]
    if declines:
        last = max(declines, key=lambda i: i.declines).last_decline
        assert last is not None
        total = sum(i.declines for i in report.islands)
        return ProblemStatus.DECLINED, f"experts declined {total} request(s): {last.reason}: {last.detail}", report
    if exit_code not in (0, EXIT_NO_CORRECT, EXIT_NOT_FASTER):
        return ProblemStatus.TASK_ERROR, f"{_tail_message(console)} ({_exit_text(exit_code)})", report
    return ProblemStatus.NO_CORRECT, f"no candidate was evaluated (run ended: {report.end_reason})", report


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return


def _end(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the run's process group until it has exited."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            log.warning("run did not end", pid=proc.pid, signal=sig.name, waited_s=wait_s)
            continue
        break
    # Whatever of the group outlived its leader goes too.
    _signal_group(proc, signal.SIGKILL)


REAP_WAIT_S = 15.0
"""How long the processes of a run that outlive it get to end on their own before they are killed."""


def reap_run(monitor: TreeMonitor, name: str, env: dict[str, str] | None) -> None:
    """End what outlived a run: its processes that left its group (:func:`reap`), and the embedded
    NATS server if the run started it and no client is left on it."""
    members = monitor.members()
    killed = reap(members, REAP_WAIT_S)
    if killed:
        log.warning("killed processes that outlived their run", problem=name, processes=killed)
    # The embedded NATS server is shared by the machine's kfoundry commands: one the run started
    # is stopped as the run itself would on leaving (a run stopped by signal may not have), and
    # only when no client is connected any more.
    home = (os.environ if env is None else env).get("KFOUNDRY_HOME")
    server = EmbeddedServer(Path(home) if home else None)
    info = server.adopt()
    if info is not None and info.pid in {p.pid for p in members} and server.release(grace_s=REAP_WAIT_S):
        log.info("stopped the embedded NATS server the run left", problem=name, pid=info.pid)


def run_problem(
    problem: Problem,
    out_dir: Path,
    opts: RunOptions,
    stop: threading.Event,
    *,
    env: dict[str, str] | None = None,
    slot: Slot | None = None,
) -> ProblemResult:
    """Run ``problem`` with ``kfoundry run`` (on ``slot``'s GPUs if it names some) and classify the
    outcome; raises :class:`Interrupted` if ``stop`` is set before it ends (the run is stopped first)."""
    slot = slot or Slot()
    rel = Path("runs") / f"level{problem.level}_{problem.number:03d}"
    run_dir = out_dir / rel
    if run_dir.exists():  # left by an interrupted bench: start clean so no stale report is read
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    console_path = run_dir / "console.log"
    gpu = opts.device != "cpu"
    started = time.monotonic()
    killed_stuck = False
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(
            opts.command(problem, run_dir.resolve()),
            stdout=console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=slot.environ(os.environ if env is None else env),
        )
        uuids = frozenset(g.uuid for g in slot.gpus) or None
        with TreeMonitor(proc.pid, gpu=gpu, interval_s=opts.sample_s, gpu_uuids=uuids) as monitor:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if stop.is_set():
                    monitor.remember()
                    _end(proc, opts.grace_s)
                    reap_run(monitor, problem.name, env)
                    raise Interrupted(problem.name)
                if time.monotonic() - started > opts.hard_limit_s():
                    killed_stuck = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGUSR1)  # the run dumps its threads' stacks to its console
                    time.sleep(2.0)
                    monitor.remember()
                    _end(proc, opts.grace_s)
                    break
            _signal_group(proc, signal.SIGKILL)  # nothing of the run outlives it
            reap_run(monitor, problem.name, env)
            monitor.sample()
        peaks = monitor.peaks()
    wall = time.monotonic() - started
    text = console_path.read_text(errors="replace")
    status, detail, report = classify(problem, run_dir, proc.returncode, text[-20000:])
    if killed_stuck:
        status = ProblemStatus.TASK_ERROR
        detail = f"kfoundry run did not end within {opts.hard_limit_s():.0f} s and was stopped"
    best = report.best if report is not None else None
    return ProblemResult(
        level=problem.level,
        number=problem.number,
        name=problem.name,
        status=status,
        detail=detail,
        speedup_vs_eager=best.speedup_vs_eager if best is not None else None,
        speedup_vs_compiled=best.speedup_vs_compiled if best is not None else None,
        compiled_derived=best is not None and best.compiled_derived is not None,
        sol_fraction=best.sol_fraction if best is not None else None,
        precision=best.precision if best is not None else None,
        err_vs_fp64=best.err_vs_fp64 if best is not None else None,
        ref_default_err_vs_fp64=best.ref_default_err_vs_fp64 if best is not None else None,
        held_out=held_out_summary(best) if best is not None else None,
        held_out_all_correct=(
            all(s.outcome == "correct" for s in best.held_out) if best is not None and best.held_out else None
        ),
        evaluated=report.evaluated if report is not None else None,
        first_correct_s=report.first_correct_s if report is not None else None,
        first_verdict=report.first_verdict.sentence() if report is not None and report.first_verdict else None,
        peak_host_bytes=peaks.host_bytes,
        peak_gpu_bytes=peaks.gpu_bytes,
        peak_gpu_device_bytes=peaks.gpu_device_bytes,
        wall_s=wall,
        exit_code=proc.returncode,
        end_reason=report.end_reason.value if report is not None and report.end_reason is not None else None,
        status_counts=report.status_counts if report is not None else {},
        run_dir=str(rel),
        gpus=tuple(g.uuid for g in slot.gpus),
    )


def describe(result: ProblemResult) -> str:
    """One progress line for a finished problem."""
    bits = [result.status.value]
    if result.speedup_vs_eager is not None:
        bits.append(f"{result.speedup_vs_eager:.3g}x vs eager")
    if result.speedup_vs_compiled is not None:
        bits.append(f"{result.speedup_vs_compiled:.3g}x vs compile")
    if result.evaluated is not None:
        bits.append(f"{result.evaluated} evaluated")
    if result.detail:
        bits.append(" ".join(result.detail.split())[:200])
    return ", ".join(bits)
