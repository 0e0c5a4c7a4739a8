"""The memory plan of a task: how many trials, spares and verdict slots fit the GPU and the host.

A worker measures the reference's working set without running it for real (``measure`` op: the
model and ``get_inputs()`` on PyTorch's ``meta`` device, so a 6 GB input costs nothing) and reports
the device's free memory. From those bytes this module derives what every role of the evaluator
holds at its peak and picks the largest configuration that fits, with headroom:

* the referee (one per task, never a candidate) holds the model, the ``torch.compile`` baseline's
  buffers, a timed batch's inputs and outputs and, while it computes the truth of a trial, the
  float64 copies of model, inputs and outputs;
* truth workers (small tasks only: :func:`truth_workers`) each hold the model and one trial's truth;
* a prepared spare holds every trial's inputs (and, where the judge reads them in place, the
  output buffers of its trials and shipped timed calls);
* the worker running a candidate holds its spare's data plus the candidate's model, its outputs,
  their snapshot and the poisoned allocator memory, or a timed batch's inputs and kept outputs;
* the host holds, per prepared spare, the reference outputs and float64 residuals and the
  candidate's output files (page-locked tmpfs).

Large outputs (``device_verdict``) are compared on the GPU by a trusted judge process after the
candidate's process is gone (:mod:`gpu_runner.judge`); the parent then never holds them.
A task that cannot fit even one evaluation raises :class:`TaskTooLarge` with what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_runner.errors import TaskTooLarge

GIB = 1 << 30
CONTEXT_BYTES = 600 << 20
"""A CUDA context with torch and Triton loaded, per process (about 500 MB on an H100/H200)."""
DEVICE_HEADROOM = 0.8
"""Share of the device's free memory the plan may use (fragmentation, allocator rounding, workspaces,
the compiled baseline's own buffers). At 0.85 a 6 GB elementwise task ran out of memory on an H200,
but then the quick check alone took ten times the output in float64 temporaries (now bounded)."""
HOST_HEADROOM = 0.6
"""Share of the host's available memory the plan may use (the page cache, compiles, the actors)."""
DEVICE_VERDICT_BYTES = 256 << 20
"""Outputs of a trial at least this large are compared on the GPU, not shipped to the parent's numpy."""
JUDGE_CHUNK_ELEMENTS = 1 << 26
"""Elements the judge compares per step (64M: 2 GB of float64 temporaries at most, 3 arrays wide)."""
ON_DEVICE_BYTES = 256 << 20
"""Models (parameters and buffers) at least this large are created on the GPU itself
(``gpu_runner.sandboxed.reference.build_model``): 8 GB of initialised weights take seconds and
gigabytes of host memory on the CPU. The compile stage builds such a model with empty parameters
(``gpu_runner.sandboxed.compiling``)."""
INPUTS_ON_DEVICE_BYTES = 1 << 20
"""Inputs (per trial) at least this large are drawn on the GPU itself
(``gpu_runner.sandboxed.reference.make_inputs``), by every spare for every candidate's fresh
seeds. Drawn on one CPU thread, the five trials of KernelBench L1-2 (192 MiB of ``torch.randn``
each) were 1.95-2.01 s of a spare's 3.6-4.5 s preparation on a 4x H200 host (its ``build_s``),
and two spares' preparations bounded that task's evaluations (two per ~5.3 s). Drawn on the
GPU, ``build_s`` was 0.002-0.005 s for L1-2 and L1-3 on an H100 (bench/results/startup_h100.md).
A ``get_inputs`` that needs the CPU falls back to it."""
LARGE_BYTES = 1 << 30
"""Above this many bytes per trial, a running candidate's process makes no copies: inputs are used
in place and timed from the trials' own buffers (:class:`gpu_runner.sandboxed.timing.Rotation`), outputs are
fingerprinted instead of snapshotted (each copy of a 6 GB tensor was the difference between fitting
the GPU and not)."""
WORK_BYTES = 512 << 20
"""Fixed scratch of a process that runs or times calls: the L2 flush buffer (twice the L2) and
the allocator's rounding around it."""
SAFETY = 1.15
"""Factor on the summed device needs before they are compared with the budget."""
MIN_TRIALS = 2
"""Fewest correctness trials a plan may cut to: a single input draw lets a lucky kernel through."""
SHIP_ALL_BYTES = 1 << 20
"""Outputs of one call up to this size come back with every timed batch (a host copy of a few
tens of microseconds, inside the clocked window); larger ones are shipped on demand
(:mod:`gpu_runner.timing_session`)."""
SHIPPED_CALLS = 2
"""Timed calls shipped and judged where outputs stay in the candidate's process (larger ones);
one where the judge compares them on the device (each is a whole output's buffer)."""
TRUTH_WORKERS = 2
"""Truth workers alive at once, where a plan has them."""
TRUTH_WORKER_BYTES = 2 << 30
"""A truth worker (its context, the model and one trial's truth) at most this large: a larger
task's truths are the referee's (one at a time, in memory the plan already holds)."""
MAX_BATCH = 32
"""Most calls in one timed batch."""
TIMING_INPUT_BYTES = 1 << 30
"""A batch draws every call's inputs before its first call: at most this many bytes of them."""
KEPT_OUTPUT_BYTES = 1 << 30
"""A candidate keeps a batch's outputs (for a ``ship``): at most this many bytes of them."""
DEVICE_VERDICT_TRIALS = 3
"""Most trials for a task whose outputs the judge compares: each trial moves its outputs, the
reference's and the residuals through host files (three passes over gigabytes), and three fresh
draws of gigabyte inputs leave a lucky kernel no more room than five small ones."""


