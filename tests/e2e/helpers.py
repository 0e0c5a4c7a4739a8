"""Running the ``kfoundry`` command as a user would, for the end-to-end tests: its own home (so
the embedded server and stored state are the test's), unbuffered output, from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``kfoundry`` command: ``KFOUNDRY_HOME`` in ``tmp_path``, no ``NATS_URL``."""
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    env.pop("NATS_URL", None)
    return env


def kfoundry(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kfoundry ARGS`` run to its end, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT, check=False,
    )  # fmt: skip


def popen(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``kfoundry ARGS`` started, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
