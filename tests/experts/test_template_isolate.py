"""The template expert's analysis child ends with its request: cancelled, or its expert killed."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from actors.experts.template.isolate import analyse_in_child

ROOT = Path(__file__).resolve().parents[2]

# A reference whose module body outlasts any test: analysis executes it, so the child stays busy.
STUCK = """import time
import torch
import torch.nn as nn

time.sleep(600)


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""

ANALYSER = f"""
import asyncio, sys
sys.path.insert(0, {str(ROOT)!r})
from actors.experts.template.isolate import analyse_in_child
asyncio.run(analyse_in_child({STUCK!r}, timeout=600))
"""


def _analysis_children(pid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "actors.experts.template.isolate" in proc.cmdline():
                out.append(proc)
    return out


def _gone(proc: psutil.Process, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(120)
async def test_a_cancelled_analysis_kills_its_child() -> None:
    task = asyncio.create_task(analyse_in_child(STUCK, timeout=600))
    children: list[psutil.Process] = []
    for _ in range(300):  # up to 30 s for the child to start
        if children := _analysis_children(psutil.Process().pid):
            break
        await asyncio.sleep(0.1)
    assert len(children) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _gone(children[0], within_s=5)


@pytest.mark.timeout(120)
def test_the_analysis_child_dies_with_its_expert() -> None:
    expert = subprocess.Popen([sys.executable, "-c", ANALYSER], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not (children := _analysis_children(expert.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(children) == 1
        expert.kill()  # SIGKILL: no clean-up of its own runs
        expert.wait()
        # in a session of its own, so no group kill reaches it: only the parent-death signal does
        assert _gone(children[0], within_s=10)
    finally:
        expert.kill()
        expert.wait()
        for child in _analysis_children(psutil.Process().pid):
            child.kill()


EMBEDDING = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(100, 32)

    def forward(self, x, idx):
        return self.e(idx) * x


def get_inputs():
    return [torch.randn(8, 32), torch.randint(0, 100, (8,))]


def get_init_inputs():
    return []
"""

RENDER_FROM_CHILD = f"""
import asyncio, sys
sys.path.insert(0, {str(ROOT)!r})
from actors.experts.template import default_params, render
from actors.experts.template.isolate import analyse_in_child
plan = asyncio.run(analyse_in_child({EMBEDDING!r}, timeout=120, confine=False))
source = render(plan, default_params(plan))
print("rendered", source.count("@triton.jit"))
"""


@pytest.mark.timeout(180)
def test_a_plan_analysed_in_the_child_renders_in_a_parent_that_never_loaded_the_families() -> None:
    """A gather the index family adds (an embedding's rows) is known to scheduling only where the
    families are loaded: the parent that receives the child's plan loads them too (a fresh
    interpreter here, as an expert actor is: in this test process other tests load them first)."""
    proc = subprocess.run([sys.executable, "-c", RENDER_FROM_CHILD], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "rendered 1", proc.stdout
