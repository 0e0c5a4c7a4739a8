"""The bench's host-memory peak counts pages shared by a process tree once, not once per process."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from actors.kbench.monitor import tree_host_bytes

pytestmark = pytest.mark.timeout(60)

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
