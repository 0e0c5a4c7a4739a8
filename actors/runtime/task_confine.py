"""Running the user's task file confined outside the evaluator too (``--confine-task``).

The evaluator always loads the task file confined. Two other places import it: the run
controller, which describes the task for the experience library (:mod:`actors.commands.signature`),
and the template expert's analysis (:mod:`actors.experts.template.isolate`). Both already run it
in a child process; with ``--confine-task`` that child starts under
``python -m gpu_runner.confine.launch``, with the layers an evaluator's compile worker gets (no GPU):
its own user, network, PID, IPC and mount namespaces (no network interface, no other process
visible), a read-only root with homes, ``/tmp``, the project and the working folder hidden (only the
project's packages exposed), a fresh private folder its only writable place, and Landlock on top.
A machine that cannot grant the namespaces refuses the switch with the reason
(:class:`TaskConfineError`); nothing then runs unconfined behind the user's back.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from actors.runtime.errors import KfError

ENV = "KF_CONFINE_TASK"
"""Set to ``1`` (by ``--confine-task``, or in the environment of each ``kfoundry actor``): every
process of this machine that imports the task file does so confined."""
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "gpu_runner", "schemas")
"""The project's packages the child imports (the rest of the project stays hidden)."""
NEEDED = ("user_namespace", "network_isolation", "pid_namespace", "mount_view")
"""Layers without which the switch is refused (Landlock is added where it holds)."""


class TaskConfineError(KfError):
    """This machine cannot confine the task file as ``--confine-task`` asks (the message says why)."""


@functools.lru_cache(maxsize=1)
def _probe(python: str) -> tuple[Any, str | None]:
    """The machine's confinement layers and, where a needed one does not hold, the refusal (both
    kept: a machine that cannot confine is not probed again for every analysis)."""
    from gpu_runner.confine import policy

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}
    layers = policy.probe(python, env, False, None, {})
    missing = [f"{name}: {layers.notes.get(name, 'not probed')}" for name in NEEDED if not _holds(layers, name)]
    if missing:
        return layers, "--confine-task: this machine cannot confine the task file (" + "; ".join(missing) + ")"
    return layers, None


def _layers(python: str) -> Any:
    layers, refusal = _probe(python)
    if refusal is not None:
        raise TaskConfineError(refusal)
    return layers


def _holds(layers: Any, name: str) -> bool:
    return not str(layers.notes.get(name, "skipped")).startswith("skipped")


def check_available(python: str | None = None) -> None:
    """Raise :class:`TaskConfineError` now where the switch cannot be honoured (a run fails fast)."""
    _layers(python or sys.executable)


def wanted() -> bool:
    """Whether the task file is to be imported confined everywhere (:data:`ENV`)."""
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise TaskConfineError(f"{ENV}={value!r}: use 1 (on) or 0 (off)")
    return value == "1"


def enable() -> None:
    """``--confine-task``: check that this machine can honour it (else :class:`TaskConfineError`,
    before anything runs), then turn it on for this process and its children."""
    check_available()
    os.environ[ENV] = "1"


def confined_command(command: list[str], workdir: Path, python: str | None = None) -> list[str]:
    """``command`` (a Python child: ``[python, "-m", ...]``) started confined, ``workdir`` (a fresh
    folder of the caller's, removed by it) its only writable place. Raises :class:`TaskConfineError`."""
    from gpu_runner.confine import policy

    exe = python or sys.executable
    layers = _layers(exe)
    writable = [str(workdir)]
    packages = [str(PROJECT_ROOT / p) for p in PACKAGES]
    view = policy.view(layers, writable, [])
    view["expose"] = [*view["expose"], *(p for p in packages if p not in view["expose"])]
    spec: dict[str, Any] = {"namespaces": policy.namespace_plan(layers, {}), "view": view}
    if layers.landlock:
        grants = policy.grants(layers, writable, compile_mode=True)
        grants["execute"] = [*grants["execute"], *(p for p in packages if p not in grants["execute"])]
        spec["landlock"] = grants
    return [exe, "-m", "gpu_runner.confine.launch", json.dumps(spec), "--", *command]


def child_env(workdir: Path, keep: tuple[str, ...] = ("PATH", "LANG", "LC_ALL")) -> dict[str, str]:
    """The confined child's environment: nothing of the caller's but paths and locale; its home and
    temporary folder are ``workdir``; no GPU."""
    from actors.runtime.childenv import child_pythonpath

    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        {
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "PYTHONPATH": child_pythonpath(PROJECT_ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    return env


class ConfinedChild(NamedTuple):
    """How to start one confined child: its command line, environment and working folder."""

    command: list[str]
    env: dict[str, str]
    cwd: str


@contextlib.contextmanager
def confined_child(command: list[str], python: str | None = None) -> Iterator[ConfinedChild]:
    """``command`` (a Python child: ``[python, "-m", ...]``) made ready to start confined, in a
    fresh private folder (:func:`private_dir`) removed, with what the child left there, when the
    block ends. Raises :class:`TaskConfineError` where the machine cannot confine it."""
    workdir = private_dir()
    try:
        yield ConfinedChild(confined_command(command, workdir, python), child_env(workdir), str(workdir))
    finally:
        remove(workdir)


def private_dir() -> Path:
    """A fresh folder for one confined child (the caller removes it with :func:`remove`)."""
    path = Path(tempfile.mkdtemp(prefix="kf-task-"))
    path.chmod(0o777)  # the child's user namespace maps it to another uid
    return path


def remove(path: Path) -> None:
    """Remove a child's folder (what it left there included)."""
    shutil.rmtree(path, ignore_errors=True)
