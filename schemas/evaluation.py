"""The evaluator's verdict on one candidate, with the evidence it rests on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import Message, Model, now
from schemas.enums import (
    CheatRule,
    CheckOutcome,
    DeviceKind,
    EvalStatus,
    OpFamily,
    PrecisionMode,
    Severity,
    TimerKind,
)


class Finding(Model):
    """One anti-cheat finding: a rule, where it fired, and what it does to the verdict."""

    rule: CheatRule
    """The rule that fired."""
    severity: Severity
    """Whether it rejects the candidate, flags it for review, or only informs."""
    message: str
    """What was found, in plain language."""
    line: int | None = None
    """1-based line in the candidate source (static-gate findings)."""
    col: int | None = None
    """0-based column in the candidate source (static-gate findings)."""


class Check(Model):
    """One named check the evaluator ran (or skipped) and its outcome."""

    name: str
    """Stable name of the check, e.g. ``static_gate``, ``inputs_unchanged``, ``kernels_launched``."""
    outcome: CheckOutcome
    """Passed, failed or skipped."""
    detail: str | None = None
    """Why it failed or was skipped, or a short measurement."""


class TimingStats(Model):
    """Statistics of repeated timings of one callable (milliseconds per call)."""

    median_ms: float
    """Median time per call."""
    mean_ms: float
    """Mean time per call."""
    std_ms: float
    """Standard deviation per call."""
    min_ms: float
    """Fastest call."""
    max_ms: float
    """Slowest call."""
    p10_ms: float
    """10th percentile."""
    p90_ms: float
    """90th percentile."""
    reps: int = Field(ge=1)
    """Timed calls behind these numbers (after warm-up)."""
    earlier_reps: int = Field(default=0, ge=0)
    """Of ``reps``, calls timed in the task's earlier timing sessions (a baseline's, pooled where
    this session's own calls agreed with them; the referee timed them all)."""
    rel_stderr: float
    """Relative standard error of the mean (std / sqrt(reps) / mean)."""
    median_rel_stderr: float | None = None
    """Relative standard error of the median, from its distribution-free 95% interval (the
    repetitions stop once every timed callable's is under the target)."""
    timer: TimerKind
    """The clock that produced the numbers."""
    wall_ms: float | None = None
    """Device-wide wall-clock time per call (host clock around a synchronized batch), if taken."""


class OpTime(Model):
    """One kind of op of the reference's forward, where it was called, and its time."""

    module: str
    """Dotted path of the innermost submodule that called it (``""``: ``Model.forward``'s own code)."""
    op: str
    """The aten op (``aten::convolution``), as PyTorch dispatched it."""
    family: OpFamily
    """What kind of kernel the op is."""
    calls: int = Field(ge=1)
    """Calls per forward."""
    time_us: float = Field(ge=0.0)
    """Its time per forward, all calls together."""
    share: float = Field(ge=0.0, le=1.0)
    """Its fraction of the time of every op of the forward."""


class FamilyShare(Model):
    """One family of ops and its share of the reference's time."""

    family: OpFamily
    """The family."""
    time_us: float = Field(ge=0.0)
    """Time per forward of its ops."""
    share: float = Field(ge=0.0, le=1.0)
    """Fraction of the time of every op of the forward."""


class ReferenceProfile(Model):
    """Where the reference's time goes: its forward timed op by op, once per task, in the referee
    (a process no candidate runs in), at PyTorch's defaults. A candidate's speedup on a kernel can
    gain the run at most what that kernel's ops take of the reference (Amdahl's law)."""

    timer: str
    """How the ops were timed (``cuda events per op`` or ``cpu clock per op``)."""
    forward_us: float = Field(ge=0.0)
    """One forward, timed whole, without the per-op timers."""
    ops_us: float = Field(ge=0.0)
    """The ops' times added up (the shares' denominator). Below ``forward_us`` by launch gaps and
    host work between ops; above it where the per-op timers cost more than they measure."""
    families: tuple[FamilyShare, ...] = ()
    """Every family with time, largest first."""
    ops: tuple[OpTime, ...] = ()
    """The largest (module, op) pairs, largest first (at most ``PROFILE_OPS_KEPT``)."""
    more_ops: int = Field(default=0, ge=0)
    """Pairs left out of ``ops``."""


