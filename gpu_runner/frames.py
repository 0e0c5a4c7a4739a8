"""The frames the evaluator and its workers exchange: one definition of each, read by both sides.

A frame's header is a JSON object (:mod:`gpu_runner.protocol` carries it and its tensors). The
parent sends *ops* (``{"op": ...}``) and a worker answers with *reports* (``{"kind": ...}``).
Each op and each report has its fields declared here once, as a ``TypedDict`` (:data:`OPS`,
:data:`REPORTS`): mypy checks both sides against it, and the same declaration is checked at run
time. The parent builds every op with :func:`op_frame`, which refuses a missing, unknown or
mistyped field, and the worker reads it back with :func:`decode_op`. The parent reads every
report through :func:`decode_report`: a worker runs candidate code, so an unknown kind or a
declared field that is missing or of the wrong type is a :class:`~gpu_runner.protocol.FrameError`,
never a guess. Reports may carry more fields than they declare (measurements for the logs and
the verdict, which the parent reads defensively). Stdlib only: workers import it before the
sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import UnionType
from typing import Any, NewType, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

from gpu_runner.protocol import FrameError

OpFrame = NewType("OpFrame", dict[str, Any])
"""The header of an op built (and checked) by :func:`op_frame`: the only thing a worker is sent."""


class Op(StrEnum):
    """What the parent asks of a worker (the ``op`` of a frame it sends)."""

    PREPARE = "prepare"
    """Spare (a run worker that will take a candidate): draw every trial's inputs and make the
    output buffers; no reference model, output or baseline ever exists in it."""
    JOB = "job"
    """Spare: stage one candidate in the sandbox (then ``go``, and ``batch``/``ship`` until ``finish``)."""
    GO = "go"
    """Spare: the GPU lease is held; run the correctness trials."""
    BATCH = "batch"
    """Spare or referee: one timed batch of calls on fresh inputs from the given seeds."""
    SHIP = "ship"
    """Spare: send the outputs of one call of the last timed batch (chosen after it ended)."""
    FINISH = "finish"
    """Spare: no more timing; profile if asked, then say ``measured`` and ``done``."""
    TASK = "task"
    """Referee (a run worker that never takes a candidate): load the task's reference, build its
    model and ``torch.compile`` baseline, calibrate the canary and the range trials."""
    TRUTH = "truth"
    """Referee: ship the reference's outputs (IEEE fp32) and float64 residuals for the given seeds."""
    CANARY = "canary"
    """Referee: time a one-block kernel from the host (the GPU idle, or busy with another process's work)."""
    MEASURE = "measure"
    """Run worker: report the task's sizes and FLOPs before any preparation."""
    COMPILE = "compile"
    """Compile worker: build one candidate's kernels ahead of time, in the sandbox."""
    JUDGE = "judge"
    """Judge worker: compare one trial's output files with the reference, on the device."""
    GPU_GRANTED = "gpu_granted"
    """Any worker: the shared GPU lease it asked for (``gpu_acquire``) is granted."""


class Report(StrEnum):
    """What a worker tells the parent (the ``kind`` of a frame it sends)."""

    READY = "ready"
    PREPARED = "prepared"
    REFERENCE = "reference"
    REFERENCE_ERROR = "reference_error"
    PREPARE_TIME = "prepare_time"
    REFERENCE_DONE = "reference_done"
    """From a preparing spare: its inputs are drawn; what follows (output buffers) adds only what
    the memory plan counts in every prepared spare."""
    TASK_READY = "task_ready"
    """From the referee: the task's model and baselines are built (sizes, FLOPs, output metadata)."""
    TIMED = "timed"
    """From a spare or the referee: one timed batch's samples (and the outputs of small ones)."""
    CANARY = "canary"
    """From the referee: the canary's latency."""
    INPUTS = "inputs"
    """From a spare: one trial's inputs as the candidate's call left them (small inputs)."""
    LATER_CALLS = "later_calls"
    """From a spare, after the trials: whether the first trial's outputs changed in later calls."""
    MEASURED = "measured"
    """From a measuring worker: the task's sizes; from a run worker: timing is over."""
    SANDBOX = "sandbox"
    ARMED = "armed"
    TRIAL = "trial"
    SHAPE_TRIAL = "shape_trial"
    """From a spare, after the trials: the candidate's outputs at one held-out shape, or what it raised."""
    TRIALS_DONE = "trials_done"
    MEMORY = "memory"
    PROFILE = "profile"
    DONE = "done"
    ERROR = "error"
    COMPILED = "compiled"
    JUDGED = "judged"
    GPU_ACQUIRE = "gpu_acquire"
    GPU_RELEASE = "gpu_release"


