"""A spare's stage before its candidate exists: the trials' inputs and the output buffers.

A spare is the process a candidate will run in. What it holds when the candidate arrives is what
the candidate may see: the trials' inputs (drawn here from the parent's seeds and scales), the
candidate's constructor arguments, and empty buffers for the outputs it will send back. It never
builds the reference's model, never computes a reference output and never times a baseline: those
live in the referee (:mod:`gpu_runner.sandboxed.referee`), a process no candidate ever runs in.
The checksums of the pristine inputs are made here, before any candidate code is loaded, and sent
to the parent, which checks the inputs each trial sends back against them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_runner.frames import PrepareOp, Report
from gpu_runner.memplan import LARGE_BYTES
from gpu_runner.sandboxed.common import TORCH_DTYPES, Channel, Laps, OutputSlots, checksum, log, unregister_host
from gpu_runner.sandboxed.reference import (
    ReferenceFault,
    load_reference,
    lock_host,
    make_inputs,
    to_device,
)
from gpu_runner.sandboxed.shared_slots import SharedSlots


def meta_templates(metas: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Storage-less tensors of the reference's outputs' shapes and dtypes (for sizing buffers)."""
    out = []
    for m in metas:
        dtype = TORCH_DTYPES.get(str(m.get("dtype")))
        if dtype is None:
            raise ReferenceFault(f"the reference returns a {m.get('dtype')} tensor, which cannot be compared")
        out.append(torch.empty([int(n) for n in m.get("shape", [])], dtype=dtype, device="meta"))
    return out


@dataclass
class Prepared:
    """A spare made ready for a task: everything its candidate will be given, nothing it is judged by."""

    device: torch.device
    namespace: dict[str, Any]
    init_seed: int
    candidate_init_args: list[Any]
    trials: list[list[Any]]
    """Every trial's inputs, drawn from the parent's seeds (and scaled for the range trials)."""
    input_sums: list[list[int | None]]
    """Checksums of every trial's pristine inputs, sent to the parent before any candidate existed."""
    out_nbytes: int = 0
    in_nbytes: int = 0
    on_device: bool = False
    """Inputs are drawn on the device itself (the timed calls' inputs always are)."""
    init_on_device: bool = False
    """The candidate's model is built on the device itself (as the referee builds the reference's)."""
    slots: OutputSlots | None = None
    """Host files the trials' (and shipped timed calls') outputs are copied into (None: packed and sent)."""
    shared: SharedSlots | None = None
    """Shared buffers (device memory on CUDA) the outputs are copied into for the judge."""
    extra: dict[str, Any] = field(default_factory=dict)
    variants: list[list[Any]] = field(default_factory=list)
    """Inputs at the task's held-out shapes (one draw each, from the parent's ``variant_seeds``)."""


