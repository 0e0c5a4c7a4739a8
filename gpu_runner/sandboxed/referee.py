"""The referee: the task's reference, its truth and its baselines, in a process no candidate ever runs in.

A truth worker is the same process started ``light``: the model alone, for the ``truth`` ops of
one spare's trials or of a candidate's judged timed calls, then stopped; it spares the referee,
whose timing sessions must not wait behind gigabytes of reference outputs being shipped.

One referee per evaluation service and task. On ``task`` it loads the reference, builds its model
(and its ``torch.compile`` baseline) once, counts its FLOPs, measures the canary on an idle GPU and
chooses the range trials' input scales. Then it answers, one op at a time:

* ``truth``: the reference's outputs in IEEE fp32 and their float64 residuals for the seeds (and
  scales) a spare's trials were drawn from, or a timed call's seed, shipped to the parent;
* ``batch``: one timed batch of the eager or compiled baseline, with the same harness as the
  candidate's batches (:func:`gpu_runner.sandboxed.timing.run_batch`), the canary first;
* ``canary``: whether the GPU is idle (a candidate's process may have left work running).

Nothing it holds is reachable from a candidate: candidates run in other processes, and what the
parent tells the referee about them is seeds and nothing else.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_runner.frames import BatchOp, Report, TaskOp, TruthOp
from gpu_runner.sandboxed.common import Channel, Laps, log, output_structure
from gpu_runner.sandboxed.op_profile import profile_ops
from gpu_runner.sandboxed.reference import (
    ReferenceFault,
    Shipment,
    as_double,
    build_compiled,
    build_model,
    clone_inputs,
    count_flops,
    error_sums,
    exact_fp32,
    init_inputs,
    load_reference,
    make_batch_inputs,
    make_inputs,
    ship,
    tensors,
    to_device,
    truth,
)
from gpu_runner.sandboxed.timing import Flusher, canary_us, run_batch, send_timed
from gpu_runner.stats import DEFAULT_TOLERANCES

LARGE_SCALES = (1e6, 1e4, 1e2)
"""Input scales tried for the large-magnitude range trial, largest first: the first whose reference
outputs (and float64 truth) stay finite is used. 1e6 leaves fp16's range (65504); a softmax or
norm that skips its stabilising step overflows well before."""
SMALL_SCALES = (1e-6, 1e-3)
"""Input scales tried for the small-magnitude range trial (1e-6 is below fp16's normal range)."""
CANARY_QUIET_CALLS = 21


def empty_kernel_us(
    device: torch.device, scratch: torch.Tensor | None, flusher: Flusher, reps: int = 21
) -> float | None:
    """The least time CUDA events can see around one launched kernel (a one-element add), timed as
    the harness times a call (a lead spin first, so the launch waits queued): the floor under any
    call that launches its own kernel (the fastest of ``reps``)."""
    if device.type != "cuda" or scratch is None or not flusher.cycles_per_us:
        return None
    best = float("inf")
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        flusher.spin(int(100 * flusher.cycles_per_us))
        start.record()
        scratch.add_(1)
        end.record()
        end.synchronize()
        best = min(best, float(start.elapsed_time(end)) * 1e3)
    return best


def _finite(values: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in values if v.is_floating_point())


def _unchanged(after: Any, before: Any) -> bool:
    """Whether a forward left an input as it was (tensors: the same values, NaN where NaN)."""
    if not isinstance(after, torch.Tensor) or not isinstance(before, torch.Tensor):
        return True
    if after.shape != before.shape or after.dtype != before.dtype:
        return False
    same = after == before
    if after.is_floating_point():
        same |= after.isnan() & before.isnan()
    return bool(same.all())


def _nonfinite_as(values: list[torch.Tensor], where: list[torch.Tensor | None]) -> bool:
    """Whether the floating ``values`` are non-finite exactly ``where`` (finite where it is None)."""
    if len(values) != len(where):
        return _finite(values)
    for v, m in zip(values, where, strict=True):
        if not v.is_floating_point():
            continue
        bad = ~torch.isfinite(v)
        if m is None or m.shape != v.shape:
            if bool(bad.any()):
                return False
        elif not torch.equal(bad, m):
            return False
    return True


@dataclass
class Referee:
    """The task as the referee holds it."""

    device: torch.device
    namespace: dict[str, Any]
    model: Any
    init_seed: int
    inputs_on_device: bool
    init_on_device: bool
    compiled: Any = None
    compiled_error: str | None = None
    flusher: Flusher | None = None
    scratch: torch.Tensor | None = None
    quiet_us: float | None = None
    """The canary's median with the GPU idle (measured at the task's start)."""
    last_outputs: list[list[torch.Tensor]] = field(default_factory=list)
    """The last timed batch's outputs, held until the next batch as a candidate holds its own."""
    out_metas: list[dict[str, Any]] = field(default_factory=list)

    def draw(
        self,
        seed: int,
        scale: float = 1.0,
        on_device: bool | None = None,
        skip: int = 0,
        overrides: Mapping[str, int] | None = None,
    ) -> list[Any]:
        """A trial's or timed call's inputs (as the spare draws them; at a held-out shape with ``overrides``)."""
        where = self.inputs_on_device if on_device is None else on_device
        ns = self.namespace
        if where:
            return make_inputs(ns, seed, self.device, on_device=True, scale=scale, skip=skip, overrides=overrides)
        cpu = make_inputs(ns, seed, torch.device("cpu"), scale=scale, skip=skip, overrides=overrides)
        return to_device(cpu, self.device)

    def float64(self) -> Any:
        """A float64 copy of the model (made per ``truth`` op and dropped after it: the memory plan
        counts it as the truth's, not as the referee's own), or None where it cannot be made."""
        try:
            return copy.deepcopy(self.model).to(torch.float64)
        except Exception as exc:  # noqa: BLE001 - truth() then records why there is no float64 run
            log(f"no float64 copy of the model: {type(exc).__name__}: {exc}")
            return None


def start_task(msg: TaskOp, device: torch.device, channel: Channel) -> Referee:
    """Build the task (model, baseline, canary, range scales) and report ``task_ready``."""
    laps = Laps()
    ns = load_reference(msg["reference_source"])
    init_seed = int(msg["init_seed"])
    init_on_device = device.type == "cuda" and bool(msg.get("init_on_device"))
    try:
        init_args = init_inputs(ns)
        model = None if init_on_device else build_model(ns["Model"], init_args, init_seed, torch.device("cpu"), False)
    except ReferenceFault:
        raise
    except Exception as exc:
        raise ReferenceFault(f"building the reference failed: {type(exc).__name__}: {exc}") from exc
    laps.lap("build_s")
    ref = Referee(
        device=device,
        namespace=ns,
        model=model,
        init_seed=init_seed,
        inputs_on_device=device.type == "cuda" and bool(msg.get("inputs_on_device")),
        init_on_device=init_on_device,
    )
    if msg.get("compiled_only"):
        return _compiled_only(ref, msg, init_args, channel, laps)
    with channel.gpu_lease(device):
        try:
            _model_on_device(ref, init_args)
            if msg.get("light"):  # a truth worker: the model is all it needs
                laps.lap("model_s")
                channel.release_gpu(device)
                channel.send(Report.TASK_READY, out_metas=[], init_on_device=ref.init_on_device, phases=laps.seconds)
                return ref
            try:
                sample = ref.draw(int(msg["calibrate_seed"]))
            except ReferenceFault:
                raise
            except Exception as exc:
                raise ReferenceFault(f"get_inputs() failed: {type(exc).__name__}: {exc}") from exc
            args = clone_inputs(sample)
            with torch.no_grad(), exact_fp32():
                raw = ref.model(*args)
                structure = output_structure(raw)
                outs = tensors(raw, "Model.forward")
                del raw
                if sum(o.numel() * o.element_size() for o in outs) <= DETERMINISM_MAX_BYTES:
                    again = tensors(ref.model(*clone_inputs(sample)), "Model.forward")
                    _require_deterministic(outs, again)
                    del again
            mutated = [i for i, (a, b) in enumerate(zip(args, sample, strict=True)) if not _unchanged(a, b)]
            del args
        except ReferenceFault:
            raise
        except Exception as exc:
            raise ReferenceFault(f"the reference's forward failed: {type(exc).__name__}: {exc}") from exc
        laps.lap("forward_s")
        ref.out_metas = [
            {
                "dtype": str(o.dtype).removeprefix("torch."),
                "shape": list(o.shape),
                "nbytes": o.numel() * o.element_size(),
                "stride": list(o.stride()),
                "contiguous": o.is_contiguous(),
            }
            for o in outs
        ]
        defaults = default_errors(ref, sample, outs)
        laps.lap("defaults_s")
        nonfinite = [~torch.isfinite(o) if o.is_floating_point() else None for o in outs]
        floating = sum(o.numel() for o in outs if o.is_floating_point())
        nonfinite_share = sum(int(m.sum()) for m in nonfinite if m is not None) / max(1, floating)
        scales = _range_scales(ref, int(msg["calibrate_seed"]), nonfinite)
        del nonfinite
        laps.lap("range_s")
        ranged = [range_defaults(ref, int(msg["calibrate_seed"]), s) for s in scales] if defaults else []
        laps.lap("range_defaults_s")
        flops = count_flops(ref.model, sample)
        laps.lap("flops_s")
        profile = reference_profile(ref.model, sample, device)
        laps.lap("profile_s")
        floor = _calibrate(ref)
        laps.lap("calibrate_s")
    if msg.get("compiled_baseline"):
        ref.compiled, ref.compiled_error = build_compiled(ref.model, sample, device, channel)
        laps.lap("compiled_s")
    params = sum(p.numel() * p.element_size() for p in list(ref.model.parameters()) + list(ref.model.buffers()))
    in_bytes = sum(v.numel() * v.element_size() for v in sample if isinstance(v, torch.Tensor))
    out_bytes = sum(int(m["nbytes"]) for m in ref.out_metas)
    del sample, outs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    channel.send(
        Report.TASK_READY,
        flops=flops,
        bytes_moved=in_bytes + out_bytes + params,
        input_bytes=in_bytes,
        out_dtype=ref.out_metas[0]["dtype"] if ref.out_metas else "float32",
        out_metas=ref.out_metas,
        out_structure=structure,
        range_scales=scales,
        nonfinite_share=nonfinite_share,
        mutated_inputs=mutated,
        default_errors=defaults,
        range_default_errors=ranged,
        op_profile=profile,
        **_baseline_fields(ref, floor, laps),
    )
    return ref


def reference_profile(model: torch.nn.Module, sample: list[Any], device: torch.device) -> dict[str, Any] | None:
    """The reference's forward timed op by op (:func:`profile_ops`), or ``None`` where that fails:
    the profile only informs the report and the search, never a verdict."""
    try:
        return profile_ops(model, lambda: clone_inputs(sample), device)
    except Exception as exc:  # noqa: BLE001 - a missing profile leaves the shares unmeasured, logged
        log(f"op profile failed: {type(exc).__name__}: {exc}")
        return None


def _baseline_fields(ref: Referee, floor: float | None, laps: Laps) -> dict[str, Any]:
    """What every ``task_ready`` of a referee that times baselines says: whether it has the
    compiled baseline, its calibration (canary, spin rate, flush, empty-kernel floor), its laps."""
    assert ref.flusher is not None
    return {
        "compiled": ref.compiled is not None,
        "compiled_error": ref.compiled_error,
        "init_on_device": ref.init_on_device,
        "canary_quiet_us": ref.quiet_us,
        "cycles_per_us": ref.flusher.cycles_per_us,
        "empty_kernel_us": floor,
        "flush_us": ref.flusher.flush_us,
        "phases": laps.seconds,
    }


def _calibrate(ref: Referee) -> float | None:
    """The flusher, the canary's quiet latency and the empty-kernel floor (under the lease)."""
    ref.flusher = Flusher(ref.device, measure=True)
    if ref.device.type != "cuda":
        return None
    ref.scratch = torch.zeros(1, device=ref.device)
    quiet = sorted(canary_us(ref.device, ref.scratch) for _ in range(CANARY_QUIET_CALLS))
    ref.quiet_us = quiet[len(quiet) // 2]
    return empty_kernel_us(ref.device, ref.scratch, ref.flusher)


def _model_on_device(ref: Referee, init_args: list[Any]) -> None:
    """The model on the referee's device: built there where it was not built on the CPU (and on
    the CPU where its constructor refuses the device)."""
    if ref.model is None:
        ns, seed = ref.namespace, ref.init_seed
        try:
            ref.model = build_model(ns["Model"], init_args, seed, ref.device, True)
        except Exception as exc:  # noqa: BLE001 - a constructor that needs the CPU: as before
            log(f"building the model on the device failed, on the CPU instead: {type(exc).__name__}: {exc}")
            ref.init_on_device = False
            ref.model = build_model(ns["Model"], init_args, seed, torch.device("cpu"), False)
    ref.model = ref.model.to(ref.device)


def _compiled_only(ref: Referee, msg: TaskOp, init_args: list[Any], channel: Channel, laps: Laps) -> Referee:
    """A ``compiled_only`` task: the model, its canary and flusher (under the lease), then the
    compiled model (the compilation gives the lease back while it runs on the CPU) and
    ``task_ready``. The reference already passed the referee's checks: nothing else is measured."""
    with channel.gpu_lease(ref.device):
        try:
            _model_on_device(ref, init_args)
            sample = ref.draw(int(msg["calibrate_seed"]))
        except ReferenceFault:
            raise
        except Exception as exc:
            raise ReferenceFault(f"building the compiled baseline's model failed: {type(exc).__name__}: {exc}") from exc
        laps.lap("model_s")
        floor = _calibrate(ref)
        laps.lap("calibrate_s")
    ref.compiled, ref.compiled_error = build_compiled(ref.model, sample, ref.device, channel)
    laps.lap("compiled_s")
    del sample
    if ref.device.type == "cuda":
        torch.cuda.empty_cache()
    channel.send(Report.TASK_READY, out_metas=[], **_baseline_fields(ref, floor, laps))
    return ref


DETERMINISM_MAX_BYTES = 1 << 30
"""Outputs up to this size are computed twice at the task's start to find a forward that differs
from itself; larger ones are not (a second copy of gigabytes beside the referee's own, while
spares start, for a check of the task file, not of a candidate)."""
DETERMINISM_CHUNK = 1 << 22


def _require_deterministic(first: list[torch.Tensor], second: list[torch.Tensor]) -> None:
    """:class:`ReferenceFault` where two runs of the forward on the same inputs disagree beyond
    the float tolerance of their dtype (:data:`gpu_runner.stats.DEFAULT_TOLERANCES`; other dtypes
    and NaN/Inf positions exactly): random outputs (``randn_like``, dropout in training mode)
    cannot be matched by any kernel. Differences within the tolerance (atomics summing in another
    order) are judged as usual: the reference's own error covers them."""
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ReferenceFault(f"the reference's forward is not deterministic: output {i} changed shape or dtype")
        name = str(a.dtype).removeprefix("torch.")
        if not a.is_floating_point() or name not in DEFAULT_TOLERANCES:
            if not torch.equal(a, b):
                raise ReferenceFault(f"the reference's forward is not deterministic: output {i} ({name}) differs")
            continue
        atol, rtol = DEFAULT_TOLERANCES[name]
        if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
            raise ReferenceFault(f"the reference's forward is not deterministic: output {i}'s NaN/Inf moved")
        outside, worst = 0, 0.0
        fa, fb = a.reshape(-1), b.reshape(-1)
        for lo in range(0, fa.numel(), DETERMINISM_CHUNK):
            x, y = fa[lo : lo + DETERMINISM_CHUNK].double(), fb[lo : lo + DETERMINISM_CHUNK].double()
            bad = ~torch.isclose(x, y, rtol=rtol, atol=atol) & torch.isfinite(x)
            if bool(bad.any()):
                outside += int(bad.sum())
                worst = max(worst, float((x - y).abs()[bad].max()))
        if outside:
            share = outside / max(1, fa.numel())
            raise ReferenceFault(
                f"the reference's forward is not deterministic: two runs on the same inputs differ in "
                f"{share:.1%} of output {i}'s elements (by up to {worst:.3g}, beyond atol={atol:g} rtol={rtol:g}); "
                "random outputs (randn_like, dropout in training mode) cannot be matched by any kernel"
            )


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True)
    )