@dataclass(frozen=True)
class Footprint:
    """The reference's working set, in bytes, as the ``measure`` op reports it."""

    input_bytes: int
    """One trial's input tensors."""
    output_bytes: int
    """One trial's output tensors."""
    param_bytes: int
    """The model's parameters and buffers."""
    largest_tensor_bytes: int
    """The largest single input or output (stands in for the forward's intermediates)."""
    device_free: int | None = None
    """Free device memory the measuring worker saw (None on the CPU)."""
    device_total: int | None = None
    method: str = "meta"
    """How the sizes were found (``meta``, ``fake``), or why they could not be (``unknown: ...``)."""

    @classmethod
    def from_wire(cls, info: dict[str, Any]) -> Footprint:
        def num(key: str) -> int:
            return max(0, int(info.get(key) or 0))

        free, total = info.get("device_free"), info.get("device_total")
        return cls(
            input_bytes=num("input_bytes"),
            output_bytes=num("output_bytes"),
            param_bytes=num("param_bytes"),
            largest_tensor_bytes=num("largest_tensor_bytes"),
            device_free=int(free) if free is not None else None,
            device_total=int(total) if total is not None else None,
            method=str(info.get("method") or "meta"),
        )


@dataclass(frozen=True)
class MemoryPlan:
    """What the evaluator keeps for one task (see the module docstring)."""

    trials: int
    spares: int
    device_verdict: bool
    """Trial outputs are compared on the GPU by the judge after the candidate's process ended."""
    shared_outputs: bool
    """The judge reads the trial outputs from buffers the spare shares (device memory on CUDA)
    instead of host files (:mod:`gpu_runner.sandboxed.shared_slots`)."""
    poison_bytes: int
    """Allocator memory handed to the candidate NaN-filled before each trial."""
    compiled_baseline: bool
    """Whether the torch.compile baseline fits beside the evaluation."""
    device_per_eval: int
    """Device bytes one evaluation needs at its peak (the referee and the judge included)."""
    device_per_spare: int
    """Device bytes each further idle prepared spare holds."""
    device_per_candidate: int
    """Device bytes the process running a candidate may hold at its peak (its spare's data, the
    trials' and timing's buffers, with the safety margin): an out-of-memory below it is not the
    candidate's fault."""
    host_per_spare: int
    """Host bytes per prepared spare (reference data and output files)."""
    device_budget: int | None
    host_budget: int
    footprint: Footprint
    notes: list[str] = field(default_factory=list)
    device_referee: int = 0
    """Device bytes the task's referee holds at its peak (its model, baseline, a batch or a truth)."""
    timed_slots: int = 0
    """Output buffers each spare keeps for timed calls shipped for judgment (larger outputs)."""
    truth_workers: int = 0
    """Truth workers at once (0: the referee computes every truth itself)."""
    compile_aside: bool = False
    """The ``torch.compile`` baseline is built in a process of its own beside the referee, its
    bytes (:func:`aside_bytes`) held back from the device budget (``reserved``)."""

    def summary(self) -> str:
        """One line for logs and the evaluation's checks."""
        dev = f"{self.device_per_eval / GIB:.1f} GiB device per evaluation" if self.device_budget else "CPU"
        how = "compared on the GPU after the candidate ended" if self.device_verdict else "compared on the host"
        if self.shared_outputs:
            how += ", handed over in shared memory"
        text = (
            f"{self.trials} trials, {self.spares} spare(s); {dev}, {self.host_per_spare / GIB:.1f} GiB host per "
            f"spare; outputs {how}"
        )
        return text + ("; " + "; ".join(self.notes) if self.notes else "")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def timed_slots(fp: Footprint, device_verdict: bool, ship_all_bytes: int = SHIP_ALL_BYTES) -> int:
    """Output buffers a spare keeps for shipped timed calls (none: their outputs come back with the batch)."""
    if fp.output_bytes <= ship_all_bytes:
        return 0
    return 1 if device_verdict else SHIPPED_CALLS


