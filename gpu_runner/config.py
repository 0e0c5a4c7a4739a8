"""Configuration of the evaluation service and the job it evaluates.

:class:`RunnerConfig` is validated at construction and fails loudly with a :class:`ConfigError`
naming the bad field. :class:`EvalJob` is one candidate to evaluate against one reference.
Both are re-exported by :mod:`gpu_runner.service`, the module others import them from.
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType

from gpu_runner.errors import ConfigError
from gpu_runner.lease import COMPILE_PATIENCE_S
from gpu_runner.stats import DEFAULT_TOLERANCES as DEFAULT_TOLERANCES
from schemas import DeviceChoice, KernelLanguage, TorchOpsPolicy

PRECISION_MODES = ("reference", "exact")
"""``RunnerConfig.precision``'s values."""
HELD_OUT_TIMING = ("best", "all", "off")
"""``RunnerConfig.held_out_timing``'s values."""


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    """``--precision reference|exact`` (``kfoundry eval``, ``kfoundry run``)."""
    parser.add_argument(
        "--precision",
        choices=list(PRECISION_MODES),
        default=PRECISION_MODES[0],
        help="reference (default): precision parity, a candidate may err against float64 as much as the "
        "reference does at PyTorch's defaults (TF32 in cuDNN convolutions), never more; exact: as the "
        "reference in IEEE float32",
    )


GIB = 1 << 30

"""Element-wise tolerances per output dtype; integer and bool outputs must match exactly."""

DEFAULT_PRECISION_FLOORS: Mapping[str, float] = MappingProxyType(
    {
        # Relative L2 error against float64 that any honest kernel of this dtype may have.
        # TF32 (10-bit mantissa) and bf16 land near 1e-4..1e-2 on float32 problems: above 1e-5.
        "float64": 1e-12,
        "float32": 1e-5,
        "float16": 5e-3,
        "bfloat16": 3e-2,
    }
)
"""Precision floor per output dtype (relative L2 error against float64 always allowed)."""


def default_cache_dir() -> Path:
    """``$KFOUNDRY_HOME/cache``, or ``~/.kfoundry/cache``."""
    home = os.environ.get("KFOUNDRY_HOME")
    base = Path(home) if home else Path.home() / ".kfoundry"
    return base / "cache"


class IsolationMode(enum.StrEnum):
    """What happens when a confinement layer is not available on this machine."""

    STRICT = "strict"
    """Refuse to run candidates, saying which layer is missing and how to enable it."""
    BEST_EFFORT = "best-effort"
    """Run candidates with the layers that hold; every verdict names them, and a warning is logged."""


