"""The bench's host-memory peak counts pages shared by a process tree once, not once per process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from actors.kbench.monitor import TreeMonitor, reap, tree_host_bytes
from actors.kbench.runner import reap_run
from actors.runtime.nats_server import EmbeddedServer, find_binary

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

BLOCK = 256 << 20

SHARED_TREE = f"""
import mmap, os, sys, time
block = mmap.mmap(-1, {BLOCK}, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
block.write(b"x" * {BLOCK})  # every page resident, shared with the children forked below
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        _ = block[::4096]  # touch: each child maps every page
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
time.sleep(60)
"""


def test_pages_shared_by_four_processes_count_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SHARED_TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the children have touched the block
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
        assert len(tree) == 4
        summed_rss = sum(p.memory_info().rss for p in tree)
        host = tree_host_bytes(proc.pid)
        assert host is not None
        assert summed_rss > 3 * BLOCK  # what the bench reported before: the block four times
        assert BLOCK < host < 2 * BLOCK
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# A parent that starts a grandchild in a session of its own (as the evaluator starts its janitor
# and sandbox workers), prints its pid, and sleeps.
ESCAPING_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep({lives})"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def _escaping_tree(lives: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ESCAPING_TREE.format(lives=lives)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _end(proc: subprocess.Popen[str], escaped: int) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(escaped, signal.SIGKILL)


def test_reap_kills_what_left_the_group_and_outlived_the_root() -> None:
    proc, escaped = _escaping_tree(lives=60)
    try:
        monitor = TreeMonitor(proc.pid, gpu=False)
        monitor.remember()
        assert escaped in {p.pid for p in monitor.members()}
        proc.kill()  # the root only: the escaped child is not in its group
        proc.wait()
        assert psutil.pid_exists(escaped)  # reparented, still running
        killed = reap(monitor.members(), wait_s=0.5)
        assert [k.split()[0] for k in killed] == [str(escaped)]
        assert "time.sleep(60)" in killed[0]
        assert not psutil.pid_exists(escaped) or psutil.Process(escaped).status() == psutil.STATUS_ZOMBIE
    finally:
        _end(proc, escaped)


def test_reap_lets_what_ends_on_its_own_finish() -> None:
    proc, escaped = _escaping_tree(lives=1.0)
    try:
        monitor = TreeMonitor(proc.pid, gpu=False)
        monitor.remember()
        proc.kill()
        proc.wait()
        started = time.monotonic()
        assert reap(monitor.members(), wait_s=20) == []
        assert time.monotonic() - started < 15  # it waited for the process, not for the whole bound
    finally:
        _end(proc, escaped)


def test_reap_leaves_the_shared_nats_server_alone(tmp_path: Path) -> None:
    """A run that started the machine's embedded server leaves it to the other kfoundry commands."""
    code = (
        "import os, sys, time\n"
        f"argv = [{str(find_binary())!r}, '-p', '-1', '-a', '127.0.0.1']\n"
        "pid = os.posix_spawn(argv[0], argv, dict(os.environ), setsid=True)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout is not None
    server = int(proc.stdout.readline())
    try:
        monitor = TreeMonitor(proc.pid, gpu=False)
        monitor.remember()
        assert server in {p.pid for p in monitor.members()}
        proc.kill()
        proc.wait()
        assert reap(monitor.members(), wait_s=0.5) == []
        assert psutil.Process(server).is_running()
    finally:
        _end(proc, server)


def test_a_killed_runs_embedded_server_is_stopped_once_no_client_is_left(tmp_path: Path) -> None:
    """A run SIGKILLed by the bench never stops the embedded server it started; the bench does."""
    home = tmp_path / "home"
    env = dict(os.environ, KFOUNDRY_HOME=str(home), PYTHONPATH=str(ROOT))
    code = (
        "from actors.runtime.nats_server import EmbeddedServer; import time\n"
        "print(EmbeddedServer().acquire(), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("nats://")
    info = EmbeddedServer(home).adopt()
    assert info is not None
    try:
        monitor = TreeMonitor(proc.pid, gpu=False)
        monitor.remember()
        proc.kill()
        proc.wait()
        assert psutil.Process(info.pid).is_running()  # the run's own exit did not stop it
        reap_run(monitor, "killed", env)
        assert not psutil.pid_exists(info.pid) or psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        _end(proc, info.pid)
