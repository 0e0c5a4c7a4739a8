"""Outcomes and kinds as enums: the fixed vocabularies of the contract.

"Not measured" is ``None`` in a message, never a sentinel member or a magic number.
"""

from __future__ import annotations

from enum import StrEnum


class EvalStatus(StrEnum):
    """The verdict of one evaluation of a candidate."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    REJECTED = "rejected"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    EVALUATOR_ERROR = "evaluator_error"
    """The evaluator could not reach a verdict (its reference run, a lost device, memory exhausted in
    trusted code): says nothing about the candidate, which may be evaluated again."""


class DeviceKind(StrEnum):
    """Where a candidate ran."""

    CPU = "cpu"
    CUDA = "cuda"


class OpFamily(StrEnum):
    """What kind of kernel an op of a forward is (the template expert's kernel kinds, and what
    they do not cover)."""

    CONV = "conv"
    """Convolutions, transposed or not."""
    MM = "mm"
    """Matrix products (linear layers, ``matmul``, ``bmm``, ``einsum``)."""
    ATTN = "attn"
    """Fused attention (``scaled_dot_product_attention``)."""
    REC = "rec"
    """Recurrent layers (RNN, LSTM, GRU) run as one op."""
    ROW = "row"
    """Reductions along rows: softmax, norms, sums and means, losses."""
    POOL = "pool"
    """Window pooling."""
    SCAN = "scan"
    """Cumulative sums and products."""
    PW = "pw"
    """Elementwise (pointwise) work, broadcasts included."""
    LAYOUT = "layout"
    """Data movement: copies, concatenation, padding, indexing, views."""
    OTHER = "other"
    """Anything else."""


class DeviceChoice(StrEnum):
    """What a user may ask for: a device, or whatever is present."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class TorchOpsPolicy(StrEnum):
    """Which PyTorch operations a candidate's forward may leave to PyTorch (a run-level policy)."""

    FORBID = "forbid"
    """None: every compute operation must be the candidate's own kernel."""
    REFERENCE = "reference"
    """The operations the reference itself calls (same functions, same aten ops), nothing else;
    at least one of the candidate's own kernels must still run."""


class PrecisionMode(StrEnum):
    """The standard a candidate's outputs are held to against the float64 truth."""

    REFERENCE = "reference"
    """Precision parity: as far as the reference itself errs when it runs with PyTorch's
    defaults (TF32 in cuDNN convolutions; IEEE float32 matmuls), measured per task and output."""
    EXACT = "exact"
    """As far as the reference errs in IEEE float32 (TF32 off everywhere)."""


class TimerKind(StrEnum):
    """The clock behind a timing."""

    CUDA_EVENT = "cuda_event"
    PERF_COUNTER = "perf_counter"


class KernelLanguage(StrEnum):
    """The language a candidate's kernels are written in."""

    TRITON = "triton"
    CUDA = "cuda"


class CheckOutcome(StrEnum):
    """The outcome of one named check of the evaluator."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class CheckName(StrEnum):
    """The name of a check the evaluator reports (``Check.name``); diagnosis rules match on these."""

    STATIC_GATE = "static_gate"
    COMPILE = "compile"
    WARM_WORKER = "warm_worker"
    KERNEL_PROFILE = "kernel_profile"
    SANDBOX_LIMITS = "sandbox_limits"
    PRIORITY = "priority"
    OUTPUT_TYPE = "output_type"
    KERNELS_LAUNCHED = "kernels_launched"
    NO_TORCH_COMPUTE = "no_torch_compute"
    INPUTS_UNCHANGED = "inputs_unchanged"
    OUTPUTS_NOT_ALIASED = "outputs_not_aliased"
    NO_DEFERRED_OUTPUTS = "no_deferred_outputs"
    NO_THREADS_LEFT = "no_threads_left"
    NO_CHILD_PROCESSES = "no_child_processes"
    CORRECTNESS = "correctness"
    TIMED_OUTPUTS_RECHECKED = "timed_outputs_rechecked"
    """Timed calls' outputs judged by the trial rule (chosen after each batch, truth from the referee)."""
    TIMED_LAUNCHES = "timed_launches"
    DEFERRED_WORK_GUARD = "deferred_work_guard"
    """The referee's canary: the GPU idle whenever a baseline was timed and after the candidate's last batch."""
    TIMING_CROSS_CHECK = "timing_cross_check"
    """The candidate's reported samples against the parent's clock around each of its batches."""
    OUTPUT_LAYOUT = "output_layout"
    """Output strides as the reference's (a dense layout where the reference's is dense)."""
    LATER_CALLS = "later_calls"
    """A trial's outputs unchanged by the calls after it (no workspace returned every time)."""
    RANGE_TRIALS = "range_trials"
    """Trials whose inputs were drawn at large and small magnitudes where the reference stays finite."""
    HELD_OUT_SHAPES = "held_out_shapes"
    """The candidate called at other input shapes the reference accepts, drawn by the evaluator."""
    L2_FLUSH = "l2_flush"
    PERSISTING_L2_RESET = "persisting_l2_reset"
    COMPILED_BASELINE = "compiled_baseline"
    SPEED_OF_LIGHT = "speed_of_light"
    NETWORK_ISOLATION = "network_isolation"
    """The isolation layers, one check each (``gpu_runner.confine``)."""
    PID_NAMESPACE = "pid_namespace"
    IPC_NAMESPACE = "ipc_namespace"
    MOUNT_VIEW = "mount_view"
    USER_NAMESPACE = "user_namespace"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    SANDBOX_USER = "sandbox_user"

    @classmethod
    def parse(cls, name: str) -> CheckName | None:
        """The member named ``name``, or None for a name this version does not know."""
        try:
            return cls(name)
        except ValueError:
            return None


