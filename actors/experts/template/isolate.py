"""Analysing a reference in a child process.

``torch.fx`` tracing patches ``torch.nn.Module.__call__`` and ``__getattr__`` process-wide while
it runs, so a trace in a worker thread would intercept every other thread's module calls (an
embedder, another actor) and could be corrupted by them; and analysis executes the user's
reference. So :func:`analyse_in_child` runs :func:`~actors.experts.template.render.analyse` in a
fresh ``python -m actors.experts.template.isolate`` with a scrubbed environment (no keys), sends
the source on stdin and reads the plan back as JSON; the event loop only awaits the child. The
child runs in a session of its own (a Ctrl-C meant for the run does not cut an analysis short),
dies with the expert (``PR_SET_PDEATHSIG``) and is killed when the request is cancelled.
:func:`analyses_in_child` asks one child for the whole reference and, where that is not covered,
the fallback with the reference's own PyTorch ops kept; it takes the child ``kfoundry run``
started ahead for its task (:mod:`actors.experts.analysis_child`, which starts the children).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

import structlog

from actors.experts import analysis_child
from actors.experts.template.ir import KeepTorch, Plan, Unsupported, plan_to_dict
from actors.experts.template.lowering import read_plan

_log = structlog.get_logger(__name__)

Found = dict[KeepTorch, Plan | Unsupported]
"""Analyses of one reference by policy: ``NONE`` always, the fallback's policy where ``NONE`` is
not covered."""


async def analyse_in_child(
    source: str, timeout: float = 180.0, keep_torch: KeepTorch = KeepTorch.NONE, confine: bool | None = None
) -> Plan | Unsupported:
    """``analyse(source, keep_torch)`` in a child process; a child that fails or times out is a
    decline. ``confine`` (default: ``--confine-task``, :mod:`actors.runtime.task_confine`) starts
    the child confined as an evaluator's worker is (its own namespaces, no network, a read-only
    view of the machine); a machine that cannot confine it declines with the reason."""
    from actors.runtime import task_confine

    confined = task_confine.wanted() if confine is None else confine
    try:
        output = await analysis_child.run_child(source, KeepTorch(keep_torch).value, False, timeout, confined)
    except task_confine.TaskConfineError as exc:
        return Unsupported(detail=str(exc))
    failed = _failed(output)
    return failed if failed is not None else _result(json.loads(output.out))


async def analyses_in_child(
    source: str, timeout: float = 180.0, keep_torch: KeepTorch = KeepTorch.LAYOUT, confine: bool | None = None
) -> Found:
    """The reference analysed whole and, where that is not covered, with ``keep_torch``, in one
    child: the one ``kfoundry run`` started ahead (:func:`analysis_child.prefetch`) where there is
    one, else a fresh one."""
    from actors.runtime import task_confine

    confined = task_confine.wanted() if confine is None else confine
    keep = KeepTorch(keep_torch)
    pending = analysis_child.take(source, keep.value, confined)
    try:
        if pending is not None:
            started = time.monotonic()
            output = await pending
            _log.info("analysis started ahead taken", waited_s=round(time.monotonic() - started, 3))
        else:
            output = await analysis_child.run_child(source, keep.value, keep is not KeepTorch.NONE, timeout, confined)
    except task_confine.TaskConfineError as exc:
        refused = Unsupported(detail=str(exc))
        return {KeepTorch.NONE: refused, keep: refused}
    failed = _failed(output)
    if failed is not None:
        return {KeepTorch.NONE: failed, keep: failed}
    data = json.loads(output.out)
    return {KeepTorch(k): _result(v) for k, v in data["results"].items()}


def _failed(output: analysis_child.ChildOutput) -> Unsupported | None:
    """The decline of a child that timed out or failed, else ``None``."""
    if output.returncode is None:
        return Unsupported(detail=f"analysing the reference took longer than {output.timeout_s:.0f} s")
    if output.returncode != 0:
        tail = output.err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return Unsupported(detail=f"the analysis process failed ({output.returncode}): {tail[0][:300]}")
    return None


def _result(data: dict[str, Any]) -> Plan | Unsupported:
    if "unsupported" in data:
        op = data.get("op")
        return Unsupported(detail=str(data["unsupported"]), op=op if isinstance(op, str) else None)
    return read_plan(data["plan"])  # the op families loaded here too (the analysis did in the child alone)


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` ends; exit now if it already has (the request is gone)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's kill on cancel remains
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(1)


def main() -> int:
    """Child entry: reference source on stdin; ``{"plan": ...}`` or ``{"unsupported": ...}`` out, or
    with ``--fallback`` ``{"results": {policy: that, ...}}``: the reference whole, and where that is
    not covered, under ``--keep-torch`` too."""
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    if "parent" in flags:
        _die_with(int(flags["parent"]))
    from actors.experts.template.render import analyse

    keep = KeepTorch(flags.get("keep-torch", KeepTorch.NONE.value))
    source = sys.stdin.read()
    answer: dict[str, object]
    with contextlib.redirect_stdout(sys.stderr):  # the reference may print; stdout carries the answer
        if "--fallback" in sys.argv[1:]:
            results = {KeepTorch.NONE.value: _payload(whole := analyse(source))}
            if isinstance(whole, Unsupported) and keep is not KeepTorch.NONE:
                results[keep.value] = _payload(analyse(source, keep))
            answer = {"results": results}
        else:
            answer = _payload(analyse(source, keep))
    sys.stdout.write(json.dumps(answer))
    return 0


def _payload(result: Plan | Unsupported) -> dict[str, object]:
    if isinstance(result, Unsupported):
        return {"unsupported": result.detail, "op": result.op}
    return {"plan": plan_to_dict(result)}


if __name__ == "__main__":
    raise SystemExit(main())
