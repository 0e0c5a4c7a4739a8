"""The signature of a task: its ops, shapes and dtypes, FLOPs and fewest bytes moved.

Computed once per run, by the controller, from the reference (the user's own code) on PyTorch's
``meta`` device (the CPU only for small references the meta device cannot run), so experiences
from different runs can be compared and retrieved.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import threading
import time
import types
from typing import Any

from actors.runtime.logs import get_logger
from schemas import Task, TaskSignature, TensorSpec

log = get_logger(__name__)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _spec(t: Any) -> TensorSpec:
    return TensorSpec(shape=tuple(int(s) for s in t.shape), dtype=str(t.dtype).removeprefix("torch."))


def _op_name(node: Any) -> str:
    import torch

    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(node.target)).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(target).split(".")[-2] if "." in str(target) else str(target)
    return getattr(target, "__name__", str(target))


CPU_FALLBACK_BYTES = 512 << 20
"""A reference that cannot run on the meta device is run on the CPU only if its inputs are at most
this large (its shapes are known from the meta run): a 6 GB input built and run on the CPU took
the controller seconds of CPU and gigabytes of host memory before any actor could start."""


def _describe(model: Any, inputs: Any) -> tuple[list[str], Any, int | None]:
    """The reference's ops (empty if untraceable), its outputs and its FLOPs (None if not counted)."""
    import torch
    import torch.fx
    from torch.utils.flop_counter import FlopCounterMode

    ops: list[str] = []
    try:
        graph = torch.fx.symbolic_trace(model)
        ops = [_op_name(n) for n in graph.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    except Exception:  # noqa: BLE001 - untraceable references still get shapes and FLOPs
        ops = []
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = model(*inputs)
    return ops, out, int(counter.get_total_flops()) or None


def signature_of(source: str, name: str = "task") -> TaskSignature:
    """Describe the reference from one run on PyTorch's ``meta`` device (shapes, dtypes and FLOPs,
    no memory); a reference the meta device cannot run is run on the CPU when its inputs are small.
    Raises what the reference raises."""
    import torch

    module = types.ModuleType(f"kf_reference_{name}")
    # What the task prints while it is described is not the command's output: a forward printing
    # 20,000 lines put 40,000 before a run's summary on stdout (the evaluator's workers keep theirs).
    module.__dict__["print"] = _unprinted
    exec(compile(source, f"<reference {name}>", "exec"), module.__dict__)  # the user's own reference
    torch.manual_seed(0)
    inputs: Any = None
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
            inputs = module.get_inputs()
        ops, out, flops = _describe(model, inputs)
    except Exception:
        if inputs is not None and _nbytes(_tensors(inputs)) > CPU_FALLBACK_BYTES:
            raise  # too large to build on the CPU: the run goes on without a signature
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
        ops, out, flops = _describe(model, inputs)
    in_tensors = _tensors(inputs)
    out_tensors = _tensors(out)
    params = list(model.parameters()) + list(model.buffers())
    return TaskSignature(
        ops=tuple(ops),
        inputs=tuple(_spec(t) for t in in_tensors),
        outputs=tuple(_spec(t) for t in out_tensors),
        flops=flops,
        bytes_moved=_nbytes([*in_tensors, *out_tensors, *params]),
    )


def _unprinted(*args: object, **kwargs: Any) -> None:
    """The task file's ``print`` while the controller describes it: nothing is written."""


def _nbytes(tensors: list[Any]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def with_signature(task: Task, confine: bool | None = None) -> Task:
    """The task with its signature filled in (left empty if the reference cannot run here). With
    ``confine`` (default: ``--confine-task``, :mod:`actors.runtime.task_confine`) the reference
    runs in a confined child process, never in this one."""
    from actors.runtime import task_confine

    try:
        if task_confine.wanted() if confine is None else confine:
            signature = _confined_signature(task)
        else:
            signature = signature_of(task.source, task.name)
    except (Exception, SystemExit):  # noqa: BLE001 - a reference that needs a GPU still gets evaluated there
        return task  # (one that calls sys.exit too: its evaluator says so)
    return task.model_copy(update={"signature": signature})


SIGNATURE_WAIT_S = 10.0
"""How long a run waits for its task's signature before it goes on without one."""


class SignatureRun:
    """The task's description in its thread (:func:`signature_within`): when it began and whether
    it has returned. One that has not returned long after the run gave up on it is a forward that
    may never return: the run's end says so where its evaluator had not yet refused the task."""

    def __init__(self) -> None:
        self.started: float | None = None
        """When the description began (monotonic clock)."""
        self.returned = threading.Event()
        self.thread: threading.Thread | None = None
        self.stopped_s: float | None = None
        """Where :meth:`stop` stopped it unreturned: how long it had run then."""

    def unreturned_s(self) -> float | None:
        """Seconds the description has run without returning (until :meth:`stop`, if stopped);
        None once it returned or before it began."""
        if self.started is None or self.returned.is_set():
            return None
        if self.stopped_s is not None:
            return self.stopped_s
        return time.monotonic() - self.started

    def stop(self) -> None:
        """The run is ending: a description still running is asked to stop (:class:`_GivenUp` is
        raised in its thread at its next Python instruction). A forward spinning in Python
        (``while True: pass``) holds the GIL against everything the run's end does: a 20 s run of
        one took 69-128 s to end in CI jobs. Code waiting in C (a child process, a long kernel)
        releases the GIL and stops when it returns to Python, if ever; the daemon thread is left
        to the process's end either way."""
        thread = self.thread
        if self.started is None or self.returned.is_set() or thread is None or thread.ident is None:
            return
        if not thread.is_alive() or self.stopped_s is not None:
            return
        self.stopped_s = time.monotonic() - self.started
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_GivenUp))


