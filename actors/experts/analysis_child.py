"""The template expert's analysis child process, started by the expert or ahead of it.

:mod:`actors.experts.template.isolate` says why the analysis runs in a child (fx's process-wide
patching, the user's code) and reads its answer; this module starts the child and collects its
output. It imports neither torch nor the template package, so ``kfoundry run`` can call
:func:`prefetch` before anything heavy is loaded: the run knows its task before any actor starts,
and its template expert's first request then takes that child's answer (:func:`take`) instead of
starting its own child once the actors are up. On an H100 host (2026-12-06, 60 s runs of
KernelBench problems) the actors came up about 5 s after the process started, and the template
expert's first proposals came 5-15 s after that (L2-92 at 10.2 s from the start, L3-15 at 20.0 s),
waiting for the analysis child: its Python, torch's import, the trace and the probes of other sizes.

A prefetched child analyses with the fallback (``--fallback``): the reference whole, then, where
that is not covered, with ``keep_torch`` (the reference's own PyTorch ops between the kernels),
so a model needing the fallback costs one child, not two in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from actors.runtime.childenv import child_pythonpath

_ROOT = Path(__file__).resolve().parents[2]
_KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
DEFAULT_TIMEOUT_S = 180.0
"""An analysis child that has not answered in this long is a decline (the expert's default)."""


@dataclass(frozen=True)
class ChildOutput:
    """What one analysis child left: its exit status (``None``: killed at its timeout), stdout
    (the JSON answer) and stderr."""

    returncode: int | None
    out: bytes
    err: bytes
    timeout_s: float


async def run_child(source: str, keep_torch: str, fallback: bool, timeout: float, confine: bool) -> ChildOutput:
    """Analyse ``source`` in a fresh ``python -m actors.experts.template.isolate`` (``keep_torch``:
    a :class:`~actors.experts.template.ir.KeepTorch` value; ``fallback``: the whole reference
    first, ``keep_torch`` only where that is not covered). ``confine``: started as ``--confine-task``
    asks (raises :class:`~actors.runtime.task_confine.TaskConfineError` where the machine cannot).
    A cancelled call kills the child."""
    from actors.runtime import task_confine

    command = [sys.executable, "-m", "actors.experts.template.isolate", f"--keep-torch={keep_torch}"]
    if fallback:
        command.append("--fallback")
    if confine:
        with task_confine.confined_child(command) as child:  # in its own PID namespace: no parent check
            return await _communicate(child.command, child.env, child.cwd, source, timeout)
    command.append(f"--parent={os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k in _KEEP_ENV}
    env["PYTHONPATH"] = child_pythonpath(_ROOT)  # the parent's import path, whatever set it up
    env["CUDA_VISIBLE_DEVICES"] = ""
    return await _communicate(command, env, str(_ROOT), source, timeout)


async def _communicate(command: list[str], env: dict[str, str], cwd: str, source: str, timeout: float) -> ChildOutput:
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,  # a Ctrl-C meant for the run does not cut an analysis short
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(source.encode())
    except TimeoutError:
        return ChildOutput(None, b"", b"", timeout)
    finally:  # timed out, or the request was cancelled (the expert is stopping): the child goes too
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            try:
                await asyncio.shield(proc.wait())
            finally:
                # Cancelled again while waiting (a run that ends at once): its pipes are closed
                # now, with the loop running, not by the collector after the loop is gone (which
                # printed "Exception ignored ... Event loop is closed" under the command's output).
                transport = getattr(proc, "_transport", None)
                if transport is not None:
                    transport.close()
    return ChildOutput(proc.returncode, out, err, timeout)


_PENDING: dict[tuple[str, str, bool], asyncio.Task[ChildOutput]] = {}
"""Prefetched analyses not yet taken, by the source's hash, ``keep_torch`` and confinement."""


def _key(source: str, keep_torch: str, confine: bool) -> tuple[str, str, bool]:
    return hashlib.sha256(source.encode()).hexdigest(), keep_torch, confine


def prefetch(source: str, keep_torch: str, confine: bool, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Start analysing ``source`` now (with the fallback), for the template expert of this process
    to :func:`take` later; a second call for the same analysis does nothing. Call it from the
    event loop the expert runs in."""
    key = _key(source, keep_torch, confine)
    if key not in _PENDING:
        _PENDING[key] = asyncio.get_running_loop().create_task(
            run_child(source, keep_torch, True, timeout, confine), name="kf-analysis-prefetch"
        )


def take(source: str, keep_torch: str, confine: bool) -> asyncio.Task[ChildOutput] | None:
    """The prefetched analysis of ``source`` (started with the fallback), now the caller's to await
    or cancel; ``None`` where none was started."""
    return _PENDING.pop(_key(source, keep_torch, confine), None)


async def cancel_prefetches() -> None:
    """Cancel the prefetched analyses nobody took (their children are killed) and wait for them."""
    pending = list(_PENDING.values())
    _PENDING.clear()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
