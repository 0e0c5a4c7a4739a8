"""The fork server: forked workers get the isolation of fresh ones, and nothing escapes it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from gpu_runner.forkserver import WORKER_FDS, ForkedProcess, ForkServer
from gpu_runner.sandbox import probe_isolation, worker_env

PROBE = "tests.gpu_runner.fork_probe"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ForkServer]:
    home = tmp_path / "server"
    home.mkdir()
    srv = ForkServer("compile")
    env = worker_env({"TRITON_INTERPRET": "1", "KF_PARENT_SECRET_TOKEN": "s3cret"}, home)
    cmd = [sys.executable, "-m", "gpu_runner.forkserver", "--mode", "compile", "--device", "cpu"]
    srv.start(cmd, env, home, tmp_path / "server.log", 120)
    assert await srv.wait_ready(), srv.error
    yield srv
    await srv.close()


async def _fork(srv: ForkServer, tmp: Path, argv: list[str], isolate: bool) -> tuple[ForkedProcess, int, Path]:
    """Fork the probe with ``argv``; returns the process, the read end of its out pipe and its cwd."""
    cwd = tmp / f"w{time.monotonic_ns()}"
    cwd.mkdir()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    log_fd = os.open(cwd.parent / f"{cwd.name}.log", os.O_WRONLY | os.O_CREAT, 0o644)
    env = {"HOME": str(cwd), "PATH": os.environ.get("PATH", "/usr/bin"), "KF_WORKER_TOKEN": "abc"}
    try:
        confine = {"namespaces": probe_isolation(True, True, None).namespaces()} if isolate else {}
        proc = await srv.spawn(argv, env, cwd, (in_r, out_w, log_fd), confine, module=PROBE)
    finally:
        for fd in (in_r, out_w, log_fd):
            os.close(fd)
    os.close(in_w)
    return proc, out_r, cwd


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _namespaces_permitted() -> bool:
    iso = probe_isolation(network=True, pids=True, user=None)
    return not iso.pids.startswith("skipped") and not iso.network.startswith("skipped")


@pytest.mark.parametrize("isolate", [False, True])
async def test_a_forked_worker_is_isolated_like_a_fresh_one(server: ForkServer, tmp_path: Path, isolate: bool) -> None:
    if isolate and not await asyncio.to_thread(_namespaces_permitted):
        pytest.skip("unshare is not permitted here")
    proc, out_r, cwd = await _fork(server, tmp_path, ["describe"], isolate)
    facts = json.loads(await asyncio.to_thread(_read_all, out_r))
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    # Its own session and process group (the parent kills the group), its cwd, only its environment.
    assert facts["sid"] == facts["pgid"]
    assert facts["cwd"] == str(cwd)
    assert facts["env"]["KF_WORKER_TOKEN"] == "abc"
    assert not any("SECRET" in k for k in facts["env"])
    assert facts["torch_loaded"]  # what the server imported, the child did not pay for
    # Nothing of the server's open but stdio and the two pipe ends.
    assert set(facts["open_fds"]) <= {0, 1, 2, *WORKER_FDS}
    assert "described" in (cwd.parent / f"{cwd.name}.log").read_text()
    own = {"net": os.readlink("/proc/self/ns/net"), "pid": os.readlink("/proc/self/ns/pid")}
    if isolate:
        assert facts["net_ns"] != own["net"]
        assert facts["pid_ns"] != own["pid"]
        assert facts["pid"] == 1  # PID 1 of its namespace: whatever it spawns dies with it
        assert facts["visible_pids"] == [1]  # a private /proc
    else:
        assert facts["pid"] == proc.pid


async def test_exit_status_and_signals_reach_the_parent(server: ForkServer, tmp_path: Path) -> None:
    isolate = await asyncio.to_thread(_namespaces_permitted)
    for argv, expected in ((["exit", "7"], 7), (["segfault"], -signal.SIGSEGV)):
        proc, out_r, _ = await _fork(server, tmp_path, argv, isolate)
        await asyncio.to_thread(_read_all, out_r)
        assert await asyncio.wait_for(proc.wait(), 30) == expected, argv


@pytest.mark.parametrize("isolate", [False, True])
async def test_an_escaped_grandchild_does_not_outlive_its_worker(
    server: ForkServer, tmp_path: Path, isolate: bool
) -> None:
    if isolate and not await asyncio.to_thread(_namespaces_permitted):
        pytest.skip("unshare is not permitted here")
    proc, out_r, cwd = await _fork(server, tmp_path, ["escape"], isolate)
    assert await asyncio.to_thread(_read_all, out_r) == b"escaped"
    assert await asyncio.wait_for(proc.wait(), 30) == 0

    def survivors() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if p.cwd() == str(cwd):
                    found.append(p)
            except psutil.Error:
                pass
        return found

    def wait_gone(timeout_s: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout_s
        while (left := survivors()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    left = await asyncio.to_thread(wait_gone, 10)
    assert not left, f"escapees alive: {left}"


async def test_a_dead_server_fails_spawns_and_releases_waiters(server: ForkServer, tmp_path: Path) -> None:
    proc, out_r, _ = await _fork(server, tmp_path, ["exit", "0"], False)
    await asyncio.to_thread(_read_all, out_r)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert server.proc is not None
    server.proc.kill()
    await server.proc.wait()
    for _ in range(100):
        if not server.alive:
            break
        await asyncio.sleep(0.05)
    assert not server.alive
    assert server.error == "the fork server exited"
    with pytest.raises(OSError, match="fork server"):
        await _fork(server, tmp_path, ["exit", "0"], False)


async def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    srv = ForkServer("run")
    bad = tmp_path / "no-python"
    shutil.rmtree(bad, ignore_errors=True)
    srv.start([sys.executable, "-c", "import sys; print('broken on purpose'); sys.exit(3)"], dict(os.environ),
              tmp_path, tmp_path / "s.log", 30)  # fmt: skip
    assert not await srv.wait_ready()
    assert srv.error is not None
    assert "broken on purpose" in srv.error
    await srv.close()


@pytest.mark.parametrize("fork", [True, pytest.param(False, marks=pytest.mark.slow)])  # fresh: ~10 s
async def test_the_service_forks_its_workers_or_starts_fresh_ones(tmp_path: Path, fork: bool) -> None:
    from gpu_runner.service import EvaluationService
    from schemas import DeviceChoice, EvalStatus
    from tests.gpu_runner.conftest import fast_config, job

    service = EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=1, fork_server=fork))
    await service.start()
    try:
        result = await service.evaluate(job("add_relu", "honest_add_relu"))
        assert result.status is EvalStatus.CORRECT, result.summary
        assert service.runs is not None
        assert service.compiler is not None
        if not fork:
            assert service.runs.forks is None
            assert service.compiler.forks is None
            return
        runs, compiles = service.runs.forks, service.compiler.forks
        assert runs is not None
        assert compiles is not None
        assert runs.workers_ready >= 1, runs.error  # (Triton needs no compile worker on the CPU)
        assert compiles.alive, compiles.error
        # The servers (and so every worker forked from them) run at the workers' niceness.

        assert runs.proc is not None
        assert compiles.proc is not None
        nice = service.cfg.worker_nice
        assert psutil.Process(runs.proc.pid).nice() == nice
        assert psutil.Process(compiles.proc.pid).nice() == nice
    finally:
        await service.aclose()
