"""Entry point of a sandboxed worker: ``python -m gpu_runner.sandboxed.worker --mode run|compile ...``.

A worker imports torch (and Triton), initialises the device, reports ``ready`` and then blocks on
its pipe. A run worker becomes one of three things and never another: a spare (``prepare``: the
trials' inputs drawn, then exactly one ``job`` and its timed batches, then it exits, so no
candidate shares a process with another), the referee (``task``: the reference and its baselines,
then ``truth``/``batch``/``canary`` until the parent closes the pipe; it never takes a job), or the
judge (``judge`` ops only). A compile worker takes one ``compile``. Only stdlib, numpy, psutil,
torch and triton are imported here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import cast


def preload(mode: str, device: str) -> None:
    """Import what a worker of ``mode`` needs, without starting any device (a fork server calls it once)."""
    import torch

    from gpu_runner import protocol  # noqa: F401
    from gpu_runner.sandboxed import common

    try:
        import triton  # imported now so a candidate's import costs nothing on the critical path
        import triton.language  # noqa: F401
    except ImportError:
        pass
    else:
        if device == "cuda":  # the interpreter (CPU) never needs it
            from gpu_runner.sandboxed.triton_warm import warm_triton_key

            warm_triton_key()
    if mode == "run":
        import torch.profiler  # imported now; CUPTI itself starts only for a job that is profiled
        import torch.utils.cpp_extension  # the extension loader's (setuptools): not on a job's path
        from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

        from gpu_runner.sandboxed import candidate, referee, reference, spare  # noqa: F401

        if device == "cuda":
            try:  # torch.compile's machinery, imported now rather than inside the GPU lease later
                import torch._dynamo
                import torch._inductor.compile_fx  # noqa: F401
            except Exception as exc:  # noqa: BLE001 - the compiled baseline then pays the import; recorded
                common.log(f"inductor pre-import failed: {type(exc).__name__}: {exc}")
    else:
        from gpu_runner.sandboxed import compiling

        if device == "cuda":  # compile-only for a GPU target (no device is started here)
            compiling.warm()


def main(argv: list[str] | None = None) -> int:
    """Run one worker until its single job is done or the parent goes away."""
    parser = argparse.ArgumentParser(prog="gpu_runner.sandboxed.worker")
    parser.add_argument("--mode", choices=("run", "compile"), required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--share-fd", type=int, default=-1, help="a run worker's share socket (shared_slots)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import torch

    from gpu_runner.frames import (
        BatchOp,
        CompileOp,
        JobOp,
        JudgeOp,
        MeasureOp,
        Op,
        PrepareOp,
        Report,
        TaskOp,
        TruthOp,
        decode_op,
    )
    from gpu_runner.protocol import FrameError, read_frame
    from gpu_runner.sandboxed.common import Channel, Laps, describe_exception, device_info, log, peaks

    channel = Channel(args.in_fd, args.out_fd, os.environ.get("KF_BULK_DIR") or None, args.share_fd)
    import_s = time.perf_counter() - started
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    preload(args.mode, args.device)  # a no-op in a process forked from a fork server that did it
    if "triton" not in sys.modules:
        log("triton is not importable here")
    # An explicit index: some torch.cuda calls refuse a bare "cuda" device (CUDA_VISIBLE_DEVICES picks the GPU).
    device = torch.device("cuda:0" if args.mode == "run" and args.device == "cuda" else "cpu")
    laps = Laps()
    if device.type == "cuda":
        # No GPU lease here: a context start, Triton's driver and CUPTI's start in another process
        # left a timed kernel's median and 99th percentile unchanged on an H200
        # (bench/gpu_interference.py); host-to-device copies and large allocations did not.
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.empty(1, device=device).zero_()
        torch.cuda.synchronize(device)
        laps.lap("cuda_init_s")
        try:  # build or load Triton's driver module now, not on a candidate's first launch
            # Before the sandbox forbids starting programs. Without it an 8 GB candidate, whose
            # task had no torch.compile baseline to do it first, failed at its first launch with
            # PermissionError even though its kernel was compiled ahead of time.
            from gpu_runner.sandboxed.triton_warm import warm_triton_driver

            warm_triton_driver()
        except Exception as exc:  # noqa: BLE001 - without it the first launch pays the build; recorded
            log(f"triton driver warm-up failed: {type(exc).__name__}: {exc}")
        laps.lap("triton_driver_s")
    channel.send(
        Report.READY,
        device=device_info(device, interpreter),
        peaks=peaks(device) if args.mode == "run" else None,
        import_torch_s=import_s,
        startup_s=time.perf_counter() - started,
        phases=laps.seconds,
        pid=os.getpid(),
    )
    prepared = None
    referee = None
    while True:
        try:
            msg, _blobs = read_frame(args.in_fd)
            op = decode_op(msg)
        except (FrameError, EOFError, OSError):
            break
        if op is Op.PREPARE and referee is None:
            from gpu_runner.sandboxed.reference import ReferenceFault
            from gpu_runner.sandboxed.spare import prepare

            t0 = time.perf_counter()
            try:
                prepared = prepare(cast(PrepareOp, msg), device, channel)
            except ReferenceFault as exc:
                channel.send(Report.REFERENCE_ERROR, **describe_exception(exc))
                break
            except SystemExit as exc:
                channel.send(Report.REFERENCE_ERROR, **describe_exception(_exit_fault(exc)))
                break
            channel.send(Report.PREPARE_TIME, seconds=time.perf_counter() - t0)
        elif op is Op.TASK and prepared is None and referee is None:
            # A referee: it holds the reference and its baselines, and never takes a job.
            from gpu_runner.sandboxed import referee as referee_ops
            from gpu_runner.sandboxed.reference import ReferenceFault

            try:
                referee = referee_ops.start_task(cast(TaskOp, msg), device, channel)
            except ReferenceFault as exc:
                channel.send(Report.REFERENCE_ERROR, **describe_exception(exc))
                break
            except SystemExit as exc:
                channel.send(Report.REFERENCE_ERROR, **describe_exception(_exit_fault(exc)))
                break
        elif referee is not None and op in (Op.TRUTH, Op.BATCH, Op.CANARY):
            from gpu_runner.sandboxed import referee as referee_ops

            try:
                if op is Op.TRUTH:
                    referee_ops.serve_truth(referee, cast(TruthOp, msg), channel)
                elif op is Op.BATCH:
                    referee_ops.serve_batch(referee, cast(BatchOp, msg), channel)
                else:
                    referee_ops.serve_canary(referee, channel)
            except Exception as exc:  # noqa: BLE001 - the reference itself failed: the parent refuses the task
                channel.send(Report.REFERENCE_ERROR, **describe_exception(exc))
                break
        elif op is Op.JUDGE:  # a judge takes comparisons until the parent closes its pipe
            from gpu_runner.sandboxed.judging import judge

            held = (referee.namespace, referee.model, referee.init_seed) if referee is not None else None
            judge(cast(JudgeOp, msg), device, channel, held)
        elif op is Op.MEASURE:
            from gpu_runner.sandboxed.measure import measure

            channel.send(Report.MEASURED, **measure(cast(MeasureOp, msg), device))  # the worker may then be prepared
        elif op is Op.JOB:
            from gpu_runner.sandboxed.candidate import run_job

            if prepared is None:
                channel.send(Report.ERROR, stage="protocol", etype="ProtocolError", message="job before prepare")
                break
            run_job(prepared, cast(JobOp, msg), channel)
            break
        elif op is Op.COMPILE:
            from gpu_runner.sandboxed.compiling import compile_job

            compile_job(cast(CompileOp, msg), channel)
            break
        else:
            channel.send(Report.ERROR, stage="protocol", etype="ProtocolError", message=f"unexpected op {op.value}")
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit hook or lingering thread of a candidate may keep this process alive


def _exit_fault(exc: SystemExit) -> BaseException:
    """The task file called ``sys.exit()`` (or ``exit()``) while loaded, built or run: its fault,
    reported as a ``ReferenceFault`` whose cause is the exit (its traceback names the line). It
    ended the worker before, which the parent took for a worker that could not start."""
    from gpu_runner.sandboxed.reference import ReferenceFault

    fault = ReferenceFault(f"the reference called sys.exit({exc.code!r})")
    fault.__cause__ = exc
    return fault


if __name__ == "__main__":
    raise SystemExit(main())