class KernelTimer(StrEnum):
    """How a candidate's process timed its own launches one by one (the ``kernel_timer`` of ``done``)."""

    CUDA = "cuda events per launch"
    """CUDA events recorded on the current stream just before and after each launch."""
    CPU = "cpu clock per launch"
    """The host's ``perf_counter`` around each launch."""


KERNEL_NAME_CHARS = 200
"""The longest kernel name a ``done`` frame's ``kernel_times`` may carry (the process cuts longer ones)."""
KERNEL_TIMES_KEPT = 64
"""The most kernels a ``done`` frame's ``kernel_times`` carries (and a profile keeps): the largest."""


class SandboxSettings(TypedDict, total=False):
    """What a worker applies to itself before it imports a candidate (the ``sandbox`` of a
    ``job`` or ``compile``), built once by :func:`gpu_runner.isolation.sandbox_settings`."""

    cwd: str
    data_bytes: int
    fsize_bytes: int
    nproc: int
    uid: int | None
    gid: int | None
    mem_fraction: float
    strict: bool
    landlock: dict[str, list[str]]
    seccomp: str


class _PrepareOptional(TypedDict, total=False):
    variants: list[dict[str, int]]
    """Held-out shapes (:mod:`gpu_runner.sandboxed.held_out`): per shape, the module-level sizes
    its inputs are drawn with, under ``variant_seeds``."""
    variant_seeds: list[int]


class PrepareOp(_PrepareOptional):
    """``prepare``: the task's reference (for ``get_inputs`` and ``get_init_inputs`` only), every
    trial's seed and input scale, and the reference's output metadata (for the output buffers)."""

    reference_source: str
    init_seed: int
    trial_seeds: list[int]
    trial_scales: list[float]
    out_metas: list[dict[str, Any]]
    device_verdict: bool
    inputs_on_device: bool
    init_on_device: bool
    in_place_bytes: int
    shared_outputs: bool
    timed_slots: int


class _TaskOptional(TypedDict, total=False):
    compiled_only: bool
    """The task's ``torch.compile`` baseline alone (its own process beside the referee, so no
    verdict waits for the compilation): the model, the compiled model, the canary and flusher
    for its timed batches; no truth, range trials or FLOPs."""


class TaskOp(_TaskOptional):
    """``task``: what the referee builds and keeps for the task until it is stopped."""

    reference_source: str
    init_seed: int
    compiled_baseline: bool
    inputs_on_device: bool
    init_on_device: bool
    calibrate_seed: int
    light: bool
    """A truth worker: only the model, for ``truth`` ops (no baseline, canary, range or FLOPs)."""


class _ParityOptional(TypedDict, total=False):
    overrides: list[dict[str, int]]
    """Per seed, the module-level sizes its inputs are drawn with (a held-out shape; none: the task's)."""
    parity: list[bool]
    """Per output, whether to measure the reference's error at PyTorch's defaults on each seed's
    inputs too (:func:`gpu_runner.compare.parity_outputs`; none where absent)."""