def prepare(msg: PrepareOp, device: torch.device, channel: Channel) -> Prepared:
    """Draw the trials' inputs and make the output buffers; raises :class:`ReferenceFault`."""
    ns = load_reference(msg["reference_source"])
    laps = Laps()
    seeds, scales = [int(s) for s in msg["trial_seeds"]], [float(s) for s in msg["trial_scales"]]
    if len(seeds) != len(scales):
        raise ReferenceFault("the parent sent a scale for each trial seed: the numbers differ")
    on_device = device.type == "cuda" and bool(msg.get("inputs_on_device"))
    try:
        candidate_init_args = copy.deepcopy(list(ns["get_init_inputs"]()))
        host_trials = (
            []
            if on_device
            else [make_inputs(ns, s, torch.device("cpu"), scale=k) for s, k in zip(seeds, scales, strict=True)]
        )
    except ReferenceFault:
        raise
    except Exception as exc:
        raise ReferenceFault(f"drawing the inputs failed: {type(exc).__name__}: {exc}") from exc
    laps.lap("build_s")
    # Page-locked in place (outside the lease), so the copies to the device under it are DMA.
    locked = lock_host(host_trials) if device.type == "cuda" else []
    laps.lap("lock_s")
    with channel.gpu_lease(device):
        laps.lap("lease_wait_s")
        try:
            if on_device:
                trials = [
                    make_inputs(ns, s, device, on_device=True, scale=k) for s, k in zip(seeds, scales, strict=True)
                ]
            else:
                trials = [to_device(values, device, non_blocking=bool(locked)) for values in host_trials]
        except ReferenceFault:
            raise
        except Exception as exc:
            raise ReferenceFault(f"drawing the inputs failed: {type(exc).__name__}: {exc}") from exc
        input_sums = [[checksum(v) if isinstance(v, torch.Tensor) else None for v in values] for values in trials]
        laps.lap("to_device_s")
        variants = _variants(ns, msg, device, on_device)
        laps.lap("variants_s")
    for t in locked:  # the lease's end synchronised the copies
        unregister_host(t)
    del host_trials, locked
    templates = meta_templates(list(msg["out_metas"]))
    prepared = Prepared(
        device=device,
        namespace=ns,
        init_seed=int(msg["init_seed"]),
        init_on_device=device.type == "cuda" and bool(msg.get("init_on_device")),
        candidate_init_args=candidate_init_args,
        trials=trials,
        input_sums=input_sums,
        out_nbytes=sum(t.numel() * t.element_size() for t in templates),
        in_nbytes=sum(v.numel() * v.element_size() for v in trials[0] if isinstance(v, torch.Tensor)),
        on_device=on_device,
        variants=variants,
    )
    channel.send(Report.REFERENCE_DONE)
    # Buffers for every trial's outputs and for the timed calls the parent may ask for.
    per_slot = [templates] * (len(trials) + int(msg.get("timed_slots", 0)))
    if msg.get("device_verdict") and msg.get("shared_outputs") and channel.share_fd >= 0:
        # The judge reads the outputs where the worker copies them (no host files): the buffers and
        # their descriptors are made now, before any candidate code exists here.
        share_fd, channel.share_fd = channel.share_fd, -1
        try:
            with channel.gpu_lease(device):  # device allocations and their zeroing: not beside a timing
                prepared.shared = SharedSlots(per_slot, device, share_fd)
        except (OSError, RuntimeError, ValueError) as exc:  # DevShareError included: host files then
            log(f"shared outputs unavailable: {type(exc).__name__}: {exc}")
        laps.lap("shared_s")
    channel.close_share()
    if channel.bulk_dir and prepared.shared is None:  # pre-faulted and page-locked now, while the spare waits
        # ... unless they are gigabytes: then page-locking costs more than the pageable copy it saves.
        large = prepared.out_nbytes > int(msg.get("in_place_bytes", LARGE_BYTES))
        try:
            prepared.slots = OutputSlots(channel.bulk_dir, per_slot, device, prefault=not large)
        except (OSError, RuntimeError, ValueError) as exc:  # the trials then pack and send
            log(f"output slots unavailable: {type(exc).__name__}: {exc}")
        laps.lap("slots_s")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    channel.send(
        Report.PREPARED,
        phases=laps.seconds,
        input_sums=input_sums,
        out_metas=[list(msg["out_metas"]) for _ in trials],
        output_slots=(
            {"files": len(prepared.slots.slots), "pinned": prepared.slots.pinned}
            if prepared.slots
            else {"shared": len(prepared.shared.views)}
            if prepared.shared
            else None
        ),
    )
    return prepared


def _variants(ns: dict[str, Any], msg: PrepareOp, device: torch.device, on_device: bool) -> list[list[Any]]:
    """One draw of the inputs at each held-out shape the parent sent (none: no such check)."""
    sizes, seeds = list(msg.get("variants") or []), [int(x) for x in msg.get("variant_seeds") or []]
    if len(sizes) != len(seeds):
        raise ReferenceFault("the parent sent a seed for each held-out shape: the numbers differ")
    try:
        if on_device:
            return [make_inputs(ns, s, device, on_device=True, overrides=o) for s, o in zip(seeds, sizes, strict=True)]
        return [
            to_device(make_inputs(ns, s, torch.device("cpu"), overrides=o), device)
            for s, o in zip(seeds, sizes, strict=True)
        ]
    except Exception as exc:
        raise ReferenceFault(f"drawing the inputs at a held-out shape failed: {type(exc).__name__}: {exc}") from exc
