"""End to end through the CLI on the CPU: ``kfoundry run`` with the embedded server, then the
result checked by ``kfoundry eval``; and a run whose actors are separate OS processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.runtime.bus import Bus
from actors.runtime.errors import ConfigError
from actors.runtime.kv import get_run
from actors.runtime.nats_server import ServerInfo
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
    assert "its timings are not speedups" in proc.stdout  # a CPU run says what its numbers are
    assert "a correctness check, not a speedup" in (run_dir / "best_model.py").read_text()
    assert "evaluated" in proc.stderr  # the progress line
    report = json.loads((run_dir / "report.json").read_text())
    assert report["evaluated"] >= 4
    assert report["best"] is not None
    for name in ("best_model.py", "fitness.png", "archive.png", "credit.png", "run.log"):
        assert (run_dir / name).stat().st_size > 0, name
    # Every line is JSON, other libraries' records (faiss's loader, sentence-transformers) included.
    log_lines = [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines()]
    assert any(line.get("event") == "feedback" and line.get("run") == "e2ecpu" for line in log_lines)
    # The template expert's first request took the analysis the run started ahead of the actors.
    assert any(line.get("event") == "analysis started ahead taken" for line in log_lines)
    # The embedded server left with the last command that used it.
    assert not (tmp_path / "home" / "nats" / "server.json").exists()
    # The best model stands alone, exported as a module, and is judged correct by the honest evaluator.
    exported = tmp_path / "quickstart_kernels.py"
    done = _kfoundry("export", str(run_dir), "--task", str(QUICKSTART), "--out", str(exported), env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "# Verified at these inputs" in exported.read_text()
    check = _kfoundry("eval", str(QUICKSTART), str(exported), "--device", "cpu", "--json", env=env, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    verdict = json.loads(check.stdout)
    assert verdict["status"] == "correct", verdict["summary"]


def readme_recipe() -> list[list[str]]:
    """The commands of the README's "Operating it across machines" block, as argv lists."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Operating it across machines") :]
    block = section[section.index("```\n") + 4 :]
    block = block[: block.index("```")]
    lines = [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    return [[t for t in shlex.split(line) if "=" not in t or t.startswith("-")] for line in lines]


def _wait_registered(url: str, run_id: str, timeout: float) -> None:
    async def poll() -> None:
        bus = await Bus.connect(url, name="test", actor_id="test-wait-run")
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with contextlib.suppress(ConfigError):
                        await get_run(bus, run_id)
                        return
                    await asyncio.sleep(0.2)
        finally:
            await bus.close()

    asyncio.run(poll())


def _on_this_machine(argv: list[str], url: str, run_id: str, tmp_path: Path) -> list[str]:
    """A recipe command pointed at the test's server and run, on the CPU, with test-sized budgets."""
    subs = {"nats://hub:4222": url, "exp1": run_id, "task.py": str(QUICKSTART), "cuda": "cpu"}
    argv = [subs.get(t, t) for t in argv]
    kind = argv[2] if argv[1] == "actor" else argv[1]
    extra = {
        "run": ["--device", "cpu", "--candidates", "4", "--seconds", "300", "--run-dir", str(tmp_path / "run")],
        "evaluator": ["--spares", "1"],
        "curator": ["--embedder", "hashing", "--library-dir", str(tmp_path / "lib")],
    }
    return [*argv[1:], *extra.get(kind, [])]


@pytest.mark.slow  # every actor as its own process: about 50 s
@pytest.mark.timeout(400)
def test_the_readmes_multi_machine_recipe_runs_with_actors_as_separate_processes(
    nats_server: ServerInfo, tmp_path: Path
) -> None:
    """The README's recipe, command by command (each actor its own OS process): the run gets
    every island it expects, ends on its candidate budget, and names no island as missing."""
    url = nats_server.url
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    run_id = f"proc{int(time.time()) % 100000}"
    recipe = [_on_this_machine(argv, url, run_id, tmp_path) for argv in readme_recipe()]
    assert recipe[0][0] == "run"
    islands = [argv[argv.index("--island") + 1] for argv in recipe if argv[:2] == ["actor", "island"]]
    assert islands == ["i0", "i1"]
    assert recipe[0][recipe[0].index("--islands") + 1] == "2"
    controller = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", *recipe[0]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    tap = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "tap", "--run", run_id, "--nats", url, "--count", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    actors = []
    try:
        _wait_registered(url, run_id, timeout=120)  # the controller registers the run (its spec in KV) first
        actors = [spawn_actor(*argv[1:], log=tmp_path / f"actor{n}-{argv[1]}.log") for n, argv in enumerate(recipe[1:])]
        # Every kind must show up in ``kfoundry status`` at some point (on a loaded 2-core machine
        # the actors take a while to start, and the run's own actors leave once it ends).
        needed = {"island", "evaluator", "diagnoser", "expert", "curator", "migrator"}
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
        assert f"run {run_id} ended (candidates)" in stdout, stdout
        assert "have not started" not in stderr, stderr[-3000:]
        # The islands, evaluator, diagnoser and migrator left on the RunEnd; experts and the curator stay.
        for argv, proc in zip(recipe[1:], actors, strict=True):
            if argv[1] in {"island", "evaluator", "diagnoser", "migrator"}:
                assert proc.wait(timeout=60) == 0, argv
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
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert {island["island"] for island in report["islands"]} == {"i0", "i1"}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_names_the_island_nobody_started_and_sends_it_no_migrants(
    nats_server: ServerInfo, tmp_path: Path
) -> None:
    """The recipe with island i1 left out: the run says i1 has not started (with the command that
    starts it), the migrator sends nothing to it, and an island the run does not expect refuses."""
    url = nats_server.url
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    run_id = f"miss{int(time.time()) % 100000}"
    recipe = [_on_this_machine(argv, url, run_id, tmp_path) for argv in readme_recipe()]
    recipe = [argv for argv in recipe if argv[-1] != "i1" and "i1" not in argv]
    run = [*recipe[0], "--seconds", "60", "--migration-interval", "1"]  # the later --seconds wins
    controller = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", *run],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    actors = []
    try:
        _wait_registered(url, run_id, timeout=120)
        actors = [spawn_actor(*argv[1:], log=tmp_path / f"actor{n}-{argv[1]}.log") for n, argv in enumerate(recipe[1:])]
        stranger = _kfoundry("actor", "island", "--island", "i5", "--run", run_id, "--nats", url, env=env, timeout=120)
        stdout, stderr = controller.communicate(timeout=330)
    finally:
        for proc in actors:
            stop_process(proc)
        if controller.poll() is None:
            controller.kill()
    assert stranger.returncode != 0
    assert f"island 'i5' is not one of run {run_id}'s islands (i0, i1)" in stranger.stderr + stranger.stdout
    assert controller.returncode == 0, stdout + stderr[-3000:]
    assert f"run {run_id}: island(s) i1 of the 2 it expects have not started (running: i0)" in stderr, stderr[-3000:]
    assert f"kfoundry actor island --island i1 --run {run_id}" in stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["evaluated"] >= 1
    assert [m for m in report["migrations"] if m["dest"] == "i1"] == []
