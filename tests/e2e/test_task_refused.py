"""A task too large for one evaluation on this machine is refused before any candidate runs: one
line that says what it needs, exit status 3 for ``kfoundry run``, and nothing killed for memory."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HUGE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1 << 20, 1 << 20)]  # 4 TiB: measured on the meta device, never allocated


def get_init_inputs():
    return []
"""


@pytest.mark.slow  # a run's start-up to its refusal: ~10 s; CI runs it in the slow suite
@pytest.mark.timeout(240)
def test_run_refuses_a_task_that_cannot_fit_with_what_it_needs(tmp_path: Path) -> None:
    task = tmp_path / "huge.py"
    task.write_text(HUGE)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "actors.cli",
            "run",
            str(task),
            "--device",
            "cpu",
            "--seconds",
            "60",
            "--run-dir",
            str(run_dir),
            "--embedder",  # the curator's embedder plays no part in a refusal
            "hashing",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        # Where it hangs: `kfoundry run` prints every thread's stack on SIGUSR1; its log says how far it got.
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3.0)
        proc.kill()
        _, err = proc.communicate()
        log = run_dir / "run.log"
        tail = "\n".join(log.read_text().splitlines()[-40:]) if log.exists() else "(no run.log)"
        pytest.fail(f"no refusal within 200 s\n--- stderr (stacks)\n{err[-12000:]}\n--- run.log\n{tail[-8000:]}")
    assert proc.returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("kfoundry: task needs ~"), err[-3000:]
    assert "of host memory for one evaluation; this host has" in last
    assert "Traceback" not in err