class KernelTime(Model):
    """One of the candidate's own kernels in one forward, timed in the candidate's process (as
    evidence for the diagnosis and the report: the verdict's timings never come from there)."""

    name: str
    """The kernel's name (a Triton function's or an extension function's)."""
    family: OpFamily | None = None
    """Its family where its name says it (the template's ``_kf_conv0`` is a convolution)."""
    launches: int = Field(ge=1)
    """Launches per forward."""
    time_us: float = Field(ge=0.0)
    """Time per forward, all launches together."""


class Baselines(Model):
    """The reference timed live, in the same process state, interleaved with the candidate."""

    eager: TimingStats | None = None
    """The reference ``Model`` in eager PyTorch."""
    compiled: TimingStats | None = None
    """``torch.compile`` of the reference; ``None`` if it could not be built here."""
    compiled_error: str | None = None
    """Why ``compiled`` is missing, if it is."""
    profile: ReferenceProfile | None = None
    """Where the reference's time goes, op by op (``None``: not measured)."""


class ShapeCheck(Model):
    """The candidate at one held-out shape: input shapes other than the reference's own, drawn by
    the evaluator from the task's ``get_inputs`` (issue 38)."""

    shape: str
    """The module-level sizes changed and the input shapes drawn with them."""
    outcome: Literal["correct", "wrong", "raised"]
    """``raised``: the candidate raised at this shape (a specialised kernel says so, never computes
    garbage); ``wrong``: its outputs did not match the reference's there (the candidate is incorrect)."""
    detail: str = ""
    """What it raised, or how its outputs differed (empty where correct)."""
    max_abs_err: float | None = None
    """Largest absolute difference to the reference's outputs at this shape (where it returned)."""
    candidate_ms: float | None = None
    """The candidate's median milliseconds per call at this shape, timed beside ``eager_ms`` in
    alternating batches of the same inputs (only where it was correct here and timed: see
    ``RunnerConfig.held_out_timing``). Evidence for the report: no verdict or search reads it."""
    eager_ms: float | None = None
    """The eager reference's median milliseconds per call at this shape."""
    timing_note: str | None = None
    """Why this shape has no times, where it was to be timed and is not."""

    @property
    def speedup_vs_eager(self) -> float | None:
        """eager / candidate at this shape (None: not timed)."""
        if self.candidate_ms and self.eager_ms:
            return self.eager_ms / self.candidate_ms
        return None

    def speed_text(self) -> str:
        """``1.52x eager (0.310 ms against 0.471 ms)``, or empty where not timed."""
        speedup = self.speedup_vs_eager
        if speedup is None or self.candidate_ms is None or self.eager_ms is None:
            return ""
        return f"{speedup:.3g}x eager ({self.candidate_ms:.4g} ms against {self.eager_ms:.4g} ms)"


LOWER_PRECISION = "lower precision than the reference"
"""Words of every verdict the evaluator gives an output that errs against float64 past the
precision bar (``Correctness.detail``): the diagnosis reads the evaluator's finding from them."""


class Correctness(Model):
    """How the candidate's outputs compared with the reference's."""

    trials: int = Field(ge=0)
    """Trials run, each with fresh inputs from a seed the candidate cannot predict."""
    passed_trials: int = Field(ge=0)
    """Trials whose outputs matched."""
    atol: float
    """Absolute tolerance used."""
    rtol: float
    """Relative tolerance used."""
    max_abs_err: float | None = None
    """Largest absolute difference to the reference over all trials."""
    max_rel_err: float | None = None
    """Largest relative difference to the reference over all trials."""
    err_vs_fp64: float | None = None
    """Candidate's relative L2 error against a float64 reference."""
    ref_err_vs_fp64: float | None = None
    """The eager reference's own relative L2 error against float64 (for a fair precision bar)."""
    precision: PrecisionMode = PrecisionMode.EXACT
    """The standard the outputs were judged at."""
    ref_default_err_vs_fp64: float | None = None
    """Under ``reference`` precision, the reference's relative L2 error against float64 when it
    runs with PyTorch's defaults (the bar is ``precision_parity_factor`` times it); ``None``
    where the defaults give the IEEE float32 outputs (the bar is then the exact one)."""
    mismatch_fraction: float | None = None
    """Fraction of output elements outside tolerance in the first failing trial."""
    first_bad_index: tuple[int, ...] | None = None
    """Index of the first mismatching element in the first failing trial."""
    output_shape: tuple[int, ...] | None = None
    """Shape of the reference output that ``first_bad_index`` points into (locates edge errors)."""
    nondeterministic: bool | None = None
    """Whether two runs of the candidate on the same inputs gave different outputs; ``None`` if
    not checked."""
    detail: str | None = None
    """Plain-language summary of the failure, if any."""
    reference_nonfinite_share: float | None = None
    """Share of the reference's floating output elements that are NaN/Inf (its first draw), where
    there are any: the outputs were judged on matching positions."""
    held_out: tuple[ShapeCheck, ...] = ()
    """The candidate at each held-out shape, in the order drawn (none: see ``held_out_note``)."""
    held_out_note: str | None = None
    """How the held-out shapes were drawn from the task, or why there are none."""