def _env_flag(name: str, default: bool = False) -> bool:
    """An on/off environment variable: ``0`` or ``1``, unset for ``default``; anything else is
    refused loudly."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: use 1 (on) or 0 (off)")
    return default if value == "" else value == "1"


KERNELS_PER_PROCESS = 4
"""A candidate's Triton kernels are compiled in one process per this many of them, up to the cores
the compile has (``gpu_runner.sandboxed.compiling``): a level-3 model's 100-160 kernels took 33 s
one after another on an H200 machine's host. The parent gives each compile that many cores
(``gpu_runner.compiler.CoreBudget``)."""


def compile_processes(cores: int, kernels: int) -> int:
    """How many processes compile a candidate of ``kernels`` Triton kernels with ``cores`` cores."""
    return max(1, min(cores, kernels // KERNELS_PER_PROCESS))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a cgroup's cpuset, ``taskset``, or
    ``kfoundry bench --parallel``'s share), which ``os.cpu_count()`` ignores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


@dataclass(frozen=True)
class RunnerConfig:
    """How the evaluator runs candidates. Every field is checked when the config is built."""

    device: DeviceChoice = DeviceChoice.AUTO
    """``cpu``, ``cuda``, or ``auto`` (CUDA when a GPU is present)."""
    spares: int = 2
    """Pre-warmed single-use run processes kept ready."""
    max_concurrent_runs: int = 1
    """Run processes executing candidates at once (per GPU); timing wants 1."""
    compile_workers: int = field(default_factory=usable_cores)
    """Compile processes at once."""
    gpu: str | None = None
    """The one GPU this service's workers may see (a ``CUDA_VISIBLE_DEVICES`` entry, ideally the
    ``GPU-…`` UUID); ``None``: whatever this process sees. One service per GPU on a machine with several."""
    host_memory_share: float = 1.0
    """Share of the host's available memory this service plans with (``1/n`` when ``n`` services,
    one per GPU, share the host)."""
    cache_dir: Path | None = None
    """Content-hash compile cache; ``None`` is :func:`default_cache_dir`."""
    work_dir: Path | None = None
    """Where private per-process directories are made; ``None`` is a fresh temporary directory."""
    trials: int = 5
    """Correctness trials, each with fresh inputs from a seed drawn with ``secrets``."""
    held_out_shapes: int = 3
    """Held-out shapes each candidate is also checked at, once, after its trials (0: none;
    :mod:`gpu_runner.sandboxed.held_out`). Wrong outputs at one make the candidate incorrect."""
    held_out_timing: str = "best"
    """Which candidates are also timed at their held-out shapes, against the eager reference there
    (the report's speedup at each shape; no verdict reads it): ``best``, those faster at the
    task's own shape than every correct candidate this evaluator timed before on the task (the
    run's best is always among them); ``all``; ``off``."""
    held_out_timing_s: float = 1.5
    """Wall-clock budget of one candidate's held-out timing (all its shapes together)."""
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=lambda: DEFAULT_TOLERANCES)
    """(atol, rtol) per floating output dtype."""
    precision_factor: float = 10.0
    """The candidate's error against float64 may be this many times the eager reference's."""
    precision: str = "reference"
    """``reference``: precision parity, a candidate may err against float64 as much as the
    reference does when it runs with PyTorch's defaults (TF32 in cuDNN convolutions), measured
    per task and output by the referee (``precision_parity_factor`` times it); ``exact``: only
    ``precision_factor`` times the IEEE float32 reference's error."""
    precision_parity_factor: float = 3.0
    """See ``precision`` and ``gpu_runner.compare.PARITY_FACTOR``."""
    precision_floors: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRECISION_FLOORS)
    """Relative L2 error against float64 always allowed, per dtype."""
    timing_target_rel_err: float = 0.005
    """Stop timing once the relative standard error of every timed callable is below this."""
    timing_min_reps: int = 30
    """Fewest timed calls per callable."""
    timing_max_reps: int = 2000
    """Most timed calls per callable."""
    timing_budget_s: float = 6.0
    """Wall-clock budget of the timing phase (all callables together)."""
    timing_pool_sessions: int = 3
    """A task's timing sessions whose baseline samples a later one pools with its own (timing
    each baseline in every other round only, where they agree: ``gpu_runner.timing_session``);
    0 times both baselines in every round of every session."""
    timing_pool_agree: float = 0.02
    """How far (a share) a session's own median of a baseline may be from the pooled sessions'
    for the pool to count (or three of their combined standard errors, if more, up to five times this)."""
    warmup_min_calls: int = 3
    """Warm-up calls per callable before timing."""
    warmup_min_s: float = 0.025
    """Warm-up time per callable before timing."""
    timing_lead_us: float = 50.0
    """The least device-side spin queued before each timed call (CUDA), so host launch delays are
    not timed; the session lengthens it to 1.5 times the slowest process's host time per call.
    On an H200 the 200 us floor this replaced set the lead of 5 of the cheat suite's 22 timed
    candidates (67db4a0); with 50 us the shortest lead chosen was 149 us (60ef435): the host's own
    time per call, not the floor, decides."""
    timing_batch_s: float = 0.02
    """Target length of one timed batch: the parent's clock brackets each, so longer batches
    shrink the pipe's share of it (see ``gpu_runner.crosscheck``)."""
    crosscheck_slack_us: float | None = None
    """Time per call outside the timed windows that a candidate's batches may take beyond the
    referee's (the same harness), absolute; ``None``: 25 us on CUDA, 1000 us on the CPU."""
    crosscheck_slack_ratio: float | None = None
    """The same, as a share of the candidate's median call; ``None``: 0.04 on CUDA, 0.25 on the CPU."""
    timing_ship_all_bytes: int = 1 << 20
    """A timed call's outputs up to this size come back with its batch (the parent judges a random
    sample of them); larger ones stay in the candidate's process and one call of some batches is
    shipped after it (``gpu_runner.timing_session``)."""
    canary_busy_us: float = 500.0
    """The referee's canary above this (and 20x its quiet median) means another process's work
    held the GPU: a candidate left work running after its batch returned."""
    compiled_baseline: bool | None = None
    """Time ``torch.compile`` of the reference; ``None``: on CUDA yes, on the CPU no."""
    compile_aside_bytes: int = 1 << 30
    """Tasks whose model, one input and one output together are at most this size build their
    ``torch.compile`` baseline in a process of its own beside the referee, so no verdict waits for
    the compilation (44-48 s for KernelBench's EfficientNets on an H200 host): candidates timed
    before it is ready are timed beside eager alone. Larger tasks (a second copy of the model and
    of the compiled graph's buffers would count against the memory plan) build it in the referee,
    before any verdict (unless :attr:`compile_aside_share` lets them build it aside). 0: always
    in the referee."""
    compile_aside_share: float = 0.15
    """Larger tasks build it aside too where that process (its context, the model, a timed batch
    and the compiled graph's buffers: :func:`gpu_runner.memplan.aside_bytes`) takes at most this
    share of the device's free memory, and the memory plan, with those bytes held back, keeps every
    trial, spare and byte of poison it had. On an H100 (2026-12-07) the referees of KernelBench
    tasks of 1.3-3.2 GB (L2-2, L2-4, L2-21, L3-25) spent 2.7-10.5 s building the baseline before
    their ``task_ready``, on the path to every first verdict (18.9-29.7 s from the run's start,
    against 13.8-18.7 s for the development convolutions built aside). 0: by size alone."""
    review_speedup: float = 10.0
    """Speedups above this need an explanation (speed-of-light headroom) or go to review."""
    peak_tflops: float | None = None
    """Arithmetic ceiling for speed-of-light; ``None``: from a device table or measured."""
    peak_gbps: float | None = None
    """Memory-bandwidth ceiling for speed-of-light; ``None``: from a device table or measured."""
    device_verdict_bytes: int = 256 << 20
    """Trial outputs at least this large are compared by the judge on the device, after the
    candidate's process is gone, instead of in the parent's numpy (see ``gpu_runner.memplan``)."""
    shared_outputs: bool = field(default_factory=lambda: _env_flag("KF_SHARED_OUTPUTS", default=True))
    """For tasks the judge compares, hand the trial outputs over in buffers the spare made before
    its candidate ran (device memory exported as file descriptors on CUDA, memfd on the CPU)
    instead of host files, where the memory plan fits them (``gpu_runner.sandboxed.shared_slots``).
    On by default (measured on an H100: a 4 GiB relu's run stage 2.4-3.1 s instead of 20-21 s
    through host files, the same verdicts); ``KF_SHARED_OUTPUTS=0`` turns it off for a run."""
    in_place_bytes: int = 1 << 30
    """Above this many bytes per trial, the process running a candidate copies neither inputs nor
    outputs: inputs are used in place and checked by checksums, outputs fingerprinted at return
    (``gpu_runner.memplan.LARGE_BYTES``; lowered in tests to exercise that path on small tasks)."""
    host_memory_limit_bytes: int = 16 * GIB
    """RLIMIT_DATA of a candidate's process."""
    device_memory_fraction: float = 0.9
    """Share of device memory a candidate's process may allocate."""
    max_file_bytes: int = 2 * GIB
    """RLIMIT_FSIZE of a candidate's process."""
    max_processes: int = 4096
    """RLIMIT_NPROC of the sandbox user (it counts threads of every process of that user)."""
    sandbox_user: str | None = "nobody"
    """User a candidate runs as when the evaluator is root; ``None`` keeps the evaluator's user."""
    network_isolation: bool = True
    """Run workers under ``unshare -n`` where the OS allows it."""
    pid_isolation: bool = True
    """Run workers in their own PID namespace where the OS allows it."""
    ipc_isolation: bool = True
    """Run workers in their own IPC namespace (no System V shared memory with other workers)."""
    mount_isolation: bool = True
    """Show a candidate a read-only filesystem with homes, the project and caches hidden."""
    landlock: bool = True
    """Confine workers' file access with Landlock where the kernel has it."""
    seccomp: bool = True
    """Filter workers' system calls with seccomp where the kernel allows it."""
    isolation: IsolationMode = IsolationMode.BEST_EFFORT
    """``strict``: refuse to run candidates unless every enabled layer holds; ``best-effort``: warn."""
    fork_server: bool = True
    """Fork workers from a server that imported torch, Triton and inductor once (same isolation,
    no device started in it) instead of starting each from a fresh interpreter."""
    enforce_gate: bool = True
    """Refuse candidates the static gate rejects; ``False`` records findings and runs anyway."""
    worker_nice: int = 10
    """Niceness of workers while they start, prepare or compile, so that the one being timed wins
    the CPU (it is raised back to 0 for its job where the evaluator may: as root); 0 turns it off."""
    compile_timeout_s: float = 600.0
    """Bound on one compile stage."""
    max_running: int = 0
    """Evaluations at once past the compile line (a spare, the run stage, the verdict), by turn;
    0: no bound. An evaluator actor that takes more candidates than it judges at once (to pick
    the best-ranked) sets it to what it judges at once: the memory plan counts its spares and one
    running candidate, and on an H200 (KernelBench L1-86) eight candidates past the line ran
    out of device memory."""
    compile_patience_s: float = COMPILE_PATIENCE_S
    """How long a compiled candidate waits for better-ranked ones still being compiled before it
    lines up for a spare (``gpu_runner.lease.CompileLine``: the first verdict is the first
    starting point's, not the fastest compile's); 0 turns it off."""
    reference_first_run_s: float = 30.0
    """Bound on the reference's first load, build and forward (on the meta device, with no data:
    the memory plan's measure). A reference still running then is refused as a task that does not
    work, with the line it was stuck on (a ``while True`` in its forward, a ``time.sleep`` at its top)."""
    worker_start_timeout_s: float = 180.0
    """Bound on a worker's start (imports and device initialisation)."""
    log_limit_chars: int = 8000
    """Compile and runtime logs are cut to this many characters (head and tail kept)."""
    python: str = sys.executable
    """Interpreter of the workers."""

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("spares", self.spares >= 0, "must be >= 0"),
            ("max_concurrent_runs", self.max_concurrent_runs >= 1, "must be >= 1"),
            ("compile_workers", self.compile_workers >= 1, "must be >= 1"),
            (
                "gpu",
                self.gpu is None or (bool(self.gpu.strip()) and "," not in self.gpu and self.gpu == self.gpu.strip()),
                "must name exactly one GPU (an index or a GPU-UUID)",
            ),
            ("host_memory_share", 0 < self.host_memory_share <= 1, "must be in (0, 1]"),
            ("compile_aside_share", 0 <= self.compile_aside_share <= 0.5, "must be in [0, 0.5]"),
            ("trials", self.trials >= 5, "must be >= 5 (fresh-seed trials the candidate cannot predict)"),
            ("precision_factor", self.precision_factor >= 1.0, "must be >= 1"),
            ("precision", self.precision in PRECISION_MODES, f"must be one of {', '.join(PRECISION_MODES)}"),
            ("precision_parity_factor", self.precision_parity_factor >= 1.0, "must be >= 1"),
            ("timing_target_rel_err", 0 < self.timing_target_rel_err < 1, "must be in (0, 1)"),
            ("timing_min_reps", self.timing_min_reps >= 3, "must be >= 3"),
            ("timing_max_reps", self.timing_max_reps >= self.timing_min_reps, "must be >= timing_min_reps"),
            ("timing_budget_s", self.timing_budget_s > 0, "must be > 0"),
            ("held_out_timing", self.held_out_timing in HELD_OUT_TIMING, f"must be one of {'/'.join(HELD_OUT_TIMING)}"),
            ("held_out_timing_s", self.held_out_timing_s > 0, "must be > 0"),
            ("timing_pool_sessions", self.timing_pool_sessions >= 0, "must be >= 0"),
            ("timing_pool_agree", self.timing_pool_agree > 0, "must be > 0"),
            ("warmup_min_calls", self.warmup_min_calls >= 1, "must be >= 1"),
            ("warmup_min_s", self.warmup_min_s >= 0, "must be >= 0"),
            ("timing_batch_s", 0.0 < self.timing_batch_s <= 1.0, "must be within (0, 1]"),
            (
                "crosscheck_slack_us",
                self.crosscheck_slack_us is None or self.crosscheck_slack_us >= 0,
                "must be >= 0",
            ),
            (
                "crosscheck_slack_ratio",
                self.crosscheck_slack_ratio is None or self.crosscheck_slack_ratio >= 0,
                "must be >= 0",
            ),
            ("canary_busy_us", self.canary_busy_us > 0, "must be > 0"),
            ("timing_ship_all_bytes", self.timing_ship_all_bytes >= 0, "must be >= 0"),
            ("review_speedup", self.review_speedup > 1, "must be > 1"),
            ("peak_tflops", self.peak_tflops is None or self.peak_tflops > 0, "must be > 0 or None"),
            ("peak_gbps", self.peak_gbps is None or self.peak_gbps > 0, "must be > 0 or None"),
            ("host_memory_limit_bytes", self.host_memory_limit_bytes >= 1 * GIB, "must be >= 1 GiB"),
            ("device_memory_fraction", 0 < self.device_memory_fraction <= 1, "must be in (0, 1]"),
            ("max_file_bytes", self.max_file_bytes >= 1 << 20, "must be >= 1 MiB"),
            ("device_verdict_bytes", self.device_verdict_bytes >= 0, "must be >= 0"),
            ("in_place_bytes", self.in_place_bytes >= 0, "must be >= 0"),
            ("max_processes", self.max_processes >= 64, "must be >= 64"),
            ("compile_timeout_s", self.compile_timeout_s > 0, "must be > 0"),
            ("compile_patience_s", self.compile_patience_s >= 0, "must be >= 0"),
            ("max_running", self.max_running >= 0, "must be >= 0"),
            ("reference_first_run_s", self.reference_first_run_s > 0, "must be > 0"),
            ("timing_lead_us", 0 <= self.timing_lead_us <= 10_000, "must be within 0..10000"),
            ("worker_nice", 0 <= self.worker_nice <= 19, "must be within 0..19"),
            ("worker_start_timeout_s", self.worker_start_timeout_s > 0, "must be > 0"),
            ("log_limit_chars", self.log_limit_chars >= 200, "must be >= 200"),
            ("sandbox_user", self.sandbox_user is None or bool(self.sandbox_user.strip()), "empty"),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise ConfigError(f"RunnerConfig.{name}", getattr(self, name), reason)
        try:
            IsolationMode(self.isolation)
        except ValueError:
            raise ConfigError("RunnerConfig.isolation", self.isolation, "must be strict or best-effort") from None
        try:
            DeviceChoice(self.device)
        except ValueError:
            raise ConfigError("RunnerConfig.device", self.device, "must be one of cpu, cuda, auto") from None
        for dtype, pair in self.tolerances.items():
            if len(pair) != 2 or min(pair) < 0:
                raise ConfigError("RunnerConfig.tolerances", {dtype: pair}, "each entry is (atol >= 0, rtol >= 0)")
        for dtype, floor in self.precision_floors.items():
            if floor < 0:
                raise ConfigError("RunnerConfig.precision_floors", {dtype: floor}, "floors must be >= 0")
        if not Path(self.python).exists():
            raise ConfigError("RunnerConfig.python", self.python, "no such interpreter")

    def confine_layers(self) -> dict[str, bool]:
        """Which confinement layers are enabled (by the names :mod:`gpu_runner.confine` uses)."""
        return {
            "ipc": self.ipc_isolation,
            "mount": self.mount_isolation,
            "landlock": self.landlock,
            "seccomp": self.seccomp,
            "strict": self.isolation is IsolationMode.STRICT,
        }

    def worker_device_env(self) -> dict[str, str]:
        """What pins a worker to :attr:`gpu`: add it to every GPU worker's environment (and the fork
        server's) before CUDA starts in it. Empty when no GPU is chosen or on the CPU."""
        if self.gpu is None or self.device is DeviceChoice.CPU:
            return {}
        return {"CUDA_VISIBLE_DEVICES": self.gpu}

    def resolved_cache_dir(self) -> Path:
        """The compile cache directory in use."""
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()

    def as_dict(self) -> dict[str, object]:
        """Plain values of every field (for logs and the worker)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out


@dataclass(frozen=True)
class EvalJob:
    """One candidate to evaluate against one reference."""

    reference_source: str
    """The KernelBench reference (``Model``, ``get_inputs``, ``get_init_inputs``)."""
    candidate_source: str
    """The candidate (``ModelNew`` with Triton or CUDA/C++ kernels)."""
    language: KernelLanguage
    """The language the candidate claims for its kernels."""
    timeout_s: float
    """Bound on the whole evaluation of this candidate."""
    run_id: str = ""
    candidate_id: str = ""
    island: str = ""
    task_id: str = ""
    attempt: int = 1
    evaluator: str = ""
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Free-form labels carried into logs."""
    torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID
    """The run's policy for PyTorch ops a candidate may keep (the reference's own, or none)."""
    precision: str | None = None
    """This job's precision standard (``reference`` or ``exact``); ``None``: the config's."""
    rank: int | None = None
    """The candidate's rank (``Candidate.rank``): among evaluations waiting together for a spare
    or the GPU, the lowest goes first; ``None``: after the ranked ones, in arrival order."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError("EvalJob.timeout_s", self.timeout_s, "must be > 0")
        if self.attempt < 1:
            raise ConfigError("EvalJob.attempt", self.attempt, "must be >= 1")
        if not self.reference_source.strip():
            raise ConfigError("EvalJob.reference_source", "", "is empty")
        if self.rank is not None and self.rank < 0:
            raise ConfigError("EvalJob.rank", self.rank, "must be >= 0")
        if self.precision is not None and self.precision not in PRECISION_MODES:
            raise ConfigError("EvalJob.precision", self.precision, f"must be one of {', '.join(PRECISION_MODES)}")