class Severity(StrEnum):
    """What a finding of the anti-cheat layers does to the verdict."""

    REJECT = "reject"
    """The candidate is refused (status ``rejected``)."""
    REVIEW = "review"
    """The result stands but is flagged for a human: it cannot become an elite."""
    INFO = "info"
    """Recorded for the diagnosis; no effect on the verdict."""


class CheatRule(StrEnum):
    """Anti-cheat rules of the evaluator. Static-gate rules carry a line number in findings."""

    THREADS = "KF001-threads"
    PROCESSES = "KF002-processes"
    CTYPES = "KF003-ctypes"
    INTROSPECTION = "KF004-introspection"
    DYNAMIC_CODE = "KF005-dynamic-code"
    MONKEYPATCH = "KF006-monkeypatch"
    TIMER_TAMPERING = "KF007-timer-tampering"
    TORCH_COMPILE = "KF008-torch-compile"
    TENSOR_SUBCLASS = "KF009-tensor-subclass"
    TORCH_FALLBACK = "KF010-torch-fallback"
    PRECISION_FLAGS = "KF011-precision-flags"
    TORCH_COMPUTE = "KF012-torch-compute"
    REDEFINED_INPUTS = "KF013-redefined-inputs"
    FILE_ACCESS = "KF014-file-access"
    NETWORK = "KF015-network"
    ENVIRONMENT = "KF016-environment"
    RNG_TAMPERING = "KF017-rng-tampering"
    PROCESS_CONTROL = "KF018-process-control"
    NO_KERNEL_LAUNCHED = "KF101-no-kernel-launched"
    INPUT_MUTATED = "KF102-input-mutated"
    OUTPUT_ALIASES_INPUT = "KF103-output-aliases-input"
    DEFERRED_WORK = "KF104-deferred-work"
    IMPLAUSIBLE_SPEED = "KF105-implausible-speed"
    OUTPUT_TYPE = "KF106-output-type"
    RESOURCE_LIMIT = "KF107-resource-limit"
    MISSING_MODEL = "KF108-missing-model"
    OUTPUT_LAYOUT = "KF109-output-layout"