class TruthOp(_ParityOptional):
    """``truth``: the seeds (and input scales) whose reference outputs and residuals to ship."""

    seeds: list[int]
    skips: list[int]
    """Per seed, how many draws come before the one wanted (a timed call's place in its batch)."""
    scales: list[float]
    first: int
    """The trial number of the first seed (the ``reference`` frames count on from it)."""
    on_device: bool
    """Draw the inputs on the device (timed calls' are, in every process), else as trials are."""


class _BatchOptional(TypedDict, total=False):
    overrides: dict[str, int]
    """A held-out shape's module-level sizes: the batch's inputs are drawn at that shape (the
    task's own where absent)."""


class BatchOp(_BatchOptional):
    """``batch``: one timed batch (the same harness in the spare and the referee)."""

    callable: str
    """``candidate`` (the spare), ``eager`` or ``compiled`` (the referee)."""
    seed: int
    calls: int
    """Call ``k`` times the inputs of the ``k``-th draw from ``seed`` (one seeding per batch)."""
    warmup: bool
    """Warm-up calls: at least ``calls``, and on until ``warmup_min_s`` (samples not kept)."""
    warmup_min_s: float
    predraw: int
    """Warm-up: draws of this many calls' inputs made and dropped before the measured draw, so the
    allocator holds the blocks a timed batch of up to that many calls needs (0: none)."""
    lead_cycles: int
    """The device spin before each timed call, in GPU cycles (the same count in every process:
    the referee measured the spin rate once, so both spin equally long)."""
    cover_cycles: int
    """A device spin queued before the batch draws its inputs, as long as the host takes to draw
    them: the device never idles while the host works, so the batch's time is the device's."""
    outputs: str
    """``all``: every call's outputs come back with the batch (small outputs); ``keep``: the
    spare keeps the last batch's outputs until the next one, for a ``ship``; ``none``."""
    canary: bool
    """Referee: time the canary before the batch (is the GPU idle?)."""


class ShipOp(TypedDict):
    """``ship``: which call of the last batch, and under which trial number its outputs go."""

    call: int
    trial: int


class JobOp(TypedDict):
    """``job``: one candidate, the sandbox it runs in, and what its trials send back."""

    candidate_path: str
    ext_manifest: dict[str, str]
    sandbox: SandboxSettings
    profile_kernels: bool
    device_verdict: bool
    poison_bytes: int | None
    in_place_bytes: int
    ship_inputs_bytes: int
    """Inputs of at most this many bytes per trial go back with its outputs, as they are after the
    call (the parent checks them against the checksums the spare made before any candidate)."""


class _MeasureOptional(TypedDict, total=False):
    held_out_shapes: int
    """Derive up to this many held-out shapes of the task (none where absent or 0)."""


class MeasureOp(_MeasureOptional):
    """``measure``: the task whose sizes and FLOPs to report."""

    reference_source: str


class CompileOp(TypedDict):
    """``compile``: one candidate to build ahead of time, in the sandbox, on the CPU."""

    candidate_path: str
    reference_source: str
    build_root: str
    target: dict[str, Any] | None
    triton_kernels: list[str]
    sandbox: SandboxSettings
    jobs: int
    """Cores the stage may use: it compiles its Triton kernels in up to this many processes."""
    variants: list[dict[str, int]]
    """The task's held-out shapes (module-level sizes to set while drawing inputs): the
    compile-only forward runs at each of them too, so kernels a candidate launches only at other
    shapes (copies taking any batch) are compiled here, where the run process, which may not
    start ``ptxas``, finds them."""


class JudgeOp(_ParityOptional):
    """``judge``: the trial to rebuild the reference for, and the candidate's output files to compare."""

    reference_source: str
    init_seed: int
    seed: int
    skip: int
    scale: float
    on_device: bool
    init_on_device: bool
    input_sums: list[int | None] | None
    """The spare's checksums of the trial's inputs (None for a timed call's: drawn in its batch)."""
    outputs: list[dict[str, Any]]


