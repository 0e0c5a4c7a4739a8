"""Operating the CLI: an unreachable NATS server is one line within a bounded time, actors wait
for their run and retry NATS until stopped, a taken metrics port is one line, and interrupts
say what they wait for (a second one stops at once, exit status 130)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import torch

from actors.commands.cli import main as cli_main
from actors.runtime.bus import Bus
from actors.runtime.nats_server import ServerInfo
from schemas import RunEnd, StopReason, subjects
from tests.bus.helpers import RestartableServer, register_run, wait_up
from tests.e2e.helpers import cli_env as _env
from tests.e2e.helpers import kfoundry as _kfoundry
from tests.e2e.helpers import popen as _popen

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback port where nothing listens (held bound, never listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def logging_kept() -> Iterator[None]:
    """The logging set-up put back after the test: a command run in process sets up the process's
    logging (structlog, the root logger's handlers and level; an actor's before it checks its
    options), which later tests' loggers would otherwise write through."""
    config = structlog.get_config()
    root, nats_logger = logging.getLogger(), logging.getLogger("nats")
    handlers, level, nats_level = root.handlers[:], root.level, nats_logger.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)
    nats_logger.setLevel(nats_level)


_CONNECTING_COMMANDS = [["status"], ["tap"], ["drain", "island-x"], ["expert", "show", "template"], ["dlq"]]
"""One-shot commands that connect to NATS (each through ``actors.commands.cli._connect``)."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "command",
    [  # started as a process: ~3 s each; every command in process below
        pytest.param(c, id=c[0], marks=() if c[0] == "status" else pytest.mark.slow) for c in _CONNECTING_COMMANDS
    ],
)
def test_unreachable_nats_is_one_line_within_the_connect_timeout(
    command: list[str], dead_url: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    proc = _kfoundry(*command, "--nats", dead_url, "--connect-timeout", "1.5", env=_env(tmp_path))
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"kfoundry: cannot reach NATS at {dead_url} within 1.5 s"), lines[0]
    assert took < 1.5 + 10, f"took {took:.1f} s"  # interpreter start-up on a loaded machine included


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("logging_kept")
@pytest.mark.parametrize("command", [pytest.param(c, id=c[0]) for c in _CONNECTING_COMMANDS])
def test_unreachable_nats_is_one_line_within_the_connect_timeout_in_process(
    command: list[str],
    dead_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same from ``kfoundry``'s ``main`` in this process, each command within its 0.5 s."""
    monkeypatch.setenv("KFOUNDRY_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NATS_URL", raising=False)
    started = time.monotonic()
    code = cli_main([*command, "--nats", dead_url, "--connect-timeout", "0.5"])
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kfoundry: cannot reach NATS at {dead_url} within 0.5 s"), lines[0]
    assert took < 0.5 + 5, f"took {took:.1f} s"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("sig", "code"),
    # ~3 s each on a 2-core host: the default run stops it with SIGINT, the slow run with SIGTERM too
    [pytest.param(signal.SIGTERM, 0, marks=pytest.mark.slow), (signal.SIGINT, 130)],
)
def test_an_actor_retries_an_unreachable_nats_one_line_per_attempt_and_stops_at_once(
    sig: signal.Signals, code: int, dead_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "actor.log"
    with open(log, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "actor", "island", "--run", "r1", "--island", "i0",
             "--nats", dead_url],
            stdout=subprocess.DEVNULL, stderr=err_file, env=_env(tmp_path), cwd=ROOT,
        )  # fmt: skip

    def attempts() -> list[dict[str, str]]:
        return [json.loads(line) for line in log.read_text().splitlines() if "connection attempt failed" in line]

    try:
        deadline = time.monotonic() + 60
        while len(attempts()) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(attempts()) >= 3, log.read_text()  # it keeps trying, one line per attempt
        proc.send_signal(sig)
        started = time.monotonic()
        proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:  # one that ignored the signal is not left behind
            proc.kill()
            proc.wait(timeout=10)
    err = log.read_text()
    assert proc.returncode == code, err
    assert took < 3.0, f"stopped {took:.1f} s after {sig.name}"
    assert "Traceback" not in err
    assert all(a["url"] == dead_url for a in attempts())


