"""Child processes see the import path of their parent, even when the parent's path holds a
directory nothing else would put there (the GPU machine's wheels installed with ``--target``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.experts.template.ir import Plan, Unsupported
from actors.experts.template.isolate import analyse_in_child
from actors.runtime.childenv import child_pythonpath

REFERENCE = """import torch
import torch.nn as nn

import kf_only_on_parent_path


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * kf_only_on_parent_path.SCALE


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
"""


@pytest.fixture
def private_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a module, on this process's ``sys.path`` only."""
    folder = tmp_path / "private"
    folder.mkdir()
    (folder / "kf_only_on_parent_path.py").write_text("SCALE = 2.0\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _imports(env: dict[str, str]) -> int:
    code = "import kf_only_on_parent_path"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=60, check=False
    ).returncode


@pytest.mark.timeout(60)
def test_child_pythonpath_carries_the_parents_sys_path(private_dir: Path, tmp_path: Path) -> None:
    scrubbed = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    assert _imports(scrubbed) != 0, "the module must not be importable without the parent's path"
    path = child_pythonpath(tmp_path)
    assert path.split(os.pathsep)[0] == str(tmp_path)
    assert str(private_dir) in path.split(os.pathsep)
    assert "" not in path.split(os.pathsep)
    assert _imports(scrubbed | {"PYTHONPATH": path}) == 0


@pytest.mark.timeout(180)
async def test_template_analysis_child_imports_what_its_parent_can(private_dir: Path) -> None:
    result = await analyse_in_child(REFERENCE, timeout=150.0)
    assert not isinstance(result, Unsupported), result.detail
    assert isinstance(result, Plan)
