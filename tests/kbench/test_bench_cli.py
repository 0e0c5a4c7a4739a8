"""``kfoundry bench`` end to end on the CPU, on a KernelBench-layout folder the test writes (two
small problems of our own): results, table, resume, and a clean stop on SIGINT."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 512)]


def get_init_inputs():
    return []
"""

BROKEN = """import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return []
"""

RUN_ARGS = "--islands 1 --inflight 1 --candidates 2 --embedder hashing"


def _layout(root: Path, relu: int = 1, broken: int = 2) -> Path:
    level = root / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / f"{relu}_ReLU.py").write_text(RELU)
    (level / f"{broken}_Broken_no_init_inputs.py").write_text(BROKEN)
    return root


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    env.pop("NATS_URL", None)
    return env


def _bench(kb: Path, out: Path, problems: str, env: dict[str, str]) -> list[str]:
    return [
        sys.executable, "-m", "actors.cli", "bench", str(kb), "--level", "1", "--problems", problems,
        "--device", "cpu", "--seconds", "90", "--out", str(out), "--run-args", RUN_ARGS,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_runs_problems_writes_table_and_resumes(tmp_path: Path) -> None:
    kb, out, env = _layout(tmp_path / "kb"), tmp_path / "out", _env(tmp_path)
    first = subprocess.run(_bench(kb, out, "1", env), capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "(1/1) 1_ReLU: start" in first.stderr
    assert "(1/1) 1_ReLU: correct" in first.stderr
    bench = json.loads((out / "bench.json").read_text())
    (relu,) = bench["results"]
    assert relu["status"] == "correct", relu
    assert relu["speedup_vs_eager"] > 0
    assert relu["evaluated"] >= 1
    assert relu["first_correct_s"] is not None
    assert relu["first_correct_s"] < relu["wall_s"]
    assert relu["peak_host_bytes"] > 100 * 2**20  # torch alone is more than that
    assert relu["peak_gpu_bytes"] is None  # a CPU run has no GPU memory to measure
    assert (out / relu["run_dir"] / "report.json").is_file()
    assert bench["totals"]["correct"] == 1
    assert "| 1_ReLU | best correct |" in (out / "bench.md").read_text()

    # Resume: problem 1 is kept as it was, only problem 2 runs (a task error, at once).
    second = subprocess.run(_bench(kb, out, "1-2", env), capture_output=True, text=True, env=env, timeout=200, cwd=ROOT)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "1 problem(s) to run, 1 already in" in second.stderr
    assert "1_ReLU: start" not in second.stderr
    bench = json.loads((out / "bench.json").read_text())
    assert [r["number"] for r in bench["results"]] == [1, 2]
    assert bench["results"][0] == relu
    broken = bench["results"][1]
    assert broken["status"] == "task_error"
    assert "missing get_init_inputs" in broken["detail"]
    assert broken["exit_code"] == 2
    totals = bench["totals"]
    assert (totals["problems"], totals["correct"], totals["share_correct"]) == (2, 1, 0.5)
    table = (out / "bench.md").read_text()
    assert "| 2_Broken_no_init_inputs | task error: " in table
    assert "correct: 1/2 (50%)" in table


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigint_stops_the_running_problem_and_keeps_finished_results(tmp_path: Path) -> None:
    kb, out, env = _layout(tmp_path / "kb", relu=2, broken=1), tmp_path / "out", _env(tmp_path)
    # Problem 1 finishes at once (a task error); problem 2 is then running when SIGINT comes.
    proc = subprocess.Popen(
        _bench(kb, out, "1-2", env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        console = out / "runs" / "level1_002" / "console.log"
        deadline = time.monotonic() + 120
        while not (console.exists() and "run " in console.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert console.exists(), "problem 1 never started"
        run_pids = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        assert run_pids
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "2_ReLU: interrupted, not kept" in stderr
    bench = json.loads((out / "bench.json").read_text())
    assert [(r["number"], r["status"]) for r in bench["results"]] == [(1, "task_error")]
    alive = [p for p in run_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parallel_runs_go_side_by_side_each_on_cores_of_its_own(tmp_path: Path) -> None:
    level = tmp_path / "kb" / "KernelBench" / "level1"
    level.mkdir(parents=True)
    for n in (1, 2):
        (level / f"{n}_ReLU.py").write_text(RELU)
    out, env = tmp_path / "out", _env(tmp_path)
    cmd = [*_bench(tmp_path / "kb", out, "1-2", env), "--parallel", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    affinity: dict[int, frozenset[int]] = {}  # each `kfoundry run` the bench started: its cores
    argv: dict[int, list[str]] = {}
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                for run in psutil.Process(proc.pid).children():
                    affinity.setdefault(run.pid, frozenset(run.cpu_affinity()))
                    argv.setdefault(run.pid, run.cmdline())
            time.sleep(0.2)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-4000:]
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if ": start on cores " in line]
    ends = [i for i, line in enumerate(lines) if "_ReLU: correct" in line]
    assert (len(starts), len(ends)) == (2, 2), stderr[-4000:]
    assert max(starts) < min(ends), "the second problem started only after the first ended"
    bench = json.loads((out / "bench.json").read_text())
    assert bench["parallel"] == 2
    assert [(r["number"], r["status"]) for r in bench["results"]] == [(1, "correct"), (2, "correct")]
    table = (out / "bench.md").read_text()
    assert "Problems ran 2 at a time, each run on a share of the host's cores and memory." in table
    for run_argv in argv.values():  # and each plans with half the host's memory
        assert run_argv[run_argv.index("--host-memory-share") + 1] == "0.5", run_argv
    assert len(affinity) == 2, affinity  # one `kfoundry run` per problem
    first, second = affinity.values()
    assert not first & second, affinity
    assert first | second <= frozenset(os.sched_getaffinity(0))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_start_until_lets_the_running_problem_finish_and_starts_no_other(tmp_path: Path) -> None:
    kb, out, env = _layout(tmp_path / "kb"), tmp_path / "out", _env(tmp_path)
    cmd = [*_bench(kb, out, "1-2", env), "--start-until", "5"]  # problem 1 runs for much longer than 5 s
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert first.returncode == 75, first.stderr[-4000:]
    assert "(1/2) 1_ReLU: correct" in first.stderr
    assert "2_Broken_no_init_inputs: start" not in first.stderr
    assert "--start-until 5 s reached: 1 problem(s) not started" in first.stderr
    bench = json.loads((out / "bench.json").read_text())
    assert [(r["number"], r["status"]) for r in bench["results"]] == [(1, "correct")]
    assert bench["results"][0]["wall_s"] > 5

    again = subprocess.run(_bench(kb, out, "1-2", env), capture_output=True, text=True, env=env, timeout=200, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "1 problem(s) to run, 1 already in" in again.stderr