class SpeedOfLight(Model):
    """The physical lower bound on the reference's run time on this device."""

    flops: int
    """Floating-point operations of one forward."""
    bytes_moved: int
    """Fewest bytes one forward must move through device memory."""
    peak_tflops: float
    """Arithmetic ceiling used (TFLOP/s)."""
    peak_gbps: float
    """Memory-bandwidth ceiling used (GB/s)."""
    bound_ms: float
    """max(flops / peak, bytes / bandwidth) in milliseconds."""
    limiter: Literal["memory", "compute"]
    """Which of the two terms is larger."""
    fraction: float | None = None
    """bound_ms / candidate median (1.0 is at the bound); ``None`` without a timing."""


class StallShare(Model):
    """One warp-stall reason and its share of all stall cycles sampled."""

    reason: str
    """Nsight Compute's name for it (``long_scoreboard``, ``barrier``, ``math_pipe_throttle`` ...)."""
    share: float = Field(ge=0.0, le=1.0)
    """Fraction of the stalls of the profiled kernels, weighted by each kernel's duration."""


class HardwareCounters(Model):
    """Counters measured by a profiler on the candidate's own kernels (one forward), weighted by
    each kernel's duration; ``None`` where the profiler did not report the metric."""

    tool: str
    """The profiler (``ncu``) and its version where known."""
    kernels: int = Field(ge=0)
    """Kernel launches profiled."""
    duration_ms: float | None = None
    """Their total duration as the profiler measured it (serialised: longer than a timed run)."""
    dram_throughput_pct: float | None = None
    """DRAM throughput, % of the sustained peak."""
    sm_throughput_pct: float | None = None
    """SM throughput (the busiest pipe or unit), % of the sustained peak."""
    achieved_occupancy_pct: float | None = None
    """Active warps, % of the most an SM can hold."""
    stalls: tuple[StallShare, ...] = ()
    """Top warp-stall reasons, largest first."""


class Profile(Model):
    """What the candidate launched during one forward."""

    kernel_launches: int | None = None
    """Device kernel launches per forward (or custom-op calls on the CPU)."""
    own_kernel_launches: int | None = None
    """Launches of kernels defined by the candidate itself."""
    kernel_names: tuple[str, ...] = ()
    """Names of the kernels launched (first few)."""
    peak_memory_bytes: int | None = None
    """Peak device memory during the candidate's forward."""
    counters: HardwareCounters | None = None
    """Profiler counters of a slow correct candidate (opt-in: ``--profile-counters``)."""
    kernel_times: tuple[KernelTime, ...] = ()
    """The candidate's own kernels timed one by one over one forward, largest first (empty: not
    measured)."""
    kernel_timer: str | None = None
    """How ``kernel_times`` were timed (``cuda events per launch``, ``cpu clock per launch``)."""


class DeviceInfo(Model):
    """The device and software that produced a result."""

    kind: DeviceKind
    """CPU or CUDA."""
    name: str
    """Device name (e.g. ``NVIDIA H100 80GB HBM3`` or the CPU model)."""
    capability: str | None = None
    """CUDA compute capability, e.g. ``9.0``."""
    torch: str
    """torch version."""
    triton: str | None = None
    """triton version, if importable."""
    cuda: str | None = None
    """CUDA runtime version torch was built with."""
    python: str
    """Python version."""
    host: str
    """Host name of the evaluating machine."""
    triton_interpreter: bool = False
    """Whether Triton ran under its CPU interpreter."""
    gpu_index: int | None = Field(default=None, ge=0)
    """Which GPU of the evaluating machine (numbered as ``kfoundry run --gpus`` numbers them) ran the
    candidate; ``None`` on the CPU or for an evaluator not pinned to one GPU."""


