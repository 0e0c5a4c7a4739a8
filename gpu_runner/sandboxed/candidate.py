"""The worker's candidate stage: enter the sandbox, import the candidate, run trials, time it.

Order matters: the reference outputs were already shipped (``gpu_runner.sandboxed.reference``); now the
process drops its limits and privileges, installs the launch hooks, waits for the parent's GPU
grant (``go``), and only then imports the candidate. Every trial refills the same input buffers
with a new trial's data (a cache keyed on the pointer goes stale), hands the allocator NaN-filled
memory (stale memory cannot pass), and records launches, foreign aten ops, threads, children,
input mutation, aliasing and output changes after return. The outputs as they were at return go
to the parent, which decides.
"""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from collections.abc import Mapping
from typing import Any

import psutil
import torch

from gpu_runner.frames import JobOp, Op, Report
from gpu_runner.memplan import LARGE_BYTES
from gpu_runner.sandboxed.common import (
    Channel,
    Laps,
    checksum,
    close_enough,
    describe_exception,
    flatten_outputs,
    pack,
    poison_allocator,
    same_bits,
    storage_ptrs,
    sync,
)
from gpu_runner.sandboxed.hooks import (
    CANDIDATE_MODULE,
    DispatchRecorder,
    LaunchLog,
    install_ext_loader,
    install_triton_hooks,
)
from gpu_runner.sandboxed.reference import Prepared, build_model, load_module
from gpu_runner.sandboxed.timing import Rotation, Timed, run_timing


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
    """Evaluate one candidate against the prepared reference; every outcome goes to the parent."""
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
        ok = _trials(prepared, cand, log, msg, channel, threads0, children0, laps)
        if ok:
            # The trials ran beside spares' work; the timing waits until the GPU is ours alone.
            channel.send(Report.TRIALS_DONE)
            if channel.next_op() is not Op.TIME:
                return
            laps.lap("exclusive_wait_s")
            stage = "timing"
            _timing(prepared, cand, log, msg, channel)
            laps.lap("timing_s")
        if ok and profiled:
            stage = "profile"
            _profile(cand, prepared, channel)
            sync(device)
            laps.lap("profile_s")
        channel.send(Report.MEASURED)  # the parent may give the GPU to the next candidate now
    except BaseException as exc:  # noqa: BLE001 - whatever the candidate raised is the verdict's evidence
        channel.send(Report.ERROR, stage=stage, **describe_exception(exc), **_memory_at_oom(exc, device))
        return
    channel.send(Report.DONE, jit_fallback=log.jit_fallback, ext_loaded=log.ext_loaded, phases=laps.seconds)


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
) -> bool:
    """The correctness trials; ``laps`` gets their steps (``trial_*_s``, summed over trials)."""
    device = prepared.device
    recorder = DispatchRecorder(log)
    # Large inputs are used in place (their checksums before and after show a mutation), and
    # large outputs are fingerprinted at return instead of copied (a changed fingerprint after the
    # device is idle shows deferred work): either copy would be gigabytes the GPU may not have.
    in_place = prepared.in_nbytes > _large_bytes(msg)
    by_sum = prepared.out_nbytes > _large_bytes(msg)
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
    all_ok = True
    admitted = frozenset(msg.get("admitted_aten_ops") or ())  # the run's policy: the reference's own ops
    atol, rtol = msg["atol"], msg["rtol"]
    for t, pristine in enumerate(prepared.trials):
        in_sums: list[int | None] = []
        if in_place:
            work = list(pristine)
            in_ptrs = storage_ptrs(work)
            in_sums = [checksum(v) if isinstance(v, torch.Tensor) else None for v in work]
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
        refs = prepared.ref_outputs[t]
        info: dict[str, Any] = {
            "own_launches": log.own_launches,
            "own_names": log.own_names,
            "ext_calls": log.ext_calls,
            "foreign_ops": log.foreign_ops,
            "bad_types": [type(o).__name__ for o in items if type(o) is not torch.Tensor],
            "n_outputs": len(items),
            "devices_ok": all(o.device == r.device for o, r in zip(tensors, refs, strict=False)),
            "deferred": (
                any(checksum(o) != s for o, s in zip(tensors, sums, strict=True))
                if by_sum
                else any(not same_bits(o.detach(), s) for o, s in zip(tensors, snapshot, strict=True))
            ),
            "mutated": (
                any(checksum(w) != s for w, s in zip(work, in_sums, strict=True) if isinstance(w, torch.Tensor))
                if in_place
                else any(
                    not same_bits(w, p) for w, p in zip(work, pristine, strict=True) if isinstance(w, torch.Tensor)
                )
            ),
            "aliased": _aliased(tensors, in_ptrs),
            "threads": threading.active_count() - threads0,
            "children": _children() - children0,
            "elapsed_s": elapsed,
        }
        noise = prepared.noise(t)
        quick_ok = len(tensors) == len(refs) and all(
            close_enough(o, r, atol, rtol, noise=n) for o, r, n in zip(snapshot, refs, noise, strict=True)
        )
        info["quick_ok"] = quick_ok
        laps.lap("trial_checks_s")
        shared = prepared.shared.fill(t, snapshot) if prepared.shared is not None else None
        filled = prepared.slots.fill(t, snapshot) if prepared.slots is not None else None
        if shared is not None:  # the judge reads them where they are now (device to device on CUDA)
            laps.lap("trial_pack_s")
            channel.send(Report.TRIAL, trial=t, tensors=shared, info=info, shared=True)
        elif filled is None:
            metas, blobs = pack(snapshot)
            laps.lap("trial_pack_s")
            channel.send(Report.TRIAL, blobs=blobs, trial=t, tensors=metas, info=info)
        else:
            laps.lap("trial_pack_s")
            channel.send_bulk(Report.TRIAL, filled[1], trial=t, tensors=filled[0], info=info)
        laps.lap("trial_send_s")
        violation = (
            info["bad_types"]
            or info["deferred"]
            or info["mutated"]
            or info["aliased"]
            or info["threads"] > 0
            or info["children"] > 0
            or log.own_launches == 0
            or any(op not in admitted for op in log.foreign_ops)
            or not info["devices_ok"]
        )
        all_ok = all_ok and quick_ok and not violation
        if violation:
            break
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base_mem
        channel.send(Report.MEMORY, peak_bytes=int(peak))
    laps.lap("trial_memory_s")
    return all_ok


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
    from torch.profiler import ProfilerActivity, profile

    inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in prepared.trials[0]]
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            cand(*inputs)
            sync(prepared.device)
        names = [e.name for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA"]
        channel.send(Report.PROFILE, kernels=names[:64], launches=len(names) or None)
    except RuntimeError as exc:
        channel.send(Report.PROFILE, kernels=[], launches=None, error=str(exc)[:500])


RECHECK_ALL_BYTES = 256 << 20
"""Outputs up to this size are rechecked after every timed call; larger ones after the first
:data:`RECHECK_FIRST` calls and then after a random share ``RECHECK_ALL_BYTES / size`` of calls
(on an H100, a 6 GB relu's timing took 6.0 s for 31 rounds of three ~4.2 ms calls, so about
0.17 s of recheck per candidate call, 40x the kernel; sampled: 1.2 s for 30 rounds). The
candidate cannot know which calls are checked: the draw comes after the call has returned."""

RECHECK_FIRST = 3


def _timing(prepared: Prepared, cand: Any, log: LaunchLog, msg: JobOp, channel: Channel) -> None:
    atol, rtol = msg["atol"], msg["rtol"]
    recheck = {"checked": 0, "failed": 0, "skipped": 0}
    share = min(1.0, RECHECK_ALL_BYTES / max(1, prepared.out_nbytes))
    draw = random.SystemRandom()

    def after(trial: int, out: object) -> None:
        if share < 1.0 and recheck["checked"] >= RECHECK_FIRST and draw.random() >= share:
            recheck["skipped"] += 1
            return
        refs = prepared.ref_outputs[trial]
        noise = prepared.noise(trial)
        items = flatten_outputs(out)
        recheck["checked"] += 1
        good = len(items) == len(refs) and all(
            isinstance(o, torch.Tensor) and close_enough(o, r, atol, rtol, noise=n)
            for o, r, n in zip(items, refs, noise, strict=True)
        )
        if not good:
            recheck["failed"] += 1

    model = prepared.model
    timed = [
        Timed("candidate", lambda inputs: cand(*inputs), after=after),
        Timed("eager", lambda inputs: model(*inputs)),
    ]
    if prepared.compiled is not None:
        compiled = prepared.compiled
        timed.append(Timed("compiled", lambda inputs: compiled(*inputs)))
    log.reset()
    log.recording = True
    rotation = Rotation(
        prepared.trials,
        copy=prepared.in_nbytes <= _large_bytes(msg) or len(prepared.trials) < 2,
    )
    result = run_timing(timed, rotation, prepared.device, msg["timing"])
    log.recording = False
    result["recheck"] = recheck
    result["own_launches"] = log.own_launches
    result["candidate_calls"] = timed[0].calls
    channel.send(Report.TIMING, **result)