PARITY_MAX_BYTES = 4 << 30
"""Outputs up to this size are always measured at PyTorch's defaults. Larger ones are measured
where the device has the room (:func:`parity_room`: on a GPU, a second copy of them and, where the
defaults differ, a float64 run beside the referee's own, at the task's start before any spare
holds memory); elsewhere such tasks keep the exact rule, which holds a candidate to a stricter
standard than the user's own model (issue 34: KernelBench L1-63's 8.5 GB output kept TF32
convolutions out)."""
PARITY_HEADROOM = 0.8
"""Share of the device's free memory the defaults' measurement may take (as the memory plan's)."""
PARITY_SPREAD = 0.01
"""Where the reference's IEEE float32 forward differs from itself (atomics summing in another
order), its error at PyTorch's defaults is granted only if that spread (relative L2) is at most
this share of it: the defaults' error is then the precision, not the noise of the runs. Random
forwards never get here (the referee refuses them as tasks)."""


def parity_room(ref: Referee, sample: list[Any], exact: list[torch.Tensor]) -> str | None:
    """Why :func:`default_errors` cannot run beside the referee's own outputs (None: it can).
    At its peak it holds the defaults' outputs (and a second IEEE float32 run's, where that run
    differs from the first) beside a float64 run: float64 outputs, one float64 intermediate as
    large (a fused chain's), float64 inputs and a float64 model."""
    out_bytes = sum(e.numel() * e.element_size() for e in exact)
    if out_bytes <= PARITY_MAX_BYTES:
        return None
    if ref.device.type != "cuda":
        return f"outputs of {out_bytes / (1 << 30):.1f} GiB off the GPU"
    out64 = 8 * sum(e.numel() for e in exact)
    in64 = 8 * sum(v.numel() for v in sample if isinstance(v, torch.Tensor))
    params64 = 8 * sum(p.numel() for p in list(ref.model.parameters()) + list(ref.model.buffers()))
    need = 2 * out_bytes + 2 * out64 + in64 + params64
    free, _ = torch.cuda.mem_get_info(ref.device)
    free += torch.cuda.memory_reserved(ref.device) - torch.cuda.memory_allocated(ref.device)
    if need > PARITY_HEADROOM * free:
        return f"needs {need / (1 << 30):.1f} GiB, the device has {free / (1 << 30):.1f} GiB free"
    return None