class StageTimes(Model):
    """Wall-clock seconds spent per stage of the evaluation."""

    gate_s: float | None = None
    """Static gate."""
    compile_s: float | None = None
    """Compilation (zero on a cache hit)."""
    line_s: float | None = None
    """Waiting, once compiled, for better-ranked candidates still being compiled (the evaluator's
    compile patience) before lining up for a spare."""
    run_s: float | None = None
    """Correctness and timing in the run process."""
    measure_s: float | None = None
    """The measurement itself inside ``run_s``: the candidate's trial forwards plus the timing phase."""
    gpu_s: float | None = None
    """How long the GPU was held for this candidate alone (import, trials, timing, profile, kill)."""
    total_s: float | None = None
    """From receipt to verdict."""
    compile_cache_hit: bool = False
    """Whether the compile stage was served from the content-hash cache."""


class EvalResult(Message):
    """The verdict on one candidate: a status, the evidence for it, and the numbers."""

    type: Literal["eval_result"] = "eval_result"
    """Wire name of this message type."""
    run_id: str
    """Run the candidate belongs to (empty for a standalone ``kfoundry eval``)."""
    candidate_id: str
    """The candidate evaluated."""
    island: str = ""
    """Island that produced the candidate."""
    task_id: str
    """Task the candidate was evaluated against."""
    status: EvalStatus
    """The verdict."""
    summary: str
    """One line a person can read: the verdict and its main reason."""
    checks: tuple[Check, ...] = ()
    """Every check that ran or was skipped, in order."""
    findings: tuple[Finding, ...] = ()
    """Anti-cheat findings, with rule ids and lines."""
    compile_log: str | None = None
    """Compiler output (truncated)."""
    runtime_log: str | None = None
    """Output and traceback of the run process (truncated)."""
    correctness: Correctness | None = None
    """Comparison against the reference, if it got that far."""
    timing: TimingStats | None = None
    """The candidate's timings, if correct."""
    baselines: Baselines | None = None
    """The reference's timings, taken interleaved with the candidate's."""
    speedup_vs_eager: float | None = None
    """eager median / candidate median."""
    speedup_vs_compiled: float | None = None
    """torch.compile median / candidate median."""
    sol: SpeedOfLight | None = None
    """Speed-of-light bound and the fraction of it reached."""
    profile: Profile | None = None
    """Kernel launches and memory of the candidate's forward."""
    torch_ops: tuple[str, ...] = ()
    """Operations the candidate left to PyTorch (admitted by the run's ``reference`` policy because
    the reference calls them): the gate's names (``torch.nn.Conv2d``) and the aten ops that ran."""
    review: tuple[str, ...] = ()
    """Reasons a person should look before this result is trusted; non-empty means no elite."""
    device: DeviceInfo | None = None
    """Device and software versions; ``None`` only if the evaluator never reached a device."""
    stages: StageTimes = StageTimes()
    """Time spent per stage."""
    evaluator: str = ""
    """Id of the evaluator that produced the result."""
    attempt: int = Field(default=1, ge=1)
    """Delivery attempt of the candidate that produced this result."""
    created_at: float = Field(default_factory=now)
    """When the verdict was reached."""

    @property
    def clean(self) -> bool:
        """Correct, with nothing flagged for review: the only results that may become elites."""
        return self.status is EvalStatus.CORRECT and not self.review

    @property
    def fitness(self) -> float | None:
        """Speedup over eager for clean results; ``None`` otherwise."""
        return self.speedup_vs_eager if self.clean else None

    @property
    def compiled_derived(self) -> bool:
        """The speedup over ``torch.compile`` was derived from the task's compiled/eager time ratio
        as other evaluations measured it, not timed beside this candidate (results of evaluators
        before the referee, whose spares took turns building the baseline; the referee builds it
        once per task and times it beside every candidate)."""
        return self.speedup_vs_compiled is not None and (self.baselines is None or self.baselines.compiled is None)