class NoFields(TypedDict):
    """An op or report that is its name alone."""


class ReadyReport(TypedDict):
    device: dict[str, Any]
    pid: int
    phases: dict[str, float]


class PreparedReport(TypedDict):
    out_metas: list[list[dict[str, Any]]]
    phases: dict[str, float]


class ReferenceReport(TypedDict):
    trial: int
    n_outputs: int
    tensors: list[dict[str, Any]]


class ReferenceErrorReport(TypedDict):
    """The reference failed to load or run (the task is refused)."""

    etype: str
    message: str


class PrepareTimeReport(TypedDict):
    seconds: float


class SandboxReport(TypedDict):
    checks: dict[str, Any]
    phases: dict[str, float]


class _TrialOptional(TypedDict, total=False):
    shared: bool
    """The outputs lie in the spare's shared buffers (no blobs, no bulk files)."""


class TrialReport(_TrialOptional):
    trial: int
    tensors: list[dict[str, Any]]
    info: dict[str, Any]


class ShapeTrialReport(TypedDict):
    variant: int
    tensors: list[dict[str, Any]]
    info: dict[str, Any]
    """What the candidate's process saw (launches, outputs' structure), or ``raised``: what the
    candidate raised at this shape."""


class MemoryReport(TypedDict):
    peak_bytes: int


class ProfileReport(TypedDict):
    kernels: list[str]


class _DoneOptional(TypedDict, total=False):
    kernel_times: Any
    """From a spare whose candidate's timed calls are done: its own kernels timed one by one over
    one more forward, ``[{"name": str, "launches": int, "time_us": float}, ...]`` largest first
    (absent: not measured). Written where the candidate runs, so any value may arrive: the parent
    validates it (:func:`gpu_runner.kernel_times.read_kernel_times`) and drops it if malformed."""
    kernel_timer: Any
    """How ``kernel_times`` were timed (a :class:`KernelTimer` value), read as defensively."""


class DoneReport(_DoneOptional):
    phases: dict[str, float]


class CompiledReport(TypedDict):
    ok: bool


class JudgedReport(TypedDict):
    results: list[dict[str, Any]]


class _TaskReadyOptional(TypedDict, total=False):
    out_structure: list[Any] | str
    """How the reference's outputs nest (:mod:`gpu_runner.structure`); absent where the referee
    measured no outputs (a light or compiled-only one)."""


class TaskReadyReport(_TaskReadyOptional):
    out_metas: list[dict[str, Any]]
    phases: dict[str, float]


class TimedReport(TypedDict):
    samples: list[float]
    """Milliseconds per timed call (CUDA events, or the host clock on the CPU)."""
    calls: int
    timer: str


class CanaryReport(TypedDict):
    host_us: float


class InputsReport(TypedDict):
    trial: int
    tensors: list[dict[str, Any]]


class LaterCallsReport(TypedDict):
    first_outputs_changed: bool


class RunErrorReport(TypedDict):
    """The worker's job failed: in which stage, with which exception."""

    stage: str
    etype: str
    message: str


OPS: dict[Op, type[Any]] = {
    Op.PREPARE: PrepareOp,
    Op.JOB: JobOp,
    Op.GO: NoFields,
    Op.BATCH: BatchOp,
    Op.SHIP: ShipOp,
    Op.FINISH: NoFields,
    Op.TASK: TaskOp,
    Op.TRUTH: TruthOp,
    Op.CANARY: NoFields,
    Op.MEASURE: MeasureOp,
    Op.COMPILE: CompileOp,
    Op.JUDGE: JudgeOp,
    Op.GPU_GRANTED: NoFields,
}
"""Every op's fields: the parent sends exactly these."""

