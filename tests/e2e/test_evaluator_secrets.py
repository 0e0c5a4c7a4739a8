"""No secret in the evaluator's process tree: ``kfoundry run`` with an API key in its environment
runs its evaluator as a process of its own, whose environment (and that of every fork server,
janitor and worker under it) holds no key, while the run's own process keeps it for the experts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from actors.kinds.evaluator_process import holds_secrets, scrubbed

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:
        return None


def test_only_secret_variables_are_scrubbed_and_the_url_is_passed_in_the_environment() -> None:
    env = {"OPENAI_API_KEY": "k", "HF_TOKEN": "t", "NATS_PASSWORD": "p", "NATS_URL": "nats://old", "PATH": "/bin"}
    out = scrubbed(env, "nats://u:p@host:4222")
    assert out["PATH"] == "/bin"
    assert out["NATS_URL"] == "nats://u:p@host:4222"
    assert not {"OPENAI_API_KEY", "HF_TOKEN", "NATS_PASSWORD"} & set(out)
    assert holds_secrets(env)
    assert not holds_secrets({"PATH": "/bin", "NATS_URL": "nats://x", "OPENAI_API_KEY": ""})


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
@pytest.mark.timeout(420)
def test_the_evaluators_process_tree_holds_no_key_during_a_run(tmp_path: Path, nats_url: str) -> None:
    secret = f"sk-kf-test-{uuid.uuid4().hex}"
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    env.update({"OPENAI_API_KEY": secret, "KF_TEST_SERVICE_TOKEN": secret})
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "actors.cli", "run", str(QUICKSTART), "--device", "cpu", "--candidates", "2",
           "--islands", "1", "--seconds", "300", "--embedder", "hashing", "--run-dir", str(run_dir), "--quiet",
           "--nats", nats_url, "--isolation", "best-effort"]  # fmt: skip
    run = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, str] = {}
    leaked: list[str] = []
    evaluators: set[int] = set()
    run_env = b""
    try:
        root = psutil.Process(run.pid)
        while run.poll() is None:
            run_env = _environ(run.pid) or run_env
            with_evaluator = [p for p in root.children() if "actor evaluator" in " ".join(_cmdline(p))]
            for evaluator in with_evaluator:
                evaluators.add(evaluator.pid)
                try:
                    tree = [evaluator, *evaluator.children(recursive=True)]
                except psutil.Error:
                    continue
                for proc in tree:
                    env_bytes = _environ(proc.pid)
                    if env_bytes is None:
                        continue
                    seen[proc.pid] = " ".join(_cmdline(proc))[:120]
                    if secret.encode() in env_bytes:
                        leaked.append(seen[proc.pid])
            time.sleep(0.2)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err[-3000:]
    assert secret.encode() in run_env  # the run's own process keeps the key (its experts may use it)
    assert evaluators, "no evaluator process was seen under the run"
    assert run.pid not in evaluators
    workers = [c for c in seen.values() if "gpu_runner" in c]
    assert len(seen) >= 3, seen  # the evaluator, its fork servers or workers, its janitor
    assert workers, seen
    assert not leaked, leaked
    report = json.loads((run_dir / "report.json").read_text())
    assert report["evaluated"] >= 2


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except psutil.Error:
        return []


@pytest.mark.slow  # a distributed run's processes: ~17 s; CI runs it in the slow suite
@pytest.mark.timeout(240)
def test_an_evaluator_process_refusing_the_task_ends_the_run_with_its_one_line(tmp_path: Path) -> None:
    from tests.e2e.test_task_refused import HUGE

    task = tmp_path / "huge.py"
    task.write_text(HUGE)
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), OPENAI_API_KEY="sk-kf-test-refusal")
    env.pop("NATS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "actors.cli", "run", str(task), "--device", "cpu", "--seconds", "60",
         "--run-dir", str(tmp_path / "run"), "--quiet"],
        capture_output=True, text=True, timeout=220, check=False, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kfoundry: task needs ~"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    assert "evaluator started as its own process" in log