def truth_workers(fp: Footprint, device_verdict: bool, large: int = LARGE_BYTES) -> int:
    """Truth workers for the task: none where the judge computes the truth (outputs judged on the
    device) or where one would be large (:data:`TRUTH_WORKER_BYTES`)."""
    if device_verdict:
        return 0
    truth = _device_needs(fp, 1, 0, False, False, large)[3]
    return TRUTH_WORKERS if CONTEXT_BYTES + fp.param_bytes + truth <= TRUTH_WORKER_BYTES else 0


def _timing_stage(fp: Footprint, keep: bool) -> int:
    """A timed batch's inputs (every call's, drawn first) and the outputs alive at once (every
    call's where they come back with the batch or are kept for a ship)."""
    i, o, big = fp.input_bytes, fp.output_bytes, fp.largest_tensor_bytes
    inputs = min(MAX_BATCH * i, max(i, TIMING_INPUT_BYTES))
    outputs = min(MAX_BATCH * o, max(o, KEPT_OUTPUT_BYTES)) if keep else o
    return inputs + outputs + big


def _device_needs(
    fp: Footprint,
    trials: int,
    poison: int,
    compiled: bool = True,
    judged: bool = False,
    large: int = LARGE_BYTES,
    ship_all_bytes: int = SHIP_ALL_BYTES,
) -> tuple[int, int, int, int, tuple[int, int]]:
    """Device bytes of each role: (idle prepared spare, the referee's own, the referee's timed
    batch, the referee's truth or judgment, and the running candidate's process beyond its spare's
    own during its trials and beyond its context and output buffers during its timing)."""
    i, o, p, big = fp.input_bytes, fp.output_bytes, fp.param_bytes, fp.largest_tensor_bytes
    idle = CONTEXT_BYTES + trials * i
    # The referee keeps the model and the flush buffer; the compiled baseline's buffers live only
    # while it runs (in the timed batch). A trial's truth (and, for outputs judged on the device,
    # the judgment, which the referee also does) needs the inputs and outputs, the float64 copies
    # of model, inputs and outputs, the residual, and the judge's chunked temporaries.
    base = CONTEXT_BYTES + p + WORK_BYTES
    keep = o <= ship_all_bytes  # a batch's outputs all alive until they are sent
    batch = _timing_stage(fp, keep) + ((o + big) if compiled else 0) // 2
    chunk = 3 * 8 * min(JUDGE_CHUNK_ELEMENTS, max(1, o // 4)) if judged else 0
    truth = i + o + 2 * (p + i + o) + o + chunk
    # the candidate's model; trials: the working inputs and the outputs' snapshot (small ones
    # only), the outputs, one intermediate, the poison; timing: a batch's inputs and the outputs
    # kept for a ship; both: the flush buffer and scratch
    small_in, small_out = i <= large, o <= large
    trials_stage = (i if small_in else 0) + (2 * o if small_out else o) + big + poison
    running = (p + trials_stage + WORK_BYTES, p + _timing_stage(fp, True) + WORK_BYTES)
    return idle, base, batch, truth, running


def aside_bytes(fp: Footprint, ship_all_bytes: int = SHIP_ALL_BYTES) -> int:
    """Device bytes of the ``torch.compile`` baseline's own process where it is built beside the
    referee: its context, the model, the flush buffer and scratch, and a timed batch with the
    compiled graph's buffers, counted as the referee's own batch counts them (:func:`_device_needs`)."""
    o, big = fp.output_bytes, fp.largest_tensor_bytes
    batch = _timing_stage(fp, o <= ship_all_bytes) + (o + big) // 2
    return CONTEXT_BYTES + fp.param_bytes + WORK_BYTES + batch


def _host_per_spare(fp: Footprint, trials: int) -> int:
    """A prepared spare's reference outputs and their float64 residuals (float32), as host files."""
    return trials * 2 * fp.output_bytes


def _host_running(fp: Footprint, slots: int) -> int:
    """The running candidate's reference data plus its output files (made when its job arrives)."""
    return slots * 3 * fp.output_bytes


def plan(
    fp: Footprint,
    *,
    device: str,
    max_trials: int,
    max_spares: int,
    host_available: int,
    device_free: int | None = None,
    device_verdict_bytes: int = DEVICE_VERDICT_BYTES,
    large_bytes: int = LARGE_BYTES,
    shared_outputs: bool = False,
    compiled_baseline: bool = True,
    ship_all_bytes: int = SHIP_ALL_BYTES,
    reserved: int = 0,
) -> MemoryPlan:
    """The largest configuration that fits, or :class:`TaskTooLarge` naming what one evaluation needs.

    On the CPU the tensors the workers hold (what a GPU would keep in device memory) are host
    memory: they count against the host's budget with the output files. ``compiled_baseline``
    False: no torch.compile baseline is timed, so none is planned for. ``reserved``: device bytes
    held back from the budget for a process outside the plan's roles (the compiled baseline's,
    built aside: :func:`aside_bytes`).
    """
    free = device_free if device_free is not None else fp.device_free
    on_gpu = device == "cuda" and free is not None
    on_host = device != "cuda"
    device_budget = int(free * DEVICE_HEADROOM) - reserved if on_gpu and free is not None else None
    host_budget = int(host_available * HOST_HEADROOM)
    device_verdict = fp.output_bytes >= device_verdict_bytes
    notes: list[str] = []
    if device_verdict and max_trials > DEVICE_VERDICT_TRIALS:
        notes.append(f"{DEVICE_VERDICT_TRIALS} trials for outputs of {_gib(fp.output_bytes)}")
        max_trials = DEVICE_VERDICT_TRIALS
    if fp.method.startswith("unknown"):
        notes.append(f"sizes not measured ({fp.method}); planned as if small")
    o = fp.output_bytes
    full_poison = 2 * (fp.input_bytes + fp.output_bytes)

    shipped = timed_slots(fp, device_verdict, ship_all_bytes)
    workers = truth_workers(fp, device_verdict, large_bytes)

    def needs(trials: int, poison: int, spares: int, compiled: bool = True, shared: bool = False) -> tuple[int, int]:
        """(device, host) bytes with ``spares`` prepared spares waiting while a candidate runs;
        ``shared``: every spare also holds its outputs' buffers (trials and shipped timed calls)
        on the device until judged."""
        idle, base, batch, truth, running = _device_needs(
            fp, trials, poison, compiled, device_verdict, large_bytes, ship_all_bytes
        )
        slots = trials + shipped
        held = slots * o if shared and on_gpu else 0
        idle += held
        # judged: each worker's output files (the reference's data never goes to the host)
        host = (
            (spares + 1) * slots * o
            if device_verdict
            else _host_running(fp, slots) + spares * _host_per_spare(fp, trials)
        )
        # The candidate's process frees its trials' inputs before its timing; the referee's truth
        # (or its judgment, for outputs judged on the device) comes beside the trials of a
        # candidate for the next spare, or after the candidate's process is gone.
        trials_phase = idle + running[0]
        timing_phase = CONTEXT_BYTES + held + running[1] + batch
        if spares == 0 and device_verdict:  # one at a time: prepare, run, then judge
            dev = base + max(trials_phase, timing_phase, truth + held)
        else:  # a candidate runs while ``spares`` spares wait, one of them perhaps being prepared
            dev = base + spares * idle + max(trials_phase + truth, timing_phase)
        # truth workers beside it all: a spare's trials', a finished candidate's timed calls'
        dev += workers * (CONTEXT_BYTES + fp.param_bytes + truth)
        return (0, host + dev) if on_host else (dev, host)

    def fits(dev: int, host: int) -> bool:
        # The sums leave out the caching allocators' rounding and fragmentation: a margin (seen on
        # an H200: a process planned at ~96 GiB asked for 16 GiB more at 112 GiB).
        return (device_budget is None or dev * SAFETY <= device_budget) and host <= host_budget

    chosen: tuple[int, int, int, bool, bool] | None = None
    sharing = (True, False) if shared_outputs and device_verdict else (False,)
    # Shared output buffers save the host copy of every trial's output (measured on an H100 at
    # 4 GiB: 11 s of a 21 s evaluation): they come before a spare (which hides ~2 s of
    # preparation) and before a third trial (each trial already covers >= 256 MiB of outputs),
    # after the compiled baseline; the poison is cut before either is given up.
    for compiled in (True, False) if compiled_baseline else (False,):
        for share in sharing:
            for want in sorted({min(1, max_spares), 0}, reverse=True):
                for trials in range(max(1, max_trials), min(MIN_TRIALS, max_trials) - 1, -1):
                    for poison in (full_poison, full_poison // 4, full_poison // 16):
                        if fits(*needs(trials, poison, want, compiled, share)):
                            chosen = (trials, poison, want, compiled, share)
                            break
                    if chosen:
                        break
                if chosen:
                    break
            if chosen:
                break
        if chosen:
            break
    if chosen is None:
        need_dev, need_host = needs(min(MIN_TRIALS, max(1, max_trials)), full_poison // 16, 0, compiled=False)
        need_dev = int(need_dev * SAFETY)
        if device_budget is not None and need_dev > device_budget:
            raise TaskTooLarge(
                f"task needs ~{_gib(need_dev)} of device memory for one evaluation; this GPU has "
                f"{_gib(free or 0)} free, {_gib(device_budget)} of it usable with headroom (inputs "
                f"{_gib(fp.input_bytes)}, outputs {_gib(fp.output_bytes)}, parameters {_gib(fp.param_bytes)} per trial)"
            )
        raise TaskTooLarge(
            f"task needs ~{_gib(need_host)} of host memory for one evaluation; this host has "
            f"{_gib(host_available)} available (outputs {_gib(fp.output_bytes)} per trial)"
        )
    trials, poison, spares, compiled, shared = chosen
    while spares < max_spares and fits(*needs(trials, poison, spares + 1, compiled, shared)):
        spares += 1
    if shared_outputs and device_verdict and not shared:
        notes.append("outputs go through host files: shared device buffers do not fit beside the evaluation")
    per_eval = needs(trials, poison, 0, compiled, shared)[0]
    idle, base, batch, truth, running = _device_needs(
        fp, trials, poison, compiled, device_verdict, large_bytes, ship_all_bytes
    )
    referee = base + max(batch, truth)
    if shared and on_gpu:
        idle += (trials + shipped) * o
    running_peak = max(running)
    if not compiled and compiled_baseline:
        notes.append("no torch.compile baseline: it does not fit beside the evaluation")
    host = (trials + shipped) * fp.output_bytes if device_verdict else _host_per_spare(fp, trials)
    if on_host:
        host += idle  # the spare's tensors live in host memory too
    if trials < max_trials:
        notes.append(f"trials cut from {max_trials} to {trials} to fit")
    if poison < full_poison:
        notes.append(f"allocator poison cut to {_gib(poison)}")
    if spares < max_spares:
        notes.append(f"spares cut from {max_spares} to {spares} to fit")
    return MemoryPlan(
        trials=trials,
        spares=spares,
        device_verdict=device_verdict,
        shared_outputs=shared,
        poison_bytes=poison,
        compiled_baseline=compiled,
        device_per_eval=per_eval if on_gpu else 0,
        device_per_spare=idle if on_gpu else 0,
        device_per_candidate=int((idle + running_peak) * SAFETY) if on_gpu else 0,
        device_referee=referee if on_gpu else 0,
        timed_slots=shipped,
        truth_workers=workers,
        host_per_spare=host,
        device_budget=device_budget,
        host_budget=host_budget,
        footprint=fp,
        notes=notes,
    )