def default_errors(ref: Referee, sample: list[Any], exact: list[torch.Tensor]) -> list[dict[str, float] | None] | None:
    """Per output, the error against float64 of the reference run as a user's model runs, with
    PyTorch's defaults (TF32 in cuDNN convolutions; whatever the reference file itself set): its
    relative L2 error (``rel_l2``) and its largest error over the truth's RMS (``max_rms``); the
    IEEE float32 run's relative L2 error beside (``exact_rel_l2``) and how far a second IEEE run
    differs from the first (``ieee_spread_rel_l2``, 0 where they agree bit for bit). ``None``
    where the defaults give the IEEE float32 outputs bit for bit (no precision to grant: the rule
    stays the exact one, and no float64 run is spent here) or where the float64 run fails;
    ``None`` per output that is not floating, whose float64 shape differs, or whose IEEE spread
    is not negligible beside its error at the defaults (:data:`PARITY_SPREAD`)."""
    short = parity_room(ref, sample, exact)
    if short is not None:
        log(f"no room to measure the reference's precision at PyTorch's defaults ({short}): the exact rule stays")
        return None
    with torch.no_grad():
        outs = tensors(ref.model(*clone_inputs(sample)), "Model.forward (PyTorch's defaults)")
        if _same(outs, exact):
            return None
        with exact_fp32():
            again = tensors(ref.model(*clone_inputs(sample)), "Model.forward")
        shapes = [(a.shape, a.dtype) for a in again] != [(e.shape, e.dtype) for e in exact]
        if shapes:
            log("the reference's IEEE float32 forward changed its outputs' shapes: no precision parity")
            return None
        # A forward that differs from itself (cuDNN's transposed convolutions sum with atomics in
        # IEEE float32: KernelBench L2-2 spreads 1e-8 where its TF32 errs 7e-5) is granted its
        # defaults' error only per output where that spread is negligible beside it (below).
        spread = None if _same(again, exact) else again
        del again
        model64 = ref.float64()
        if model64 is None:
            return None
        try:
            outs64 = tensors(model64(*as_double(sample)), "Model.forward (float64)")
        except Exception as exc:  # noqa: BLE001 - no float64 run: the exact rule stays
            log(f"no float64 run for the defaults' error: {type(exc).__name__}: {exc}")
            return None
        found: list[dict[str, float] | None] = []
        for o, e, t in zip(outs, exact, outs64, strict=False):
            if not o.is_floating_point() or o.shape != t.shape or e.shape != t.shape:
                found.append(None)
                continue
            sq_t, sq_d, worst = error_sums(t, o)
            sq_x = error_sums(t, e)[1]
            sq_y = error_sums(e, spread[len(found)])[1] if spread is not None else 0.0
            if not all(math.isfinite(v) for v in (sq_t, sq_d, sq_x, sq_y, worst)) or sq_t <= 0:
                found.append(None)
                continue
            rel_l2, ieee_spread = math.sqrt(sq_d / sq_t), math.sqrt(sq_y / sq_t)
            if ieee_spread > PARITY_SPREAD * rel_l2:
                log(
                    f"output {len(found)}: the reference's IEEE float32 forward differs from itself by "
                    f"{ieee_spread:.2e} (relative L2), not negligible beside its error at the defaults "
                    f"({rel_l2:.2e}): no precision parity for it"
                )
                found.append(None)
                continue
            found.append(
                {
                    "rel_l2": rel_l2,
                    "max_rms": worst / math.sqrt(sq_t / t.numel()),
                    "exact_rel_l2": math.sqrt(sq_x / sq_t),
                    "ieee_spread_rel_l2": ieee_spread,
                }
            )
        del outs64, model64, spread
    log(f"the reference at PyTorch's defaults against float64: {found}")
    return found


