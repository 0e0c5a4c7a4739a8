"""Analysing a reference in a child process.

``torch.fx`` tracing patches ``torch.nn.Module.__call__`` and ``__getattr__`` process-wide while
it runs, so a trace in a worker thread would intercept every other thread's module calls (an
embedder, another actor) and could be corrupted by them; and analysis executes the user's
reference. So :func:`analyse_in_child` runs :func:`~actors.experts.template.render.analyse` in a
fresh ``python -m actors.experts.template.isolate`` with a scrubbed environment (no keys), sends
the source on stdin and reads the plan back as JSON; the event loop only awaits the child. The
child runs in a session of its own (a Ctrl-C meant for the run does not cut an analysis short),
dies with the expert (``PR_SET_PDEATHSIG``) and is killed when the request is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from actors.experts.template.ir import KeepTorch, Plan, Unsupported, plan_to_dict
from actors.experts.template.lowering import read_plan
from actors.runtime.childenv import child_pythonpath

_ROOT = Path(__file__).resolve().parents[3]
_KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


async def analyse_in_child(
    source: str, timeout: float = 180.0, keep_torch: KeepTorch = KeepTorch.NONE, confine: bool | None = None
) -> Plan | Unsupported:
    """``analyse(source, keep_torch)`` in a child process; a child that fails or times out is a
    decline. ``confine`` (default: ``--confine-task``, :mod:`actors.runtime.task_confine`) starts
    the child confined as an evaluator's worker is (its own namespaces, no network, a read-only
    view of the machine); a machine that cannot confine it declines with the reason."""
    from actors.runtime import task_confine

    command = [sys.executable, "-m", "actors.experts.template.isolate", f"--keep-torch={KeepTorch(keep_torch).value}"]
    if task_confine.wanted() if confine is None else confine:
        try:  # in its own PID namespace: no parent check
            with task_confine.confined_child(command) as child:
                return await _analyse(child.command, child.env, child.cwd, source, timeout)
        except task_confine.TaskConfineError as exc:
            return Unsupported(detail=str(exc))
    command.append(f"--parent={os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k in _KEEP_ENV}
    env["PYTHONPATH"] = child_pythonpath(_ROOT)  # the parent's import path, whatever set it up
    env["CUDA_VISIBLE_DEVICES"] = ""
    return await _analyse(command, env, str(_ROOT), source, timeout)


async def _analyse(
    command: list[str], env: dict[str, str], cwd: str, source: str, timeout: float
) -> Plan | Unsupported:
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(source.encode())
    except TimeoutError:
        return Unsupported(detail=f"analysing the reference took longer than {timeout:.0f} s")
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
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return Unsupported(detail=f"the analysis process failed ({proc.returncode}): {tail[0][:300]}")
    data = json.loads(out)
    if "unsupported" in data:
        return Unsupported(detail=str(data["unsupported"]), op=data.get("op"))
    return read_plan(data["plan"])  # the op families loaded here too (the analysis did in the child alone)


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` ends; exit now if it already has (the request is gone)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's kill on cancel remains
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(1)


def main() -> int:
    """Child entry: reference source on stdin, ``{"plan": ...}`` or ``{"unsupported": ...}`` out."""
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    if "parent" in flags:
        _die_with(int(flags["parent"]))
    from actors.experts.template.render import analyse

    source = sys.stdin.read()
    with contextlib.redirect_stdout(sys.stderr):  # the reference may print; stdout carries the answer
        result = analyse(source, KeepTorch(flags.get("keep-torch", KeepTorch.NONE.value)))
    if isinstance(result, Unsupported):
        payload: dict[str, object] = {"unsupported": result.detail, "op": result.op}
    else:
        payload = {"plan": plan_to_dict(result)}
    sys.stdout.write(json.dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
