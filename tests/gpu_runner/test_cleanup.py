"""Nothing of an evaluator outlives it: killed with SIGKILL mid-evaluation, its workers, folders and
tmpfs files go too (the janitor), and a later start removes what a dead evaluator left."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_runner.janitor import kill_processes_using, mark_owner, sweep_stale
from gpu_runner.sandbox import await_ready, bulk_root, probe_isolation, spawn_worker
from tests.gpu_runner.conftest import CANDIDATES, REFERENCES


def _processes_naming(path: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if path.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _wait_for(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps the sweep's and the kill's own tests below
@pytest.mark.timeout(150)
def test_sigkilled_evaluator_leaves_no_process_folder_or_tmpfs_file(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "gpu_runner", str(REFERENCES / "add_relu.py"), str(CANDIDATES / "infinite_loop.py"),
           "--device", "cpu", "--timeout", "100", "--json"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Mid-evaluation: the candidate has been staged into a worker's folder and runs.
        assert _wait_for(lambda: any(tmp_path.glob("kf-runner-*/*/candidate.py")), 100), "the candidate never ran"
        base = next(tmp_path.glob("kf-runner-*"))
        bulk = bulk_root(base)
        assert bulk.exists()
        assert _processes_naming(str(base)), "no worker process runs from the service's folder"
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone = _wait_for(lambda: not _processes_naming(str(base)) and not base.exists() and not bulk.exists(), 20)
        assert gone, (
            f"left behind: processes {_processes_naming(str(base))}, folder {base.exists()}, tmpfs {bulk.exists()}"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sweep_removes_only_folders_whose_owner_is_gone(tmp_path: Path) -> None:
    live = tmp_path / "kf-live"
    dead = tmp_path / "kf-dead"
    foreign = tmp_path / "kf-foreign"  # no owner file: not ours to judge
    other = tmp_path / "other-dead"  # not our prefix
    for folder in (live, dead, foreign, other):
        folder.mkdir()
    mark_owner(live)
    # A process that has exited: its pid is free (or reused with another start time).
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    (dead / "owner").write_text(f"{child.pid} 1\n")
    (other / "owner").write_text(f"{child.pid} 1\n")
    removed = sweep_stale([tmp_path])
    assert removed == [dead]
    assert live.exists()
    assert foreign.exists()
    assert other.exists()
    assert not dead.exists()


def test_kill_processes_using_kills_only_processes_naming_the_folder(tmp_path: Path) -> None:
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "KF_PROBE_HOME": str(tmp_path / "x")})  # fmt: skip
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert kill_processes_using([str(tmp_path)]) >= 1
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (mine, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


async def test_a_reap_cancelled_midway_still_releases_the_workers_descriptors(tmp_path: Path) -> None:
    """The pool closing while a spare is being disposed cancels that spare's reap: its pipe and its
    share socket are closed all the same (CI at b06f7bd saw the socket left to the garbage collector)."""
    iso = await asyncio.to_thread(probe_isolation, False, False, None)
    worker = await spawn_worker("run", "cpu", iso, sys.executable, tmp_path, "run-cancelled", {"TRITON_INTERPRET": "1"})
    await await_ready(worker, 120)
    share, rfd = worker.share, worker.rfd
    assert share is not None
    assert rfd >= 0
    killing = asyncio.create_task(worker.kill(sweep=False))
    await asyncio.sleep(0)  # the worker is SIGKILLed; its reap waits for the process to be gone
    assert not killing.done()
    killing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await killing
    assert share.fileno() == -1
    assert worker.share is None
    assert worker.rfd == -1
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(rfd)
    await worker.proc.wait()  # the SIGKILLed process itself is the event loop's to collect
