"""The worker's candidate stage: enter the sandbox, import the candidate, run trials, serve timed batches.

This process holds the candidate, the inputs the spare drew (:mod:`gpu_runner.sandboxed.spare`)
and the candidate's outputs, and nothing a verdict depends on: no reference model, output or
baseline, no tolerance, nothing it could compare with. Order matters: the process drops its
limits and privileges, installs the launch hooks, waits for the parent's GPU grant (``go``), and
only then imports the candidate. Every trial refills the same input buffers with a new trial's
data (a cache keyed on the pointer goes stale) and hands the allocator NaN-filled memory (stale
memory cannot pass). The outputs as they were at return go to the parent, with the inputs as the
call left them (small ones) and what this process saw (launches, foreign aten ops, custom ops,
threads, children, aliasing, strides, output changes after return). Then the parent drives the
timing: one ``batch`` of fresh seeds at a time, the same harness as the referee's baselines
(:mod:`gpu_runner.sandboxed.timing`), its own clock around each. After the timed calls, one more
forward on inputs of its own times each of the candidate's launches alone (the ``kernel_times`` of
``done``: evidence for the report, never for the verdict). Everything this process reports after
the import may have been rewritten by the candidate: the parent decides from its own data.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import psutil
import torch

from gpu_runner.frames import BatchOp, JobOp, Op, Report, ShipOp
from gpu_runner.memplan import LARGE_BYTES
from gpu_runner.sandboxed.common import (
    Channel,
    Laps,
    checksum,
    describe_exception,
    flatten_outputs,
    output_structure,
    pack,
    poison_allocator,
    same_bits,
    storage_ptrs,
    sync,
)
from gpu_runner.sandboxed.common import log as log_line
from gpu_runner.sandboxed.hooks import (
    CANDIDATE_MODULE,
    DispatchRecorder,
    LaunchLog,
    LaunchTimer,
    install_ext_loader,
    install_triton_hooks,
)
from gpu_runner.sandboxed.reference import build_model, load_module, make_batch_inputs, make_inputs
from gpu_runner.sandboxed.spare import Prepared
from gpu_runner.sandboxed.timing import Flusher, run_batch, send_timed

KERNEL_TIMES_MAX_FORWARD_S = 2.0
"""The candidate's own kernels are timed one by one only when its timed forward takes at most this
long (the extra forward is paid inside the candidate's time limit)."""


def enter_sandbox(sb: Mapping[str, Any], device: torch.device) -> dict[str, str]:
    """Apply resource limits, the private cwd, the device-memory cap and the user drop; report each."""
    done: dict[str, str] = {}
    limits = {
        "RLIMIT_DATA": sb.get("data_bytes"),
        "RLIMIT_FSIZE": sb.get("fsize_bytes"),
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": sb.get("nproc"),
    }
    for name, value in limits.items():
        if value is None:
            continue
        try:
            resource.setrlimit(getattr(resource, name), (int(value), int(value)))
            done[name] = str(value)
        except (ValueError, OSError) as exc:
            done[name] = f"skipped: {exc}"
    os.chdir(sb["cwd"])
    if device.type == "cuda" and sb.get("mem_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(sb["mem_fraction"]), device)
        done["device_memory_fraction"] = str(sb["mem_fraction"])
    done.update(confine(sb))
    return done


def confine(sb: Mapping[str, Any]) -> dict[str, str]:
    """The last steps before a candidate runs, in order: the user drop, no capabilities left, the
    candidate's Landlock domain (its thread and later ones), the seccomp filter (every thread). The
    namespaces, filesystem view and the worker's Landlock domain were entered at spawn
    (:mod:`gpu_runner.confine.launch`). Each step's outcome by name; with ``strict`` a failed step
    ends here."""
    import json

    from gpu_runner.confine import caps, landlock, seccomp

    done: dict[str, str] = dict(json.loads(os.environ.get("KF_CONFINED") or "{}"))
    failed: list[str] = []

    def step(name: str, fn: Any) -> None:
        try:
            done.update(fn())
        except (OSError, ValueError, TypeError) as exc:
            done[name] = f"failed: {exc}"
            failed.append(name)

    uid, gid = sb.get("uid"), sb.get("gid")
    if uid is not None and gid is not None and os.getuid() == 0:

        def drop() -> dict[str, str]:
            os.setgroups([])
            os.setgid(int(gid))
            os.setuid(int(uid))
            return {"user": f"uid {uid}"}

        step("user", drop)
    else:
        done["user"] = f"skipped: running as uid {os.getuid()}"
    if "KF_CONFINED" in os.environ:

        def no_caps() -> dict[str, str]:
            caps.drop_all()
            return {"capabilities": "none"}

        step("capabilities", no_caps)
    if sb.get("landlock"):
        grants = landlock.Grants(**{k: tuple(v) for k, v in sb["landlock"].items()})
        step("landlock", lambda: {"landlock_candidate": landlock.restrict(grants)["landlock"]})
    if sb.get("seccomp"):
        step("seccomp", lambda: seccomp.install(seccomp.Profile(sb["seccomp"])))
    if failed and sb.get("strict"):
        raise SandboxFailure(f"isolation is strict and these layers failed: {', '.join(failed)}: {done}")
    return done


class SandboxFailure(RuntimeError):
    """A confinement layer that should have held did not (strict isolation: no candidate runs)."""


def import_candidate(path: str) -> dict[str, Any]:
    """Import the candidate file as module ``kf_candidate`` (hooks must already be installed)."""
    with open(path) as fh:
        source = fh.read()
    return load_module(source, path, CANDIDATE_MODULE)


def _children() -> int:
    try:
        return len(psutil.Process().children(recursive=True))
    except psutil.Error:
        return 0


def run_job(prepared: Prepared, msg: JobOp, channel: Channel) -> None:
    """Evaluate one candidate: trials, then the parent's timed batches; every outcome goes to the parent."""
    device = prepared.device
    laps = Laps()
    log = LaunchLog()
    install_triton_hooks(log, compile_only=False)
    install_ext_loader(log, "run", dict(msg.get("ext_manifest", {})), _private(msg, "ext"), [])
    laps.lap("hooks_s")
    profiled = bool(msg.get("profile_kernels"))  # the parent asks only on CUDA
    if profiled:
        # The profiler's first use starts CUPTI/Kineto: 4-5 s of CPU on an H200 host, which no
        # other process's timing notices (bench/gpu_interference.py). Before the GPU grant, so
        # it is not GPU time, only for candidates that run compiled extension code, and with the
        # privileges CUPTI had in the spare (before the sandbox's limits and user drop).
        _start_profiler(device)
        laps.lap("profiler_start_s")
    sandbox = enter_sandbox(msg["sandbox"], device)
    threads0, children0 = threading.active_count(), _children()
    laps.lap("sandbox_s")
    channel.send(Report.SANDBOX, checks=sandbox, phases=laps.seconds)
    # Nothing of the candidate runs before the parent grants the GPU: its import and constructor
    # may launch work too, which must not overlap another candidate's timing.
    channel.send(Report.ARMED)
    if channel.next_op() is not Op.GO:
        return
    laps = Laps()  # from here: the GPU window
    stage = "import"
    try:
        flusher = Flusher(device)  # the timing harness's L2 flush (made under the lease, before the import)
        ns = import_candidate(msg["candidate_path"])
        laps.lap("import_s")
        stage = "init"
        model_new = ns.get("ModelNew")
        if model_new is None:
            channel.send(Report.ERROR, stage="missing_model", etype="NameError", message="no ModelNew", traceback="")
            return
        cand = build_model(model_new, prepared.candidate_init_args, prepared.init_seed, device, prepared.init_on_device)
        sync(device)
        laps.lap("init_s")
        stage = "forward"
        _trials(prepared, cand, log, msg, channel, threads0, children0, laps)
        stage = "held_out_shape"
        _shape_trials(prepared, cand, log, channel)
        laps.lap("shape_trials_s")
        # The trials' inputs go: the timing draws its own (the memory plan counts one or the other).
        prepared.trials.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # The trials ran beside spares' work; the parent now judges them and, if they pass,
        # drives the timing batch by batch once the GPU is ours alone.
        channel.send(Report.TRIALS_DONE)
        stage = "timing"
        timed_ms = _timed_batches(prepared, cand, log, channel, flusher)
        if timed_ms is None:
            return
        laps.lap("timing_s")
        stage = "kernel_times"
        kernel_times = _kernel_times(prepared, cand, log, timed_ms)
        laps.lap("kernel_times_s")
        if profiled:
            stage = "profile"
            _profile(cand, prepared, channel)
            sync(device)
            laps.lap("profile_s")
        channel.send(Report.MEASURED)  # the parent may give the GPU to the next candidate now
    except BaseException as exc:  # noqa: BLE001 - whatever the candidate raised is the verdict's evidence
        channel.send(Report.ERROR, stage=stage, **describe_exception(exc), **_memory_at_oom(exc, device))
        return
    channel.send(
        Report.DONE, jit_fallback=log.jit_fallback, ext_loaded=log.ext_loaded, phases=laps.seconds, **kernel_times
    )


def _timed_batches(
    prepared: Prepared, cand: Any, log: LaunchLog, channel: Channel, flusher: Flusher
) -> list[float] | None:
    """Serve the parent's ``batch`` and ``ship`` ops until ``finish`` (the last batch's
    milliseconds per call) or anything else (None)."""
    device = prepared.device
    ns = prepared.namespace
    kept: list[list[torch.Tensor]] = []
    samples: list[float] = []

    while True:
        op, header = channel.next()
        if op is Op.FINISH:
            return samples
        if op is Op.BATCH:
            batch = cast(BatchOp, header)
            sizes = batch.get("overrides")

            def draw(seed: int, count: int, laps: dict[str, float]) -> list[list[Any]]:
                return make_batch_inputs(ns, seed, count, device, True, laps, sizes)  # noqa: B023 - called at once

            kept = []  # the last batch's outputs go now (as the referee's do: the same allocations)
            log.reset()
            log.recording = True
            result = run_batch(batch, lambda inputs: cand(*inputs), draw, device, flusher)
            log.recording = False
            kept = send_timed(channel, batch, device, result, own_launches=log.own_launches)
            if not sizes:  # the last batch at the task's own shape: the extra forward's bar
                samples = result[0]
        elif op is Op.SHIP:
            ship = cast(ShipOp, header)
            call = int(ship["call"])
            outs = kept[call] if 0 <= call < len(kept) else []
            _send_outputs(prepared, channel, int(ship["trial"]), outs, {"timed": True, "n_outputs": len(outs)})
        else:
            return None


def _kernel_times(prepared: Prepared, cand: Any, log: LaunchLog, timed_ms: list[float]) -> dict[str, Any]:
    """One more forward, outside any timed region, on inputs drawn here (nothing the parent
    judges), each of the candidate's own launches timed alone (:class:`LaunchTimer`): the ``done``
    frame's ``kernel_times`` and ``kernel_timer``. Nothing (and one log line) where the timed
    forward is too long to pay for another, the forward raises or it launched nothing of its own:
    whatever happens here, the verdict is the timed calls'."""
    forward_s = sorted(timed_ms)[len(timed_ms) // 2] / 1e3 if timed_ms else None
    if forward_s is None or forward_s > KERNEL_TIMES_MAX_FORWARD_S:
        why = "no timed call" if forward_s is None else f"its forward takes {forward_s:.2f} s"
        log_line(f"kernel times: not measured ({why})")
        return {}
    device = prepared.device
    timer = LaunchTimer(device)
    try:
        inputs = make_inputs(prepared.namespace, prepared.init_seed, device, on_device=True)
        log.timer = timer
        try:
            with torch.no_grad():
                cand(*inputs)
        finally:
            log.timer = None
        times = timer.summary()  # waits for the device on CUDA
    except Exception as exc:  # noqa: BLE001 - the candidate's code raised: no times, the verdict stands
        log_line(f"kernel times: not measured (the extra forward raised {type(exc).__name__}: {str(exc)[:200]})")
        return {}
    if not times:
        log_line("kernel times: not measured (the extra forward launched none of the candidate's own kernels)")
        return {}
    return {"kernel_times": times, "kernel_timer": timer.kind.value}


def _send_outputs(
    prepared: Prepared, channel: Channel, trial: int, outs: list[torch.Tensor], info: dict[str, Any]
) -> None:
    """One trial's (or a shipped timed call's) outputs to the parent: into the shared buffers, the
    host files, or packed into the frame, whichever this spare has."""
    shared = prepared.shared.fill(trial, outs) if prepared.shared is not None else None
    filled = prepared.slots.fill(trial, outs) if prepared.slots is not None and shared is None else None
    if shared is not None:  # the judge reads them where they are now (device to device on CUDA)
        channel.send(Report.TRIAL, trial=trial, tensors=shared, info=info, shared=True)
    elif filled is None:
        metas, blobs = pack(outs)
        channel.send(Report.TRIAL, blobs=blobs, trial=trial, tensors=metas, info=info)
    else:
        channel.send_bulk(Report.TRIAL, filled[1], trial=trial, tensors=filled[0], info=info)


def _large_bytes(msg: JobOp) -> int:
    """Bytes per trial above which this process copies neither inputs nor outputs (the job's
    ``in_place_bytes``, :data:`gpu_runner.memplan.LARGE_BYTES` by default)."""
    return int(msg.get("in_place_bytes", LARGE_BYTES))


def _memory_at_oom(exc: BaseException, device: torch.device) -> dict[str, Any]:
    """What this process held from the device when it ran out of memory, and what it asked for
    (the parent compares them with the memory plan to tell whose fault it was)."""
    if device.type != "cuda" or not isinstance(exc, torch.OutOfMemoryError):
        return {}
    import re

    asked = 0
    found = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", str(exc))
    if found:
        scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[found.group(2)]
        asked = int(float(found.group(1)) * scale)
    return {"device_reserved": int(torch.cuda.memory_reserved(device)), "device_requested": asked}


def _private(msg: JobOp, name: str) -> Any:
    from pathlib import Path

    return Path(msg["sandbox"]["cwd"]) / name


def _trials(
    prepared: Prepared,
    cand: Any,
    log: LaunchLog,
    msg: JobOp,
    channel: Channel,
    threads0: int,
    children0: int,
    laps: Laps,
) -> None:
    """The correctness trials; ``laps`` gets their steps (``trial_*_s``, summed over trials).

    Nothing here decides anything: each trial's outputs (and, for inputs up to
    ``ship_inputs_bytes``, the inputs as the call left them) go to the parent with what this
    process saw. The parent judges the outputs against the referee's, and the inputs against the
    checksums this spare made before the candidate existed."""
    device = prepared.device
    recorder = DispatchRecorder(log)
    # Large inputs are used in place (their checksums before and after show a mutation), and
    # large outputs are fingerprinted at return instead of copied (a changed fingerprint after the
    # device is idle shows deferred work): either copy would be gigabytes the GPU may not have.
    in_place = prepared.in_nbytes > _large_bytes(msg)
    by_sum = prepared.out_nbytes > _large_bytes(msg)
    ship_inputs = prepared.in_nbytes <= int(msg.get("ship_inputs_bytes", 0))
    work = (
        list(prepared.trials[0])
        if in_place
        else [v.clone() if isinstance(v, torch.Tensor) else v for v in prepared.trials[0]]
    )
    in_ptrs = storage_ptrs(work)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base_mem = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    poison = msg.get("poison_bytes")
    poison = 2 * (prepared.out_nbytes + prepared.in_nbytes) if poison is None else int(poison)
    first: tuple[list[torch.Tensor], list[int]] | None = None
    for t, pristine in enumerate(prepared.trials):
        if in_place:
            work = list(pristine)
            in_ptrs = storage_ptrs(work)
        else:
            for dst, src in zip(work, pristine, strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        poison_allocator(device, poison)
        laps.lap("trial_inputs_s")
        log.reset()
        log.recording = True
        t0 = time.perf_counter()
        with torch.no_grad(), recorder:
            out = cand(*work)
        log.recording = False
        items = flatten_outputs(out)
        tensors = [o for o in items if type(o) is torch.Tensor]
        # in stream order, right after the return: what the outputs held then
        sums = [checksum(o) for o in tensors] if by_sum else []
        snapshot = [o.detach() for o in tensors] if by_sum else [o.detach().clone() for o in tensors]
        sync(device)
        elapsed = time.perf_counter() - t0
        laps.lap("trial_forward_s")
        info: dict[str, Any] = {
            **_seen(log, out, items, tensors, device),
            "strides": [list(o.stride()) for o in tensors],
            "deferred": (
                any(checksum(o) != s for o, s in zip(tensors, sums, strict=True))
                if by_sum
                else any(not same_bits(o.detach(), s) for o, s in zip(tensors, snapshot, strict=True))
            ),
            "aliased": _aliased(tensors, in_ptrs),
            "threads": threading.active_count() - threads0,
            "children": _children() - children0,
            "elapsed_s": elapsed,
        }
        if not ship_inputs:  # too large to send back: checked here (an in-process check)
            info["input_sums_after"] = [checksum(v) if isinstance(v, torch.Tensor) else None for v in work]
        if t == 0:
            first = (tensors, [checksum(o) for o in snapshot])
        laps.lap("trial_checks_s")
        _send_outputs(prepared, channel, t, snapshot, info)
        if ship_inputs:
            metas, blobs = pack([v.detach() for v in work if isinstance(v, torch.Tensor)])
            channel.send(Report.INPUTS, blobs=blobs, trial=t, tensors=metas)
        laps.lap("trial_send_s")
        if _violation(info):
            break
    if first is not None and len(prepared.trials) > 1:
        # Outputs a later call overwrote (one workspace returned every time) are not the user's.
        changed = [checksum(o) != s for o, s in zip(first[0], first[1], strict=True)]
        channel.send(Report.LATER_CALLS, first_outputs_changed=any(changed))
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base_mem
        channel.send(Report.MEMORY, peak_bytes=int(peak))
    laps.lap("trial_memory_s")


def _seen(
    log: LaunchLog, out: object, items: list[object], tensors: list[torch.Tensor], device: torch.device
) -> dict[str, Any]:
    """What this process saw of one call (a trial's or a held-out shape's): its launches and ops,
    and its outputs' types, nesting and devices."""
    return {
        "own_launches": log.own_launches,
        "own_names": list(log.own_names),
        "ext_calls": log.ext_calls,
        "foreign_ops": log.foreign_ops,
        "custom_ops": log.custom_ops,
        "bad_types": [type(o).__name__ for o in items if type(o) is not torch.Tensor],
        "n_outputs": len(items),
        "structure": output_structure(out),
        "devices_ok": all(o.device == device for o in tensors),
    }


def _shape_trials(prepared: Prepared, cand: Any, log: LaunchLog, channel: Channel) -> None:
    """The candidate called once at each held-out shape (after the trials, before the timing). What
    it returns goes to the parent, packed, with what this process saw; what it raises is reported
    and the next shape tried, unless the device is left unusable (then the job fails here)."""
    device = prepared.device
    recorder = DispatchRecorder(log)
    for v, pristine in enumerate(prepared.variants):
        work = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
        threads0, children0 = threading.active_count(), _children()
        log.reset()
        log.recording = True
        try:
            with torch.no_grad(), recorder:
                out = cand(*work)
            sync(device)
        except Exception as exc:  # noqa: BLE001 - what the candidate raised at this shape is the evidence
            log.recording = False
            sync(device)  # a device left unusable fails the job here, at this stage
            raised = describe_exception(exc)
            channel.send(Report.SHAPE_TRIAL, variant=v, tensors=[], info={"raised": raised})
            continue
        log.recording = False
        items = flatten_outputs(out)
        tensors = [o.detach() for o in items if type(o) is torch.Tensor]
        info = {
            **_seen(log, out, items, tensors, device),
            "threads": threading.active_count() - threads0,
            "children": _children() - children0,
        }
        metas, blobs = pack(tensors)
        channel.send(Report.SHAPE_TRIAL, blobs=blobs, variant=v, tensors=metas, info=info)
        del out, items, tensors, work
    prepared.variants.clear()


def _violation(info: dict[str, Any]) -> bool:
    """Whether this process already saw enough to stop the trials (the parent decides the verdict)."""
    return bool(
        info["bad_types"]
        or info["deferred"]
        or info["aliased"]
        or info["threads"] > 0
        or info["children"] > 0
        or info["own_launches"] == 0
        or not info["devices_ok"]
    )


def _aliased(tensors: list[torch.Tensor], in_ptrs: set[int]) -> bool:
    seen: set[int] = set()
    for o in tensors:
        if not o.numel():
            continue
        ptr = o.untyped_storage().data_ptr()
        if ptr in in_ptrs or ptr in seen:
            return True
        seen.add(ptr)
    return False


def _start_profiler(device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        torch.empty(1024, device=device).add_(1)
        sync(device)


def _profile(cand: Any, prepared: Prepared, channel: Channel) -> None:
    """The device kernels of one forward, from CUPTI (for candidates that run compiled extension code)."""
    from torch.profiler import ProfilerActivity, profile

    inputs = make_inputs(prepared.namespace, 0, prepared.device, on_device=True)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            cand(*inputs)
            sync(prepared.device)
        names = [e.name for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA"]
        channel.send(Report.PROFILE, kernels=names[:64], launches=len(names) or None)
    except RuntimeError as exc:
        channel.send(Report.PROFILE, kernels=[], launches=None, error=str(exc)[:500])
