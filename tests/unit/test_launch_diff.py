"""``bench/launch_diff.py``: launch-by-launch checksums of a template candidate, and the first
launch where two recordings part (under the Triton interpreter, in a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.launch_diff import compare, with_sizes

_REF = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


batch_size = 3


def get_inputs():
    return [torch.randn(batch_size, 4, 6, 6)]


def get_init_inputs():
    return []
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    ref = tmp_path / "ref.py"
    ref.write_text(_REF)
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "bench.launch_diff", str(ref), *args]
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=300)


@pytest.mark.slow  # ~6 s on a 2-core host: two recordings under the interpreter
def test_two_runs_agree_and_a_changed_launch_is_named_first(tmp_path: Path) -> None:
    first = _run(tmp_path, "--record", str(tmp_path / "a.json"), "--set", "batch_size=2")
    assert first.returncode == 0, first.stderr[-2000:]
    records = json.loads((tmp_path / "a.json").read_text())
    names = [name for name, _ in records]
    assert len(names) >= 3
    assert all(n.startswith("_kf_") for n in names)
    assert all(any(c is not None for c in sums) for _, sums in records)
    same = _run(
        tmp_path, "--record", str(tmp_path / "b.json"), "--set", "batch_size=2", "--against", str(tmp_path / "a.json")
    )
    assert same.returncode == 0, same.stdout + same.stderr[-2000:]
    assert "first difference" not in same.stdout
    # the second launch's last argument (its output) moved: that launch is the first difference
    changed = json.loads((tmp_path / "a.json").read_text())
    out = changed[1][1][-1]
    out[0] += 10 * max(out[1], 1.0)
    lines = compare([(n, c) for n, c in json.loads((tmp_path / "b.json").read_text())], [(n, c) for n, c in changed])
    assert "first difference" in lines[1]
    assert all("first difference" not in line for line in lines[:1] + lines[2:])


def test_sizes_are_overridden_only_where_the_reference_has_them() -> None:
    assert "batch_size = 2\n" in with_sizes(_REF, ["batch_size=2"])
    with pytest.raises(SystemExit, match="no module-level line"):
        with_sizes(_REF, ["channels=2"])
    with pytest.raises(SystemExit, match="NAME=INTEGER"):
        with_sizes(_REF, ["batch_size=two"])