def range_defaults(ref: Referee, seed: int, scale: float) -> list[dict[str, float] | None] | None:
    """:func:`default_errors` on inputs drawn at a range trial's ``scale``, where the reference's
    error at its defaults has a shape of its own: KernelBench L2-52 (a TF32 convolution, an
    activation, a batch norm) errs 0.0019 of its outputs' RMS at most at scale 1 and 0.024 at
    1e6, so the typical draws' measure held its range trials to a standard its own model misses
    by 12x. ``None`` where it cannot be measured (the typical draws' then stands)."""
    try:
        sample = ref.draw(seed, scale)
        with torch.no_grad(), exact_fp32():
            exact = tensors(ref.model(*clone_inputs(sample)), "Model.forward")
        return default_errors(ref, sample, exact)
    except Exception as exc:  # noqa: BLE001 - the typical draws' measure stands
        log(f"no measure of the defaults' error at scale {scale:g}: {type(exc).__name__}: {exc}")
        return None


def _range_scales(ref: Referee, seed: int, nonfinite: list[torch.Tensor | None]) -> list[float]:
    """The input scales of the range trials: the largest of :data:`LARGE_SCALES` and of
    :data:`SMALL_SCALES` at which the reference's outputs stay finite, or, where they hold NaN/Inf
    at scale 1 (``nonfinite``: per output, where; ``log`` of a normal draw), keep them exactly
    there (none where no floating input exists or no scale does)."""
    chosen: list[float] = []
    for ladder in (LARGE_SCALES, SMALL_SCALES):
        for scale in ladder:
            try:
                inputs = ref.draw(seed, scale)
                if not any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in inputs):
                    return []
                with torch.no_grad(), exact_fp32():
                    outs = tensors(ref.model(*inputs), "Model.forward")
            except Exception as exc:  # noqa: BLE001 - a scale the reference cannot take is not used
                log(f"range scale {scale:g}: {type(exc).__name__}: {exc}")
                continue
            if _nonfinite_as(outs, nonfinite) and all(
                math.isfinite(float(o.double().abs().nan_to_num(0.0, 0.0, 0.0).sum()))
                for o in outs
                if o.is_floating_point()
            ):
                chosen.append(scale)
                break
    return chosen


