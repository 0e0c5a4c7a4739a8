"""End to end through the CLI on the CPU: ``kfoundry run`` with the embedded server, then the
result checked by ``kfoundry eval``; and a run whose actors are separate OS processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.nats_server import ServerInfo
from tests.bus.helpers import spawn_actor, stop_process

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _kfoundry(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.timeout(400)
def test_kfoundry_run_on_cpu_leaves_a_correct_standalone_model(tmp_path: Path) -> None:
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    env.pop("NATS_URL", None)
    run_dir = tmp_path / "run"
    proc = _kfoundry(
        "run", str(QUICKSTART), "--device", "cpu", "--candidates", "4", "--islands", "2", "--seconds", "300",
        "--embedder", "hashing", "--run-dir", str(run_dir), "--run-id", "e2ecpu",
        env=env, timeout=380,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "run e2ecpu ended" in proc.stdout
    assert "evaluated" in proc.stderr  # the progress line
    report = json.loads((run_dir / "report.json").read_text())
    assert report["evaluated"] >= 4
    assert report["best"] is not None
    for name in ("best_model.py", "fitness.png", "archive.png", "credit.png", "run.log"):
        assert (run_dir / name).stat().st_size > 0, name
    log_lines = [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines() if line.startswith("{")]
    assert any(line.get("event") == "feedback" and line.get("run") == "e2ecpu" for line in log_lines)
    # The embedded server left with the last command that used it.
    assert not (tmp_path / "home" / "nats" / "server.json").exists()
    # The best model stands alone and is judged correct by the honest evaluator.
    check = _kfoundry(
        "eval", str(QUICKSTART), str(run_dir / "best_model.py"), "--device", "cpu", "--json", env=env, timeout=300
    )
    assert check.returncode == 0, check.stderr[-3000:]
    verdict = json.loads(check.stdout)
    assert verdict["status"] == "correct", verdict["summary"]


@pytest.mark.timeout(400)
def test_actors_started_as_separate_processes_join_one_run(nats_server: ServerInfo, tmp_path: Path) -> None:
    url = nats_server.url
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    run_id = f"proc{int(time.time()) % 100000}"
    controller = subprocess.Popen(
        [
            sys.executable, "-m", "actors.cli", "run", str(QUICKSTART), "--nats", url, "--no-local-actors",
            "--run-id", run_id, "--device", "cpu", "--candidates", "3", "--islands", "1", "--seconds", "300",
            "--run-dir", str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    tap = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "tap", "--run", run_id, "--nats", url, "--count", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    common = ["--nats", url]
    actors = []
    try:
        time.sleep(3)  # the controller registers the run (its spec in KV) first
        actors = [
            spawn_actor("curator", "--embedder", "hashing", "--library-dir", str(tmp_path / "lib"), *common,
                        log=tmp_path / "curator.log"),
            spawn_actor("expert", "--name", "template", *common, log=tmp_path / "expert.log"),
            spawn_actor("evaluator", "--run", run_id, "--device", "cpu", "--spares", "1", *common,
                        log=tmp_path / "evaluator.log"),
            spawn_actor("diagnoser", "--run", run_id, *common, log=tmp_path / "diagnoser.log"),
            spawn_actor("island", "--run", run_id, "--island", "i0", *common, log=tmp_path / "island.log"),
        ]  # fmt: skip
        # Every kind must show up in ``kfoundry status`` at some point (on a loaded 2-core machine
        # the actors take a while to start, and the run's own actors leave once it ends).
        needed = {"island", "evaluator", "diagnoser", "expert", "curator"}
        seen: set[str] = set()
        status = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not needed <= seen:
            out = _kfoundry("status", "--run", run_id, "--nats", url, "--json", env=env, timeout=60)
            snapshot = json.loads(out.stdout)
            seen |= {a["metadata"]["kind"] for a in snapshot["actors"]}
            if any(a["metadata"].get("run_id") == run_id for a in snapshot["actors"]):
                status = snapshot
            time.sleep(1)
        assert needed <= seen, f"not every actor showed up in kfoundry status: saw {sorted(seen)}"
        assert status is not None
        stdout, stderr = controller.communicate(timeout=330)
        assert controller.returncode == 0, stdout + stderr[-3000:]
        assert f"run {run_id} ended" in stdout
        # The island, evaluator and diagnoser left on the RunEnd; experts and the curator stay.
        for proc in actors[2:]:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in actors:
            stop_process(proc)
        if controller.poll() is None:
            controller.kill()
        tap.terminate()
    lines = tap.communicate(timeout=30)[0].splitlines()
    types = {line.split()[2] for line in lines if len(line.split()) > 2}
    assert {"candidate", "eval_result", "feedback", "island_status", "run_end"} <= types, types
    assert any(a["metadata"].get("run_id") == run_id for a in status["actors"])