class _GivenUp(BaseException):
    """Raised in the signature's thread by :meth:`SignatureRun.stop`."""


async def signature_within(task: Task, wait_s: float = SIGNATURE_WAIT_S, run: SignatureRun | None = None) -> Task:
    """:func:`with_signature` in a thread of its own, waited for at most ``wait_s``: a reference
    that never returns (a loop in its forward) leaves the run to go on without a signature, and its
    evaluator refuses the task with the line it is stuck on. The thread is a daemon, left to the
    process's end: Python cannot stop it, and it must not hold the exit (an executor's thread did:
    such a run ignored its budget and SIGTERM). ``run`` follows it (:class:`SignatureRun`)."""
    found: concurrent.futures.Future[Task] = concurrent.futures.Future()
    run = run or SignatureRun()

    def describe() -> None:
        try:
            signed = with_signature(task)  # the task unchanged on a failure
        except _GivenUp:
            return  # stopped at the run's end (SignatureRun.stop): it had not returned
        except BaseException:
            run.returned.set()
            raise
        run.returned.set()
        # given up on, the future was cancelled: a late result is dropped (set, it raised in this thread)
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            found.set_result(signed)

    run.started = time.monotonic()
    run.thread = threading.Thread(target=describe, name="task-signature", daemon=True)
    run.thread.start()
    try:
        async with asyncio.timeout(wait_s):
            return await asyncio.wrap_future(found)
    except TimeoutError:
        log.warning("task signature unfinished: the run goes on without it", wait_s=wait_s)
        return task


CHILD_TIMEOUT_S = 180.0


def _confined_signature(task: Task) -> TaskSignature:
    """:func:`signature_of` in ``python -m actors.commands.signature`` started confined (the
    source on stdin, the signature's JSON on stdout); raises where it cannot be had."""
    import subprocess
    import sys

    from actors.runtime import task_confine

    with task_confine.confined_child([sys.executable, "-m", "actors.commands.signature", task.name]) as child:
        done = subprocess.run(
            child.command,
            input=task.source,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=child.env,
            cwd=child.cwd,
            check=False,
        )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the confined signature process failed ({done.returncode}): {tail[0][:300]}")
    return TaskSignature.model_validate_json(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Child entry: the reference's source on stdin, its signature as one JSON line on stdout."""
    import contextlib
    import sys

    args = sys.argv[1:] if argv is None else argv
    source = sys.stdin.read()
    with contextlib.redirect_stdout(sys.stderr):  # the reference may print; stdout carries the answer
        signature = signature_of(source, args[0] if args else "task")
    sys.stdout.write(signature.model_dump_json() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