def serve_truth(ref: Referee, msg: TruthOp, channel: Channel) -> None:
    """Ship the reference outputs and float64 residuals of ``msg``'s seeds, then ``reference_done``."""
    laps = Laps()
    shipments: list[Shipment] = []
    first = int(msg["first"])
    parity = [bool(x) for x in msg.get("parity") or []]
    with channel.gpu_lease(ref.device):
        model64 = ref.float64()
        on_device = True if msg["on_device"] else None
        overrides = list(msg.get("overrides") or [{} for _ in msg["seeds"]])
        for k, (seed, skip, scale, sizes) in enumerate(
            zip(msg["seeds"], msg["skips"], msg["scales"], overrides, strict=True)
        ):
            inputs = ref.draw(int(seed), float(scale), on_device=on_device, skip=int(skip), overrides=sizes)
            outs, residuals, fp64_error, measured = truth(ref.model, model64, inputs, parity)
            shipments.append((first + k, [o.detach() for o in outs + residuals], len(outs), fp64_error, measured))
        del model64
        laps.lap("forward_s")
    ship(shipments, ref.device, channel, laps)
    del shipments
    if ref.device.type == "cuda":
        torch.cuda.empty_cache()
    channel.send(Report.REFERENCE_DONE, phases=laps.seconds)