@pytest.mark.timeout(120)
def test_an_actor_without_its_run_fails_in_one_line_when_it_may_not_wait(
    nats_server: ServerInfo, tmp_path: Path
) -> None:
    proc = _kfoundry(
        "actor", "evaluator", "--run", "nosuchrun", "--runner", "noop", "--wait-for-run", "0",
        "--nats", nats_server.url, env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kfoundry: no run 'nosuchrun' was registered"), proc.stderr


@pytest.mark.slow  # ~4 s on a 2-core host: waits out --wait-for-run 3 (the refusal without a wait stays)
@pytest.mark.timeout(120)
def test_an_actor_gives_up_waiting_for_its_run_after_wait_for_run(nats_server: ServerInfo, tmp_path: Path) -> None:
    started = time.monotonic()
    proc = _kfoundry(
        "actor", "island", "--run", "stillnot", "--island", "i0", "--wait-for-run", "3", "--nats", nats_server.url,
        env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started >= 3.0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("kfoundry: no run 'stillnot' was registered on this NATS server within 3 s")
    waiting = [line for line in lines if "waiting for the run to be registered" in line]
    assert len(waiting) == 1, proc.stderr


@pytest.mark.timeout(180)
async def test_an_actor_started_before_its_run_joins_when_it_is_registered(
    nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    proc = _popen(
        "actor", "evaluator", "--run", run_id, "--runner", "noop", "--id", f"ev-{run_id}", "--nats", nats_server.url,
        env=_env(tmp_path),
    )  # fmt: skip
    try:
        bus = await Bus.connect(nats_server.url, name="test", actor_id="test-wait")
        try:
            await asyncio.sleep(4.0)  # the actor is up and waiting
            assert proc.poll() is None
            await register_run(bus, run_id)
            await wait_up(bus, f"ev-{run_id}")  # it joined the run
            await bus.publish_durable(
                subjects.run_end(run_id), RunEnd(run_id=run_id, reason=StopReason.CANDIDATES, evaluated=0), msg_id="end"
            )
        finally:
            await bus.close()
        # It heard the RunEnd and left cleanly.
        _, err = await asyncio.to_thread(proc.communicate, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line).get("event", "") for line in err.splitlines() if line.startswith("{")]
    assert events.count("waiting for the run to be registered") == 1
    assert "actor running" in events


@pytest.mark.timeout(120)
def test_a_taken_metrics_port_is_one_line(nats_server: ServerInfo, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _kfoundry(
            "actor", "expert", "--name", "template", "--metrics-port", str(port), "--nats", nats_server.url,
            env=_env(tmp_path),
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"kfoundry: --metrics-port {port}: cannot serve metrics")


async def _run_end(url: str, run_id: str) -> RunEnd:
    bus = await Bus.connect(url, name="test-end", actor_id="test-end")
    try:
        msg = await bus.js.get_last_msg(subjects.run_stream(run_id), subjects.run_end(run_id))
        return RunEnd.model_validate_json(msg.data or b"")
    finally:
        await bus.close()


async def _issued(url: str, run_id: str) -> int:
    bus = await Bus.connect(url, name="test-issued", actor_id="test-issued")
    try:
        info = await bus.js.stream_info(subjects.run_stream(run_id), subjects_filter=subjects.candidates(run_id))
        return sum((info.state.subjects or {}).values())
    except Exception:  # noqa: BLE001 - the stream may not exist yet
        return 0
    finally:
        await bus.close()


def _start_slow_run(nats_server: ServerInfo, run_id: str, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A CPU run whose every evaluation takes 120 s (noop runner), once its first candidate is out;
    its stderr goes to the returned file, its results to ``tmp_path / "run"``."""
    seed = tmp_path / "seed.py"
    seed.write_text("class ModelNew: ...\n")
    log = tmp_path / "run.err"
    with open(log, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "run", str(ROOT / "examples" / "quickstart.py"),
             "--nats", nats_server.url, "--run-id", run_id, "--run-dir", str(tmp_path / "run"), "--device", "cpu",
             "--runner", "noop", "--noop-delay", "120", "--eval-timeout", "200", "--seed-candidate", str(seed),
             "--embedder", "hashing", "--library-dir", str(tmp_path / "lib"), "--candidates", "50",
             "--seconds", "280"],
            stdout=subprocess.DEVNULL, stderr=err_file, text=True, env=_env(tmp_path), cwd=ROOT,
        )  # fmt: skip
    deadline = time.monotonic() + 200
    while (issued := asyncio.run(_issued(nats_server.url, run_id))) < 1 and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        time.sleep(0.5)
    if issued < 1:
        proc.kill()
        raise AssertionError(f"no candidate issued in 200 s: {log.read_text()[-2000:]}")
    return proc, log


@pytest.mark.timeout(300)
def test_interrupts_say_what_they_wait_for_and_a_second_one_stops_at_once(
    nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    proc, log = _start_slow_run(nats_server, run_id, tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while "Ctrl-C again to stop at once" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None  # it waits (1 s) for the evaluations in flight (120 s each)
        waiting = next(line for line in log.read_text().splitlines() if line.startswith("interrupted:"))
        assert "candidate(s) in flight" in waiting
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        proc.wait(30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    assert proc.returncode == 130, err
    # Without it the run would wait its 1 s, then drain and write its results. The bound is loose for
    # a loaded shared machine; seen: 0.4 s from the signal's handling to every actor gone.
    assert took < 15.0, f"stopped {took:.1f} s after the second Ctrl-C"
    assert "Traceback" not in err
    assert "stopped at once" in err
    end = asyncio.run(_run_end(nats_server.url, run_id))
    assert end.reason == "interrupted"
    assert end.cancelled  # recorded: what was in flight


@pytest.mark.slow  # a real run on the CPU: ~12 s; CI runs it in the slow suite
@pytest.mark.timeout(300)
def test_one_interrupt_stops_the_run_within_seconds_and_still_writes_its_results(
    nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    """On SIGINT/SIGTERM the run stops within 5 s and writes its results, even while an evaluation
    that would take minutes is in flight (it is cancelled, and recorded as such)."""
    proc, log = _start_slow_run(nats_server, run_id, tmp_path)
    run_dir = tmp_path / "run"
    try:
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        proc.wait(60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    # 1 s for what is in flight, then the drain, bounded at 3.5 s after the signal, and the results
    assert took <= 5.0, f"stopped {took:.1f} s after SIGTERM: {err[-2000:]}"
    assert "Traceback" not in err
    assert "stopped at once" not in err
    assert (run_dir / "report.json").exists(), err[-2000:]
    end = asyncio.run(_run_end(nats_server.url, run_id))
    assert end.reason == "interrupted"
    assert end.cancelled  # the 120 s evaluation was not waited for: recorded as cancelled


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps the tap's bad history requests
@pytest.mark.timeout(120)
def test_a_tap_that_loses_its_server_says_so_in_one_line(tmp_path: Path) -> None:
    server = RestartableServer(tmp_path / "js")
    server.start()
    try:
        proc = _popen("tap", "--nats", server.url, "--connect-timeout", "2", env=_env(tmp_path))
        time.sleep(4.0)  # connected and tapping
        assert proc.poll() is None
        server.stop()
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        server.stop()
        if proc.poll() is None:  # one that never noticed the loss is not left behind
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("# tapping")]
    assert lines == [f"kfoundry: lost the connection to NATS at {server.url} (gave up after 2 s)"], err
    assert took < 2 + 10, f"took {took:.1f} s"


_CONFIGURATION_ERRORS = {
    "invalid-option": (
        ["run", "examples/quickstart.py", "--islands", "0", "--device", "cpu"],
        "kfoundry: invalid RunSpec islands:",
    ),
    "missing-task": (["run", "no_such_task.py"], "kfoundry: task file not found: no_such_task.py"),
    "negative-wait": (
        ["actor", "island", "--run", "r", "--island", "i0", "--wait-for-run", "-1"],
        "kfoundry: --wait-for-run must",
    ),
    "zero-candidates": (
        ["run", "examples/quickstart.py", "--candidates", "0"],
        "kfoundry: --candidates must be > 0, got 0",
    ),
    "zero-seconds": (["run", "examples/quickstart.py", "--seconds", "0"], "kfoundry: --seconds must be > 0, got 0"),
    "negative-tokens": (["run", "examples/quickstart.py", "--tokens", "-3"], "kfoundry: --tokens must be > 0, got -3"),
    "foreign-flags": (
        ["actor", "expert", "--device", "cuda", "--island", "i0", "--nats", "nats://127.0.0.1:1"],
        "kfoundry: --device, --island: not an option of expert actors (read by evaluator and island actors)",
    ),
    "foreign-flag": (
        ["actor", "curator", "--per-request", "4", "--nats", "nats://127.0.0.1:1"],
        "kfoundry: --per-request: not an option of curator actors (read by island actors)",
    ),
    "unknown-gpu": (
        ["expert", "set", "t", "--kind", "template", "--target-gpu", "Z80", "--nats", "nats://127.0.0.1:1"],
        "kfoundry: --target-gpu 'Z80': not a GPU the template expert knows (known: ",
    ),
}
"""Command lines ``kfoundry`` refuses before it starts anything, and the line it says of each."""

_STARTED_BY_DEFAULT = {"invalid-option", "foreign-flags"}
"""The configuration errors the default run starts ``kfoundry`` on: a run's and an actor's (~2 s
each; the slow run starts it on every one). Every one is checked in process too."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "line"),
    [
        pytest.param(*error, id=name, marks=() if name in _STARTED_BY_DEFAULT else pytest.mark.slow)
        for name, error in _CONFIGURATION_ERRORS.items()
    ],
)
def test_a_configuration_error_is_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    proc = _kfoundry(*args, env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(line), proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("logging_kept")
@pytest.mark.parametrize(
    ("args", "line"), [pytest.param(*error, id=name) for name, error in _CONFIGURATION_ERRORS.items()]
)
def test_a_configuration_error_is_one_line_in_process(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same refusals from ``kfoundry``'s ``main`` in this process, as the command sees them."""
    monkeypatch.setenv("KFOUNDRY_HOME", str(tmp_path / "home"))  # as ``_env`` gives the command
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.chdir(ROOT)
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()], err
    assert err.startswith(line), err


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine whose torch sees a GPU")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    """``--device cuda`` where torch sees no CUDA device: one line before anything starts (it was
    the evaluator's 59-line traceback and exit status 1, "no correct candidate")."""
    proc = _kfoundry("run", "examples/quickstart.py", "--device", "cuda", env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("kfoundry: --device cuda: torch here sees no CUDA device"), proc.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [["status"], ["dlq"]])
def test_output_into_a_closed_pipe_ends_quietly(args: list[str], nats_server: ServerInfo, tmp_path: Path) -> None:
    """``kfoundry status | head``: the reader went away; no BrokenPipeError traceback, status 0."""
    read, write = os.pipe()
    os.close(read)  # every write finds the pipe closed
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "actors.cli", *args, "--nats", nats_server.url],
            stdout=write, stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=ROOT, timeout=100,
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipe" not in proc.stderr, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # real actor processes or a real run: kept out of the default suite's 15 minutes
@pytest.mark.timeout(240)
def test_a_run_serves_its_actors_metrics_and_a_taken_port_is_one_line_before_anything_starts(
    nats_server: ServerInfo, tmp_path: Path
) -> None:
    """``kfoundry run --metrics-port``: the single-process run can be scraped (its islands,
    evaluator, experts, ...); a taken port is refused in one line before any server or actor starts."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = _kfoundry(
            "run", "examples/quickstart.py", "--device", "cpu", "--metrics-port", str(port),
            "--run-dir", str(tmp_path / "refused"), env=_env(tmp_path),
        )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()], refused.stderr
    assert refused.stderr.startswith(f"kfoundry: --metrics-port {port}: cannot serve metrics"), refused.stderr
    assert not (tmp_path / "refused").exists()

    port = _free_port()
    proc = _popen(
        "run", "examples/quickstart.py", "--device", "cpu", "--seconds", "120", "--metrics-port", str(port),
        "--nats", nats_server.url, "--run-dir", str(tmp_path / "run"), env=_env(tmp_path),
    )  # fmt: skip
    kinds: set[str] = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not {"island", "evaluator", "expert"} <= kinds:
            time.sleep(1.0)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                    text = reply.read().decode()
            except OSError:
                continue
            kinds = {
                line.split('kind="', 1)[1].split('"', 1)[0]
                for line in text.splitlines()
                if line.startswith("kfoundry_messages_received_total{")
            }
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert {"island", "evaluator", "expert"} <= kinds, kinds


@pytest.mark.slow  # real actor processes or a real run: kept out of the default suite's 15 minutes
@pytest.mark.timeout(120)
def test_status_names_each_expert_and_island(nats_server: ServerInfo, tmp_path: Path) -> None:
    """``kfoundry status`` shows an expert's configuration name (it had no column for it)."""
    expert = _popen("actor", "expert", "--name", "template", "--nats", nats_server.url, env=_env(tmp_path))
    try:
        rows: list[list[str]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not rows:
            time.sleep(1.0)
            proc = _kfoundry("status", "--nats", nats_server.url, "--wait", "1", env=_env(tmp_path))
            assert proc.returncode == 0, proc.stderr
            lines = proc.stdout.splitlines()
            header = next(line for line in lines if line.startswith("KIND"))
            assert " NAME " in header, header
            rows = [line.split() for line in lines if line.startswith("expert ")]
    finally:
        expert.send_signal(signal.SIGTERM)
        expert.communicate(timeout=60)
    assert rows, "the expert never showed"
    name_column = header.split().index("NAME")
    assert any(row[name_column] == "template" for row in rows), rows  # the server is shared: others may show


async def _finished_run(url: str, run_id: str) -> list[str]:
    """A run with two candidates and its end in its stream, as a finished run leaves it."""
    from tests.bus.helpers import candidate

    bus = await Bus.connect(url, name="test-history", actor_id="test-history")
    try:
        run = await register_run(bus, run_id)
        ids = []
        for i in range(2):
            cand = candidate(run, i)
            await bus.publish_durable(
                subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id
            )
            ids.append(cand.candidate_id)
        end = RunEnd(run_id=run_id, reason=StopReason.CANDIDATES, evaluated=2)
        await bus.publish_durable(subjects.run_end(run_id), end, msg_id=f"end-{run_id}")
        return ids
    finally:
        await bus.close()


@pytest.mark.slow  # real actor processes or a real run: kept out of the default suite's 15 minutes
@pytest.mark.timeout(120)
def test_tap_replays_a_finished_runs_history_and_ends_with_it(nats_server: ServerInfo, tmp_path: Path) -> None:
    """``kfoundry tap --run R --all``: a finished run's history from its stream (tap showed live
    messages only), in order, ending at its ``RunEnd``; ``--since`` the same from a time."""
    run_id = "hist" + os.urandom(4).hex()
    ids = asyncio.run(_finished_run(nats_server.url, run_id))
    for when in (["--all"], ["--since", "1h"]):
        proc = _kfoundry("tap", "--run", run_id, *when, "--nats", nats_server.url, env=_env(tmp_path), timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert [line.split()[2] for line in lines] == ["candidate", "candidate", "run_end"], lines
        assert all(cid in proc.stdout for cid in ids), lines
    late = _kfoundry("tap", "--run", run_id, "--since", "1h", "--type", "run_end", "--nats", nats_server.url,
                     env=_env(tmp_path), timeout=60)  # fmt: skip
    assert [line.split()[2] for line in late.stdout.splitlines()] == ["run_end"], late.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["tap", "--all"], "kfoundry: --all and --since replay one run's stream: give --run RUN"),
        (["tap", "--run", "r1", "--since", "yesterday"], "kfoundry: --since 'yesterday': give a duration"),
        (["tap", "--run", "nosuchrun", "--all"], "kfoundry: --run nosuchrun: this server has no stream of that run"),
    ],
    ids=["no-run", "bad-since", "unknown-run"],
)
def test_a_bad_history_request_is_one_line(args: list[str], line: str, nats_server: ServerInfo, tmp_path: Path) -> None:
    proc = _kfoundry(*args, "--nats", nats_server.url, env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr


@pytest.mark.slow  # real actor processes or a real run: kept out of the default suite's 15 minutes
@pytest.mark.timeout(180)
def test_expert_configurations_are_listed_with_their_keys_state_and_removed(
    nats_server: ServerInfo, tmp_path: Path
) -> None:
    """``kfoundry expert list`` shows every stored configuration and whether its key variable is
    set in this shell (a stale one whose key is unset made a bare ``--experts`` fail every time);
    ``expert rm`` removes one, refused while a live expert serves it."""
    env = _env(tmp_path)
    env.pop("KF_TEST_UNSET_KEY", None)
    stale, tpl = f"stale{os.urandom(3).hex()}", f"tpl{os.urandom(3).hex()}"  # the server is shared
    url = ["--nats", nats_server.url]
    stored = _kfoundry(
        "expert", "set", stale, "--kind", "llm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m1",
        "--api-key-env", "KF_TEST_UNSET_KEY", *url, env=env,
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    assert _kfoundry("expert", "set", tpl, "--kind", "template", *url, env=env).returncode == 0
    listed = _kfoundry("expert", "list", *url, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert {stale, tpl} <= set(rows), listed.stdout
    assert "key $KF_TEST_UNSET_KEY (NOT set in this shell)" in rows[stale]
    as_json = json.loads(_kfoundry("expert", "list", "--json", *url, env=env).stdout)
    assert {stale, tpl} <= {c["name"] for c in as_json}
    assert all("api_key" not in c for c in as_json)

    expert = _popen("actor", "expert", "--name", tpl, *url, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until it serves (it announces its configuration's name)
            time.sleep(1.0)
            status = _kfoundry("status", "--wait", "1", *url, env=env).stdout
            if any(line.startswith("expert ") and f" {tpl} " in line for line in status.splitlines()):
                break
        refused = _kfoundry("expert", "rm", tpl, *url, env=env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(f"kfoundry: expert '{tpl}' is served by expert-"), refused.stderr
    finally:
        expert.send_signal(signal.SIGTERM)
        expert.communicate(timeout=60)

    removed = _kfoundry("expert", "rm", stale, *url, env=env)
    assert removed.returncode == 0, removed.stderr
    left = {line.split()[0] for line in _kfoundry("expert", "list", *url, env=env).stdout.splitlines()[1:]}
    assert tpl in left
    assert stale not in left
    again = _kfoundry("expert", "rm", stale, *url, env=env)
    assert again.returncode == 2
    assert again.stderr.strip() == (
        f"kfoundry: no expert configuration stored under '{stale}' (kfoundry expert list shows them)"
    )
