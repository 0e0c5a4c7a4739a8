"""Managing runs through the CLI against a real, long-lived nats-server: ``kfoundry run`` refuses a
run id the server knows in one line (exit 2) and leaves the first run as it was; ``kfoundry runs``
lists, shows and removes runs and lists run directories without a server; ``kfoundry runs stop``
ends a real run from another shell, which still writes its results; ``kfoundry --version``."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from actors.runtime.bus import Bus
from actors.runtime.kv import get_run
from actors.runtime.nats_server import ServerInfo
from schemas import RunEnd, RunSpec, StopReason, subjects
from tests.bus.helpers import register_run
from tests.e2e.helpers import cli_env as _env
from tests.e2e.helpers import kfoundry as _kfoundry

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"

ELEMENTWISE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
"""


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kfoundry: "), lines[0]
    return lines[0]


async def _registered(url: str, run_id: str, *, ended: bool, created_at: float | None = None) -> RunSpec:
    """A run registered as ``kfoundry run`` does, with no controller; ``ended``: its RunEnd stored."""
    bus = await Bus.connect(url, name="test", actor_id=f"test-{run_id}")
    try:
        spec = await register_run(bus, run_id, **({"created_at": created_at} if created_at else {}))
        if ended:
            end = RunEnd(run_id=run_id, reason=StopReason.CANDIDATES, evaluated=5, best_fitness=1.25)
            await bus.publish_durable(subjects.run_end(run_id), end, msg_id=f"end-{run_id}")
        return spec
    finally:
        await bus.close()


async def _stored(url: str, run_id: str) -> tuple[RunSpec, int]:
    bus = await Bus.connect(url, name="test", actor_id=f"test-read-{run_id}")
    try:
        info = await bus.js.stream_info(subjects.run_stream(run_id))
        return await get_run(bus, run_id), int(info.state.messages)
    finally:
        await bus.close()