def serve_batch(ref: Referee, msg: BatchOp, channel: Channel) -> None:
    """One timed batch of a baseline (the parent holds the GPU for it), the canary first."""
    assert ref.flusher is not None
    which = msg["callable"]
    if which == "compiled" and ref.compiled is not None:
        compiled = ref.compiled

        def fn(inputs: list[Any]) -> object:
            return compiled(*inputs)
    elif which == "eager":
        model = ref.model

        def fn(inputs: list[Any]) -> object:
            return model(*inputs)
    else:
        channel.send(Report.ERROR, stage="timing", etype="ProtocolError", message=f"no baseline {which!r} here")
        return
    t_canary = time.perf_counter()
    canary, busy_ms = wait_idle(ref) if msg["canary"] else (None, 0.0)
    extra_s = time.perf_counter() - t_canary
    ref.last_outputs = []  # the last batch's outputs go now, as a candidate's do (the same allocations)
    result = run_batch(
        msg,
        fn,
        lambda seed, n, laps: make_batch_inputs(ref.namespace, seed, n, ref.device, True, laps, msg.get("overrides")),
        ref.device,
        ref.flusher,
    )
    t_reset = time.perf_counter()
    l2_reset = ref.flusher.reset_persisting()
    extra_s += time.perf_counter() - t_reset
    # The same host copies of small outputs as the candidate's batch (the parent drops them).
    ref.last_outputs = send_timed(
        channel,
        msg,
        ref.device,
        result,
        canary_us=canary,
        busy_ms=busy_ms,
        flush_bytes=ref.flusher.nbytes,
        l2_reset=l2_reset,
        referee_extra_us=extra_s * 1e6,
    )


BUSY_POLL_S = 0.5
"""How long the referee waits for a busy GPU to go idle before it times anyway."""


def wait_idle(ref: Referee) -> tuple[float, float]:
    """The canary now, and how long the GPU then stayed busy (ms; the referee waits for it, up to
    :data:`BUSY_POLL_S`, so nothing left running inflates the baseline it times next)."""
    first = canary_us(ref.device, ref.scratch)
    if ref.quiet_us is None or first <= max(200.0, 10.0 * ref.quiet_us):
        return first, 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < BUSY_POLL_S:
        if canary_us(ref.device, ref.scratch) <= max(200.0, 10.0 * ref.quiet_us):
            break
    return first, (time.perf_counter() - t0) * 1e3


def serve_canary(ref: Referee, channel: Channel) -> None:
    canary, busy_ms = wait_idle(ref)
    channel.send(Report.CANARY, host_us=canary, busy_ms=busy_ms)