class DiagnosisCategory(StrEnum):
    """The fixed diagnosis taxonomy. The part before the first dot is the family."""

    COMPILE_SYNTAX = "compile.syntax"
    COMPILE_IMPORT = "compile.import"
    COMPILE_TYPE = "compile.type"
    COMPILE_RESOURCES = "compile.resources"
    COMPILE_UNSUPPORTED = "compile.unsupported"
    COMPILE_TIMEOUT = "compile.timeout"
    COMPILE_OTHER = "compile.other"

    RUNTIME_OOM = "runtime.oom"
    RUNTIME_ILLEGAL_ACCESS = "runtime.illegal_access"
    RUNTIME_LAUNCH = "runtime.launch"
    RUNTIME_SHAPE = "runtime.shape"
    RUNTIME_DTYPE = "runtime.dtype"
    RUNTIME_CRASH = "runtime.crash"
    RUNTIME_TIMEOUT = "runtime.timeout"
    RUNTIME_EXCEPTION = "runtime.exception"

    EVALUATOR_FAULT = "evaluator.fault"
    """The evaluator could not judge the candidate: nothing is known about the candidate."""

    INCORRECT_SHAPE = "incorrect.shape"
    INCORRECT_NAN_INF = "incorrect.nan_inf"
    INCORRECT_BOUNDARY = "incorrect.boundary"
    INCORRECT_INDEXING = "incorrect.indexing"
    INCORRECT_PRECISION = "incorrect.precision"
    INCORRECT_RACE = "incorrect.race"
    INCORRECT_HELD_OUT = "incorrect.held_out"
    """Correct at the reference's input shapes, wrong at a held-out shape (sizes taken as constants)."""
    INCORRECT_OTHER = "incorrect.other"

    REJECTED_THREADS = "rejected.threads"
    REJECTED_PROCESSES = "rejected.processes"
    REJECTED_CTYPES = "rejected.ctypes"
    REJECTED_INTROSPECTION = "rejected.introspection"
    REJECTED_DYNAMIC_CODE = "rejected.dynamic_code"
    REJECTED_MONKEYPATCH = "rejected.monkeypatch"
    REJECTED_TIMER_TAMPERING = "rejected.timer_tampering"
    REJECTED_TORCH_COMPILE = "rejected.torch_compile"
    REJECTED_TENSOR_SUBCLASS = "rejected.tensor_subclass"
    REJECTED_TORCH_FALLBACK = "rejected.torch_fallback"
    REJECTED_PRECISION_FLAGS = "rejected.precision_flags"
    REJECTED_TORCH_COMPUTE = "rejected.torch_compute"
    REJECTED_REDEFINED_INPUTS = "rejected.redefined_inputs"
    REJECTED_FILE_ACCESS = "rejected.file_access"
    REJECTED_NETWORK = "rejected.network"
    REJECTED_ENVIRONMENT = "rejected.environment"
    REJECTED_RNG_TAMPERING = "rejected.rng_tampering"
    REJECTED_PROCESS_CONTROL = "rejected.process_control"
    REJECTED_NO_KERNEL_LAUNCHED = "rejected.no_kernel_launched"
    REJECTED_INPUT_MUTATED = "rejected.input_mutated"
    REJECTED_OUTPUT_ALIASES_INPUT = "rejected.output_aliases_input"
    REJECTED_DEFERRED_WORK = "rejected.deferred_work"
    REJECTED_IMPLAUSIBLE_SPEED = "rejected.implausible_speed"
    REJECTED_OUTPUT_TYPE = "rejected.output_type"
    REJECTED_RESOURCE_LIMIT = "rejected.resource_limit"
    REJECTED_MISSING_MODEL = "rejected.missing_model"
    REJECTED_OUTPUT_LAYOUT = "rejected.output_layout"
    REJECTED_OTHER = "rejected.other"
    """Rejected, but no finding names the rule (evidence comes from the failed checks)."""

    SLOW_LAUNCH_BOUND = "slow.launch_bound"
    SLOW_MEMORY_BOUND = "slow.memory_bound"
    SLOW_COMPUTE_BOUND = "slow.compute_bound"
    SLOW_LATENCY_BOUND = "slow.latency_bound"
    """Neither DRAM nor the SMs are busy (profiler counters): warps wait (memory latency, barriers,
    too few warps in flight); more parallelism or more loads in flight, not fewer bytes or FLOPs."""
    SLOW_FAR_FROM_SOL = "slow.far_from_sol"
    AT_SOL = "at_sol"

    @property
    def family(self) -> str:
        """The family: compile, runtime, incorrect, rejected, slow or at_sol."""
        return self.value.split(".", 1)[0]

    @classmethod
    def for_rule(cls, rule: CheatRule) -> DiagnosisCategory:
        """The ``rejected.*`` category of an anti-cheat rule."""
        name = rule.value.split("-", 1)[1].replace("-", "_")
        return cls(f"rejected.{name}")


class DeclineReason(StrEnum):
    """Why an expert produced no candidate."""

    UNSUPPORTED = "unsupported"
    """The expert cannot handle this reference (e.g. an op the templates do not cover)."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    REFUSED = "refused"
    """The model refused to answer."""
    NO_CODE = "no_code"
    """A reply came but no usable code could be extracted from it."""
    ENDPOINT_ERROR = "endpoint_error"
    TIMEOUT = "timeout"
    INVALID_REQUEST = "invalid_request"


class Role(StrEnum):
    """What an expert specialises in: the LLM prompt role, and what routing and credit choose by.

    Wire fields that carry a role (``ExpertConfig.role``, ``Diagnosis.suggested_expert``) keep
    plain strings; code reads them as a ``Role``."""

    TEMPLATE = "template"
    """The offline template expert (no prompt role)."""
    MEMORY = "memory"
    FUSION = "fusion"
    TILING = "tiling"
    ALGORITHM = "algorithm"
    REPAIR = "repair"
    GENERAL = "general"

    @classmethod
    def of(cls, value: str | None) -> Role | None:
        """``value`` as a role, or ``None`` when it names none."""
        return cls._value2member_map_.get(value or "")  # type: ignore[return-value]


class ExpertKind(StrEnum):
    """The implementation behind an expert name."""

    TEMPLATE = "template"
    LLM = "llm"


class ActorKind(StrEnum):
    """The kinds of actor in a run."""

    ISLAND = "island"
    EXPERT = "expert"
    EVALUATOR = "evaluator"
    DIAGNOSER = "diagnoser"
    MIGRATOR = "migrator"
    CURATOR = "curator"
    CONTROLLER = "controller"


class ActorState(StrEnum):
    """Lifecycle of an actor."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    DRAINING = "draining"
    STOPPED = "stopped"


class ControlAction(StrEnum):
    """What a control message asks of an actor."""

    DRAIN = "drain"
    """Finish in-hand work, take no more, leave the run."""
    PAUSE = "pause"
    RESUME = "resume"
    INFO = "info"
    """Reply with the actor's info and statistics, change nothing."""


class MigrationReason(StrEnum):
    """Why a migration happened."""

    RING = "ring"
    RANDOM = "random"
    STAGNATION = "stagnation"


class StopReason(StrEnum):
    """Why a run or an island stopped."""

    WALL_TIME = "wall_time"
    CANDIDATES = "candidates"
    TOKENS = "tokens"
    SPEED_OF_LIGHT = "speed_of_light"
    INTERRUPTED = "interrupted"
    NO_PROGRESS = "no_progress"