@pytest.mark.timeout(60)
def test_kfoundry_version_prints_the_installed_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "actors.cli", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kfoundry {version('kernel-foundry')}\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "same_task",
    # ~3 s each on a 2-core host: the default run refuses the same task, the slow run another one too
    [pytest.param(True, id="same-task"), pytest.param(False, id="other-task", marks=pytest.mark.slow)],
)
def test_kfoundry_run_refuses_a_used_run_id_in_one_line_and_leaves_the_first_run_as_it_was(
    same_task: bool, nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    first = asyncio.run(_registered(nats_server.url, run_id, ended=True))
    task = tmp_path / "relu.py"
    task.write_text(first.task.source if same_task else ELEMENTWISE)
    proc = _kfoundry(
        "run", str(task), "--nats", nats_server.url, "--run-id", run_id, "--device", "cpu",
        "--run-dir", str(tmp_path / "run"), env=_env(tmp_path),
    )  # fmt: skip
    line = _one_error_line(proc)
    assert line.startswith(f"kfoundry: run id {run_id} is already used (ended (candidates), registered "), line
    assert f"task relu {first.task.task_id}" in line
    assert ("the same task" in line) is same_task
    assert line.endswith("; choose another --run-id")
    assert proc.stdout == ""
    assert asyncio.run(_stored(nats_server.url, run_id)) == (first, 1)  # its spec and its one message
    assert not (tmp_path / "run").exists()  # the refused run left no directory behind


@pytest.mark.timeout(60)
def test_kfoundry_run_never_writes_over_an_earlier_runs_results(tmp_path: Path) -> None:
    task = tmp_path / "relu.py"
    task.write_text(ELEMENTWISE)
    earlier = tmp_path / "run"
    earlier.mkdir()
    (earlier / "report.json").write_text('{"run_id": "earlier"}')
    proc = _kfoundry("run", str(task), "--device", "cpu", "--run-dir", str(earlier), env=_env(tmp_path))
    assert _one_error_line(proc) == (
        f"kfoundry: {earlier} holds the results of an earlier run (report.json); choose another --run-dir"
    )
    assert (earlier / "report.json").read_text() == '{"run_id": "earlier"}'
    assert sorted(p.name for p in earlier.iterdir()) == ["report.json"]


@pytest.mark.slow  # ~17 s: several runs end to end
@pytest.mark.timeout(120)
def test_runs_lists_newest_first_shows_one_and_removes_an_ended_one_but_not_an_abandoned_one_unforced(
    nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    url, env = nats_server.url, _env(tmp_path)
    old, new = run_id + "old", run_id + "new"
    asyncio.run(_registered(url, old, ended=True, created_at=time.time() - 7200))
    asyncio.run(_registered(url, new, ended=False, created_at=time.time() - 300))

    listing = _kfoundry("runs", "--nats", url, env=env)
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines() if line.startswith(run_id)]
    assert rows == [
        [new, "abandoned", "relu", "auto", "5m", "0/200", "-"],
        [old, "ended", "(candidates)", "relu", "auto", "2h", "5", "1.25x"],
    ], listing.stdout
    assert listing.stdout.splitlines()[1].split() == ["RUN", "STATE", "TASK", "DEVICE", "AGE", "EVALUATED", "BEST"]
    as_json = json.loads(_kfoundry("runs", "--json", "--nats", url, env=env).stdout)
    assert [r["run_id"] for r in as_json if r["run_id"].startswith(run_id)] == [new, old]

    show = _kfoundry("runs", "show", old, "--nats", url, env=env)
    assert show.returncode == 0, show.stderr
    assert show.stdout.splitlines()[0] == f"run {old}: ended (candidates)"
    assert "  evaluated 5" in show.stdout
    assert "  best      1.250x over eager" in show.stdout
    shown = json.loads(_kfoundry("runs", "--nats", url, "show", old, "--json", env=env).stdout)
    assert (shown["spec"]["run_id"], shown["end_reason"]) == (old, "candidates")  # --nats before `show` kept

    stopped = _kfoundry("runs", "stop", old, "--nats", url, env=env)
    assert (stopped.returncode, stopped.stdout) == (0, f"run {old} has already ended: ended (candidates)\n")
    nobody = _kfoundry("runs", "stop", new, "--nats", url, env=env)  # stored, but no controller will act on it
    assert (nobody.returncode, nobody.stdout, len(nobody.stderr.splitlines())) == (1, "", 1), nobody.stderr
    assert nobody.stderr.startswith(f"kfoundry: run {new} has no end recorded and no controller reading its stream")
    refused = _one_error_line(_kfoundry("runs", "rm", new, "--nats", url, env=env))
    assert refused == (
        f"kfoundry: run {new} has no end recorded and no controller reading its stream (its `kfoundry run` is "
        f"gone?); `kfoundry runs rm {new} --force` removes it"
    )
    # `runs report` builds an ended run's report from its stream (here no best: the end names none),
    # and never writes over a report.json
    rebuilt = _kfoundry("runs", "report", old, "--out", str(tmp_path / "old"), "--nats", url, env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (
        rebuilt.stdout
        == f"run {old}: report.json, plots (no best candidate) written to {tmp_path / 'old'}; 0 evaluated\n"
    )
    assert json.loads((tmp_path / "old" / "report.json").read_text())["run_id"] == old
    assert not (tmp_path / "old" / "best_model.py").exists()
    again = _one_error_line(_kfoundry("runs", "report", old, "--out", str(tmp_path / "old"), "--nats", url, env=env))
    assert again == f"kfoundry: {tmp_path / 'old'} holds a report.json already; choose another --out"
    for argv, messages in ((["rm", old], 1), (["rm", new, "--force"], 1)):  # its one message: the stop request
        removed = _kfoundry("runs", *argv, "--nats", url, env=env)
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.startswith(f"removed run {argv[1]}: its registry entry, {messages} stream message(s)")
    after = _kfoundry("runs", "--nats", url, env=env).stdout
    assert run_id not in after
    missing = _one_error_line(_kfoundry("runs", "show", old, "--nats", url, env=env))
    assert missing == f"kfoundry: no run '{old}' on this NATS server (`kfoundry runs` lists the runs it knows)"
    malformed = _one_error_line(_kfoundry("runs", "rm", "a.b", "--nats", url, env=env))
    assert malformed.startswith("kfoundry: 'a.b' is not a valid id"), malformed


@pytest.mark.timeout(120)
def test_runs_dir_lists_run_directories_newest_first_without_a_server(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    now = time.time()
    reports = {
        "a1": {"run_id": "a1", "task_name": "relu", "started_at": now - 600, "end_reason": "candidates",
               "evaluated": 4, "verdict": "not_timed_on_gpu", "best": {"fitness": 0.0061}},
        "b2": {"run_id": "b2", "task_name": "gemm", "started_at": now - 60, "end_reason": "wall_time",
               "evaluated": 9, "verdict": "no_correct_candidate", "best": None},
    }  # fmt: skip
    for name, report in reports.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "report.json").write_text(json.dumps(report | {"status_counts": {}, "plots": {}}))
    (runs / "c3").mkdir()
    (runs / "c3" / "run.log").write_text("")  # a run that wrote no report (yet)
    os.utime(runs / "c3" / "run.log", (now - 3600, now - 3600))
    (runs / "not-a-run").mkdir()
    env = _env(tmp_path)
    proc = _kfoundry("runs", "--dir", str(runs), env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:] if not line.startswith("*")]
    assert rows == [
        ["b2", "ended", "(wall_time)", "gemm", "1m", "9", "-", str(runs / "b2")],
        ["a1", "ended", "(candidates)", "relu", "10m", "4", "0.0061x*", str(runs / "a1")],
        ["c3", "no", "report", "?", "1h", "-", "-", str(runs / "c3")],
    ], proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("* timed on the CPU")
    assert not (tmp_path / "home" / "nats").exists()  # no server was started, or asked for
    missing = _one_error_line(_kfoundry("runs", "--dir", str(tmp_path / "nowhere"), env=env))
    assert missing == f"kfoundry: --dir {tmp_path / 'nowhere'}: not a directory"


@pytest.mark.timeout(120)
def test_runs_on_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{s.getsockname()[1]}"
        proc = _kfoundry("runs", "stop", "r1", "--nats", url, "--connect-timeout", "1.5", env=_env(tmp_path))
    assert _one_error_line(proc).startswith(f"kfoundry: cannot reach NATS at {url} within 1.5 s")


def _runs_json(url: str, env: dict[str, str], run_id: str) -> dict[str, object] | None:
    proc = _kfoundry("runs", "--json", "--nats", url, env=env)
    assert proc.returncode == 0, proc.stderr
    return next((r for r in json.loads(proc.stdout) if r["run_id"] == run_id), None)


@pytest.mark.slow  # a real run on the CPU: a minute on a small shared machine
@pytest.mark.timeout(400)
def test_runs_stop_ends_a_real_run_from_another_shell_within_seconds_and_its_results_are_written(
    nats_server: ServerInfo, run_id: str, tmp_path: Path
) -> None:
    url, env = nats_server.url, _env(tmp_path)
    task, run_dir, log = tmp_path / "scale_relu.py", tmp_path / "run", tmp_path / "run.err"
    task.write_text(ELEMENTWISE)
    with open(log, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "run", str(task), "--nats", url, "--run-id", run_id,
             "--device", "cpu", "--seconds", "300", "--candidates", "200", "--embedder", "hashing",
             "--library-dir", str(tmp_path / "lib"), "--run-dir", str(run_dir)],
            stdout=subprocess.PIPE, stderr=err_file, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        row = None
        while time.monotonic() < deadline and proc.poll() is None:  # running, its first candidate judged
            row = _runs_json(url, env, run_id)
            if row is not None and row["state"] == "running" and int(str(row["evaluated"])) >= 1:
                break
            time.sleep(1.0)
        assert row is not None, log.read_text()[-3000:]
        assert row["state"] == "running", (row, log.read_text()[-3000:])
        refused = _one_error_line(_kfoundry("runs", "rm", run_id, "--nats", url, env=env))
        assert refused == f"kfoundry: run {run_id} is running: stop it first (`kfoundry runs stop {run_id}`)"
        started = time.monotonic()
        stop = _kfoundry("runs", "stop", run_id, "--reason", "test", "--nats", url, env=env, timeout=120)
        took = time.monotonic() - started
        out, _ = proc.communicate(timeout=60)
        gone = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    err = log.read_text()
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.startswith(f"run {run_id} ended (interrupted) after "), stop.stdout
    # 6 s for what is in flight, the last feedback and the islands' drain; loose for a loaded machine
    assert took < 40.0, f"the run ended {took:.1f} s after the stop request"
    assert gone < 60.0, f"the run's process left {gone:.1f} s after the stop request: {err[-2000:]}"
    assert proc.returncode in (0, 1), err[-3000:]  # its verdict's status, not an interrupt's 130
    assert "Traceback" not in err
    assert f"run {run_id} ended (interrupted)" in out
    report = json.loads((run_dir / "report.json").read_text())
    assert (report["run_id"], report["end_reason"]) == (run_id, "interrupted")
    assert report["evaluated"] >= 1
    row = _runs_json(url, env, run_id)
    assert row is not None
    request = row["stop_request"]
    assert isinstance(request, dict)
    assert (request["by"], request["reason"]) == (f"{getpass.getuser()}@{socket.gethostname()}", "test")
    assert row["state_text"] == f"ended (stopped by {request['by']})"
    assert f"run {run_id}: stop requested by {request['by']} (test)" in err  # the run said who stopped it
    # the results again, from the stream alone: the same best kernel, the same count
    rebuilt = _kfoundry("runs", "report", run_id, "--out", str(tmp_path / "again"), "--nats", url, env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert (again["run_id"], again["evaluated"], again["end_reason"]) == (run_id, report["evaluated"], "interrupted")
    assert again["best"]["candidate_id"] == report["best"]["candidate_id"]
    assert (tmp_path / "again" / "best_model.py").read_text() == (run_dir / "best_model.py").read_text()