REPORTS: dict[Report, type[Any]] = {
    Report.READY: ReadyReport,
    Report.PREPARED: PreparedReport,
    Report.REFERENCE: ReferenceReport,
    Report.REFERENCE_ERROR: ReferenceErrorReport,
    Report.PREPARE_TIME: PrepareTimeReport,
    Report.REFERENCE_DONE: NoFields,
    Report.TASK_READY: TaskReadyReport,
    Report.TIMED: TimedReport,
    Report.CANARY: CanaryReport,
    Report.INPUTS: InputsReport,
    Report.LATER_CALLS: LaterCallsReport,
    Report.MEASURED: NoFields,
    Report.SANDBOX: SandboxReport,
    Report.ARMED: NoFields,
    Report.TRIAL: TrialReport,
    Report.SHAPE_TRIAL: ShapeTrialReport,
    Report.TRIALS_DONE: NoFields,
    Report.MEMORY: MemoryReport,
    Report.PROFILE: ProfileReport,
    Report.DONE: DoneReport,
    Report.ERROR: RunErrorReport,
    Report.COMPILED: CompiledReport,
    Report.JUDGED: JudgedReport,
    Report.GPU_ACQUIRE: NoFields,
    Report.GPU_RELEASE: NoFields,
}
"""The fields each report must carry, as the parent reads them (it may carry more: measurements for
the logs and the verdict, which the parent reads defensively)."""


def _accepts(value: object, hint: Any) -> bool:
    """Whether a decoded JSON value fits a field's annotation (containers one level deep)."""
    origin = get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, UnionType):
        return any(_accepts(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if isinstance(value, bool):  # JSON true is no number
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(_accepts(x, item) for x in value)
    if origin is dict or is_typeddict(hint):
        return isinstance(value, dict)
    return isinstance(value, hint)


_FIELDS: dict[type[Any], tuple[dict[str, Any], frozenset[str]]] = {}


def _fields(body: type[Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's field annotations and its required keys (resolved once)."""
    if body not in _FIELDS:
        _FIELDS[body] = get_type_hints(body), frozenset(body.__required_keys__)
    return _FIELDS[body]


def _check(what: str, header: Mapping[str, Any], body: type[Any], exact: bool) -> None:
    hints, required = _fields(body)
    for name, hint in hints.items():
        if name not in header:
            if name in required:
                raise FrameError(f"{what} has no {name!r}")
            continue
        if not _accepts(header[name], hint):
            raise FrameError(f"{what}: {name!r} is not {_spell(hint)} ({type(header[name]).__name__})")
    if exact:
        extra = sorted(set(header) - set(hints) - {"op", "blobs"})
        if extra:
            raise FrameError(f"{what} has undeclared fields {extra}")


def _spell(hint: Any) -> str:
    return str(hint).replace("typing.", "") if get_args(hint) else str(getattr(hint, "__name__", hint))


def op_frame(op: Op, body: Mapping[str, Any] | None = None) -> OpFrame:
    """The header of one op from its fields (the op's TypedDict), checked against its declaration:
    a parent bug fails here, loudly."""
    fields = dict(body or {})
    _check(f"op {op.value}", fields, OPS[op], exact=True)
    return OpFrame({"op": op.value, **fields})


def decode_op(header: Mapping[str, Any]) -> Op:
    """The op of a frame the parent sent, its fields checked; :class:`FrameError` if it is not one."""
    try:
        op = Op(str(header.get("op")))
    except ValueError:
        raise FrameError(f"unknown op {header.get('op')!r}") from None
    _check(f"op {op.value}", header, OPS[op], exact=True)
    return op


def decode_report(header: dict[str, Any]) -> Report:
    """The kind of a frame a worker sent, its declared fields checked; :class:`FrameError` if it is not one.

    The header's ``kind`` becomes the :class:`Report` member (equal to its string)."""
    try:
        kind = Report(str(header.get("kind")))
    except ValueError:
        raise FrameError(f"unknown report kind {str(header.get('kind'))[:40]!r}") from None
    _check(f"{kind.value} report", header, REPORTS[kind], exact=False)
    header["kind"] = kind
    return kind
