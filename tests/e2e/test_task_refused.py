"""A task too large for one evaluation on this machine is refused before any candidate runs: one
line that says what it needs, exit status 3 for ``kfoundry run``, and nothing killed for memory."""

from __future__ import annotations

import subprocess
import sys
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
    done = subprocess.run(
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
            str(tmp_path / "run"),
            "--embedder",  # the curator's embedder plays no part in a refusal
            "hashing",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 3, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kfoundry: task needs ~"), done.stderr[-3000:]
    assert "of host memory for one evaluation; this host has" in last
    assert "Traceback" not in done.stderr
