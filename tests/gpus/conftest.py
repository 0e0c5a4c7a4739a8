"""A stand-in ``nvidia-smi`` on ``PATH`` that lists GPUs the test chooses (the CPU machine has none)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

FakeSmi = Callable[[list[tuple[str, str, int]]], Path]


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSmi:
    """Install an ``nvidia-smi`` that prints ``index, uuid, name, memory MiB`` rows for the given
    ``(uuid, name, MiB)`` GPUs, first on ``PATH``; lock files go to a private folder."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("KFOUNDRY_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(gpus: list[tuple[str, str, int]]) -> Path:
        rows = "\n".join(f"{i}, {uuid}, {name}, {mib}" for i, (uuid, name, mib) in enumerate(gpus))
        script = folder / "nvidia-smi"
        script.write_text(f"#!/bin/sh\ncat <<'ROWS'\n{rows}\nROWS\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return folder

    return install


def four_h200() -> list[tuple[str, str, int]]:
    return [(f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H200", 143771) for i in range(4)]
