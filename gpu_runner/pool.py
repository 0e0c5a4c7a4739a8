"""Pools of pre-warmed, single-use workers (parent side), and the task's referee.

:class:`RunPool` keeps ``spares`` run workers started (torch imported, device initialised) and,
once a task is known, prepared for it: each spare draws its trials' inputs from fresh secret seeds
(and makes its output buffers), while the referee (:mod:`gpu_runner.referee`, one process per
task that never runs a candidate) computes the reference's outputs for the same seeds and ships
them to the parent. So the parent holds a spare's reference data before a candidate arrives, and
the spare, where the candidate will run, never held any. A spare is handed out once and never
returned. :class:`CompilePool` keeps compile workers warm the same way (on CUDA; on the CPU they
start on demand).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import count
from pathlib import Path
from typing import Any

import numpy.typing as npt
import psutil
import structlog

from gpu_runner.compare import parity_outputs
from gpu_runner.config import RunnerConfig, usable_cores
from gpu_runner.errors import (
    EvaluatorFault,
    InvalidReference,
    ProtocolError,
    TaskTooLarge,
    WorkerStartError,
    stuck_traceback,
)
from gpu_runner.forkserver import ForkServer
from gpu_runner.frames import MeasureOp, Op, PrepareOp, Report, TaskOp, op_frame
from gpu_runner.lease import UNRANKED, GpuGate, GpuLease, Turn, renice
from gpu_runner.memplan import (
    INPUTS_ON_DEVICE_BYTES,
    ON_DEVICE_BYTES,
    TRUTH_WORKERS,
    Footprint,
    MemoryPlan,
    aside_bytes,
    plan,
)
from gpu_runner.protocol import Blob, FrameError, tensor_from_wire
from gpu_runner.referee import Referee, Truth
from gpu_runner.sandbox import Isolation, SharedOutput, Worker, await_ready, bulk_root, receive_shared, spawn_worker
from gpu_runner.triton_cache import copy_tree
from schemas.task import source_fingerprint

logger = structlog.get_logger(__name__)
_names = count()
MAX_SPARE_FAILURES = 3
"""Spares failing in a row before the pool stops starting them (a retarget or a success resets it)."""


def task_key(reference_source: str) -> str:
    """Content hash of a reference (its task id: :func:`schemas.task.source_fingerprint`)."""
    return source_fingerprint(reference_source)


@dataclass
class ReferenceData:
    """What the parent holds for a prepared spare before any candidate exists: the referee's
    outputs for the spare's seeds, and what the spare reported of its inputs."""

    outputs: list[list[npt.NDArray[Any]]] = field(default_factory=list)
    residuals: list[list[npt.NDArray[Any]] | None] = field(default_factory=list)
    """Per trial: the float64 reference's outputs minus the reference's own (``None``: no float64 run)."""
    default_errors: list[list[Any] | None] = field(default_factory=list)
    """Per trial: the reference's error at PyTorch's defaults on its inputs, per output (``None``:
    not measured; :meth:`gpu_runner.compare.PrecisionRule.on_trial`)."""
    dtypes: list[list[str]] = field(default_factory=list)
    fp64_error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """The referee's ``task_ready`` (FLOPs, bytes, output metadata, baseline) and the spare's
    ``prepared`` (its phases and output buffers)."""
    lease_s: float = 0.0
    """Seconds the spare held its (shared) GPU lease while preparing."""
    judged: bool = False
    """The judge compares this spare's trials on the GPU (nothing is shipped; the judge rebuilds
    the reference from ``seeds`` and ``init_seed``, proven by ``input_sums``)."""
    seeds: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    """Per trial, the factor its floating inputs were drawn at (1.0, or a range trial's scale)."""
    init_seed: int = 0
    on_device: bool = False
    init_on_device: bool = False
    input_sums: list[list[int | None]] = field(default_factory=list)
    """Per trial, checksums of the inputs the spare drew, made before any candidate existed."""
    metas: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per trial, the wire metadata (dtype, shape, nbytes) of the reference's outputs."""
    files: Path | None = None
    """Where the candidate's output files wait for the judge (out of every worker's reach)."""
    variants: list[dict[str, Any]] = field(default_factory=list)
    """The held-out shapes the spare drew inputs at (``label``, ``overrides``; see
    :func:`held_out_shapes`), in the order of ``variant_truths``."""
    variant_truths: list[Truth] = field(default_factory=list)
    variants_note: str = ""
    """How the held-out shapes were drawn, or why there are none."""

    def discard(self) -> None:
        """Remove the reference files (the spare is used up or killed)."""
        if self.files is not None:
            shutil.rmtree(self.files, ignore_errors=True)
            self.files = None


def _take_shared(worker: Worker, metas: list[list[dict[str, Any]]], timed_slots: int = 0) -> None:
    """Keep the shared output buffers a judged spare sent before its ``prepared`` frame (none:
    its trials go through host files). They must be one per reference output of every trial and
    of every timed slot (numbered after the trials), each large enough."""
    if worker.share is None:
        return
    try:
        received = receive_shared(worker.share)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    worker.share.close()  # the spare closed its end; nothing more comes over it
    worker.share = None
    for entry, fd in received:
        key = (int(entry["trial"]), int(entry["index"]))
        worker.shared[key] = SharedOutput(fd, int(entry["size"]), str(entry["dtype"]), tuple(entry["shape"]))
    if not received:
        return
    slots = metas + [metas[0]] * timed_slots if metas else []
    wanted = {(t, i): m for t, outs in enumerate(slots) for i, m in enumerate(outs)}
    wrong = set(wanted) != set(worker.shared) or any(
        out.dtype != str(wanted[k].get("dtype"))
        or list(out.shape) != list(wanted[k].get("shape", []))
        or out.size < int(wanted[k].get("nbytes") or 0)
        for k, out in worker.shared.items()
    )
    if wrong:
        worker.close_shared()
        raise ProtocolError("the spare's shared outputs do not match its reference outputs")


def held_out_shapes(measured: dict[str, Any], fp: Footprint) -> tuple[list[dict[str, Any]], str]:
    """The held-out shapes a measuring worker derived (:mod:`gpu_runner.sandboxed.held_out`), as
    many as fit in one trial's bytes together (the memory plan counts a spare's trials, not these),
    and its note on how they were drawn."""
    note = str(measured.get("variants_note") or "")[:500]
    room = fp.input_bytes + fp.output_bytes
    kept: list[dict[str, Any]] = []
    for v in measured.get("variants") or []:
        if not isinstance(v, dict):
            continue
        overrides = v.get("overrides")
        if not isinstance(overrides, dict) or not all(
            isinstance(k, str) and type(n) is int for k, n in overrides.items()
        ):
            continue
        nbytes = int(v.get("nbytes") or 0)
        if nbytes > room:
            note += f"; not checked: {v.get('label')} (no room beside the trials)"
            continue
        room -= nbytes
        kept.append({"label": str(v.get("label") or overrides)[:300], "overrides": dict(overrides), "nbytes": nbytes})
    return kept, note


def trial_scales(trials: int, range_scales: list[float]) -> list[float]:
    """Per trial, the factor its floating inputs are drawn at: typical draws (1.0) first, then up
    to two range trials (the referee's large and small scales, where the reference stays finite),
    always leaving at least one typical draw."""
    ranged = range_scales[: max(0, min(2, trials - 1))]
    return [1.0] * (trials - len(ranged)) + ranged


def small_for_aside(fp: Footprint, cfg: RunnerConfig) -> bool:
    """A task small enough to build its ``torch.compile`` baseline aside without the memory plan
    holding bytes back for it (:attr:`RunnerConfig.compile_aside_bytes`)."""
    return fp.param_bytes + fp.input_bytes + fp.output_bytes <= cfg.compile_aside_bytes


def plan_with_aside(fp: Footprint, cfg: RunnerConfig, **kwargs: Any) -> MemoryPlan:
    """The task's memory plan (:func:`gpu_runner.memplan.plan`, ``kwargs``), with the compiled
    baseline built aside where the task is past :attr:`RunnerConfig.compile_aside_bytes` but its
    process (:func:`aside_bytes`) takes at most :attr:`RunnerConfig.compile_aside_share` of the
    device's free memory and the plan, with those bytes held back, keeps every trial, spare and
    byte of poison it had (no evaluation is planned smaller to start verdicts sooner)."""
    made = plan(fp, **kwargs)
    free = kwargs.get("device_free") or fp.device_free
    if (
        kwargs.get("device") != "cuda"
        or not made.compiled_baseline
        or small_for_aside(fp, cfg)
        or not free
        or aside_bytes(fp) > cfg.compile_aside_share * free
    ):
        return made
    try:
        held = plan(fp, reserved=aside_bytes(fp), **kwargs)
    except TaskTooLarge:
        return made
    same = (held.trials, held.spares, held.poison_bytes, held.shared_outputs, held.compiled_baseline)
    if same != (made.trials, made.spares, made.poison_bytes, made.shared_outputs, made.compiled_baseline):
        return made
    return replace(
        held,
        compile_aside=True,
        notes=[*held.notes, f"torch.compile baseline built aside ({aside_bytes(fp) / (1 << 30):.1f} GiB held back)"],
    )


@dataclass
class Spare:
    """A started run worker, possibly prepared for one task."""

    worker: Worker
    task: str | None = None
    reference: ReferenceData | None = None


COMPILE_ASIDE_UNNICED_CORES = 8
"""Hosts with at least this many usable cores run the compiled baseline's process at nice 0 (it
is trusted code that never runs a candidate; with fewer cores its compilation would take the CPU
from a candidate being timed)."""


async def stuck_stack(worker: Worker, wait_s: float = 1.0) -> str:
    """The log of a worker stuck in the reference, with the line it is stuck on last
    (:func:`gpu_runner.errors.stuck_traceback`): asked for its Python stack with SIGUSR1 (its
    ``faulthandler``, registered while it measures the task), then read for up to ``wait_s``."""
    for pid in worker.innermost():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGUSR1)
    end = time.monotonic() + wait_s
    while True:
        text = worker.log_text()
        found = stuck_traceback(text)
        if found is not None or time.monotonic() >= end:
            return found or text[-2000:]
        await asyncio.sleep(0.05)


class RunPool:
    """Single-use run workers, started ahead and prepared for the current task."""

    def __init__(
        self,
        cfg: RunnerConfig,
        iso: Isolation,
        device: str,
        base: Path,
        env: dict[str, str],
        gpu: GpuGate | None = None,
    ) -> None:
        self.cfg = cfg
        self.gpu = gpu or GpuGate(cfg.max_concurrent_runs)
        """Timing holds it alone; spares' preparations hold it together (their CUDA start needs none)."""
        self.iso = iso
        self.device = device
        self.base = base
        self.env = {**env, **cfg.worker_device_env()}
        """Every run worker's (and so the judge's) extra environment, pinned to ``cfg.gpu``."""
        self.idle: list[Spare] = []
        self.starting = 0
        self.held = 0
        """Spares evaluations took (:meth:`acquire`) and have not given back (:meth:`release`): one
        waiting for the GPU holds its trials' device memory as an idle spare does."""
        self.peak_alive = 0
        """The most spares idle, starting and held at once (for tests and benchmarks)."""
        self.reference_source: str | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        # Half the cores: with one start per core (16 on an H200 host, beside 16 compiles) each
        # start took 50 s instead of 15 s, and the GPU waited for the whole batch.
        self.start_sem = asyncio.Semaphore(max(2, min(cfg.spares, usable_cores() // 2)))
        self.idle_changed = asyncio.Event()
        self._waiting: set[Turn] = set()
        """The turns of the evaluations waiting in :meth:`acquire` (they take spares in order)."""
        self._arrivals = count()
        self.last_ready: dict[str, Any] = {}
        self.seeds: dict[str | None, Path] = {}
        """Triton caches copied from candidate-free workers for later spares: the driver build
        (key None) and, per task, one holding the reference's kernels, so they are not rebuilt."""
        self.seeding: set[str | None] = set()
        self.prepared = 0
        """Spares prepared so far (for benchmarks)."""
        self.referee = Referee(
            self.new_referee, self.gpu, cfg.worker_nice, cfg.worker_start_timeout_s, cfg.timing_pool_sessions
        )
        """The current task's referee: its reference, truth and baselines (never a candidate)."""
        self.truth_workers = asyncio.Semaphore(TRUTH_WORKERS)
        """Truth workers alive at once: a spare's trials' truths and a finished candidate's judged
        timed calls' are computed in short-lived processes that never run a candidate, beside the
        referee (which times and judges) instead of queued behind it. On an H200 the referee alone,
        shipping 640 MB of reference data per spare of a 64 MB relu, bounded a stream of such
        candidates to ~0.6 a second (bench/results/trust_h200.md)."""
        self.compiled_referee = Referee(
            self._new_compile_worker,
            self.gpu,
            0 if usable_cores() >= COMPILE_ASIDE_UNNICED_CORES else cfg.worker_nice,
            cfg.worker_start_timeout_s,
            cfg.timing_pool_sessions,
        )
        """The current task's ``torch.compile`` baseline in a process of its own (a ``compiled_only``
        task, :meth:`compile_aside`): timing sessions time it beside eager once it is ready."""
        self.compiling: asyncio.Task[None] | None = None
        self.compile_started = 0.0
        self.compile_failed: str | None = None
        self.idle_truth: list[Referee] = []
        """Truth workers of the current task between jobs: kept, not restarted for every job (a
        start, its CUDA context and the model cost ~0.3-1 s on an H200 host, twice a candidate).
        They never run a candidate, so one may serve many."""
        self.init_seeds: dict[str, int] = {}
        """Per task, the seed its models are built under (the referee's, every candidate's, the judge's)."""
        self.preparations: list[tuple[float, float, float]] = []
        """Per prepared spare, when its preparation began (under ``prep_sem``), when its reference
        was done (``prep_sem`` given back) and when it ended (``time.perf_counter``; for benchmarks)."""
        self.failures = 0
        """Spares that failed in a row; at ``MAX_SPARE_FAILURES`` no more are started."""
        self.failure: str | None = None
        """Why spares stopped being started (the last failure), once they did."""
        self.forks: ForkServer | None = None
        """Where spares are forked from (None: fresh interpreters)."""
        self.closed = False
        self.plan: MemoryPlan | None = None
        """The current task's memory plan (None until a task is known, or on an old reference)."""
        self.plans: dict[str, MemoryPlan] = {}
        self.variants: dict[str, tuple[list[dict[str, Any]], str]] = {}
        """Per task, its held-out shapes (:func:`held_out_shapes`) and how they were drawn."""
        self.variant_seeds: dict[str, list[int]] = {}
        """Per task, the secret seeds of its held-out shapes' inputs: drawn once, as their truths
        are computed once (:attr:`variant_truths`)."""
        self.variant_truths: dict[str, list[Truth]] = {}
        self.best_ms: dict[str, float] = {}
        """Per task, the least median of a correct candidate timed here (:meth:`held_out_bar`)."""
        """Per task, the reference's outputs at its held-out shapes. Computed for every spare, they
        made the referee the bottleneck of tasks judged on the device (an H200, KernelBench L1-86:
        14 candidates in 60 s instead of 38, a spare's preparation 4-6 s instead of under 1)."""
        self.planned = asyncio.Event()
        """Set while the current task's plan is known (spares wait for it before they prepare)."""
        self.planned.set()
        self.prep_sem: asyncio.Semaphore | None = None
        """Spares that prepare at once when the plan had to cut (one at a time then)."""
        self._retargeting = asyncio.Lock()
        """Held by :meth:`retarget`: one task's preparation at a time."""

    async def new_worker(self, env: dict[str, str] | None = None) -> Worker:
        """Start one run worker (``env`` added to its environment) and wait until it is ready."""
        async with self.start_sem:
            name = f"run-{next(_names)}"
            extra = {**self.env, **(env or {})}
            triton_dir = self.base / name / "triton"
            extra["TRITON_CACHE_DIR"] = str(triton_dir)
            task = task_key(self.reference_source) if self.reference_source else None
            tree = self.seeds.get(task) or self.seeds.get(None)
            seed = {"triton": tree} if tree is not None else None
            worker = await spawn_worker(
                "run", self.device, self.iso, self.cfg.python, self.base, name, extra, seed, self.forks
            )
            try:
                await await_ready(worker, self.cfg.worker_start_timeout_s)
            except BaseException:
                await worker.kill(sweep=False)
                raise
            self.last_ready = worker.ready
            return worker

    async def _new_compile_worker(self) -> Worker:
        """A run worker for the compiled baseline: at nice 0 where the host has the cores
        (:data:`COMPILE_ASIDE_UNNICED_CORES`), so its compilation is not queued behind the spares'
        and candidates' work at the workers' niceness (KernelBench L3-22's, 32 s in the referee at
        the task's start, was not ready within a 75 s run built aside at nice 10 on an H200 host)."""
        worker = await self.new_worker()
        if self.compiled_referee.nice == 0 and self.cfg.worker_nice:
            refused = renice(worker.pid, 0)
            if refused is not None:
                logger.debug("compile_worker_nice_kept", error=str(refused))
        return worker

    async def new_referee(self) -> Worker:
        """A run worker to become the task's referee (and judge: it also reads the verdict folder)."""
        return await self.new_worker({"KF_JUDGE_DIR": str(self.verdict_dir())})

    async def _measure(self, worker: Worker, reference_source: str) -> MemoryPlan:
        """Measure the task's working set in ``worker`` (which stays usable as a spare) and derive
        the memory plan; raises :class:`TaskTooLarge` when one evaluation cannot fit."""
        key = task_key(reference_source)
        bound = self.cfg.reference_first_run_s
        try:
            async with asyncio.timeout(bound):
                await worker.send(
                    op_frame(
                        Op.MEASURE,
                        MeasureOp(reference_source=reference_source, held_out_shapes=self.cfg.held_out_shapes),
                    )
                )
                header, _ = await worker.recv(1 << 20)
        except TimeoutError:
            raise InvalidReference(
                f"the reference did not finish its first load and run within {bound:g} s (on the meta device, "
                "with no data): it never returns",
                await stuck_stack(worker),
            ) from None
        except asyncio.IncompleteReadError:
            raise WorkerStartError(
                "run", "the worker died while measuring the task", worker.log_text()[-3000:]
            ) from None
        if header["kind"] is not Report.MEASURED:
            raise ProtocolError(f"unexpected {header.get('kind')!r} while measuring the task")
        if header.get("variants_error"):  # the task declares its dynamic dimensions wrongly
            raise InvalidReference(str(header["variants_error"]))
        fp = Footprint.from_wire(header)
        made = plan_with_aside(
            fp,
            self.cfg,
            device=self.device,
            max_trials=self.cfg.trials,
            max_spares=self.cfg.spares,
            host_available=int(psutil.virtual_memory().available * self.cfg.host_memory_share),
            device_verdict_bytes=self.cfg.device_verdict_bytes,
            large_bytes=self.cfg.in_place_bytes,
            ship_all_bytes=self.cfg.timing_ship_all_bytes,
            shared_outputs=self.cfg.shared_outputs,
            compiled_baseline=self.device == "cuda"
            if self.cfg.compiled_baseline is None
            else self.cfg.compiled_baseline,
        )
        logger.info(
            "memory_plan",
            task=key,
            plan=made.summary(),
            input_bytes=fp.input_bytes,
            output_bytes=fp.output_bytes,
            param_bytes=fp.param_bytes,
            device_free=fp.device_free,
            method=fp.method,
        )
        self.plans[key] = made
        self.variants[key] = held_out_shapes(header, fp)
        return made

    def spares_wanted(self) -> int:
        return self.plan.spares if self.plan is not None else self.cfg.spares

    def capacity(self) -> int:
        """Spares alive at once (idle, starting, or held by an evaluation): what the memory plan
        counts, its spares beside the candidates running. Evaluations past the compile line
        (``max_running``, the evaluator actor's concurrency) took a spare each before: on an 80 GB
        H100, KernelBench L1-57's plan of one spare (15.7 GB each) had five alive and ran out."""
        return self.spares_wanted() + max(1, self.cfg.max_concurrent_runs)

    def alive(self) -> int:
        return len(self.idle) + self.starting + self.held

    def _full(self) -> bool:
        return self.alive() >= self.capacity()

    def _count(self) -> None:
        self.peak_alive = max(self.peak_alive, self.alive())

    def release(self) -> None:
        """An evaluation is done with the spare it took (its process gone, its outputs judged)."""
        self.held = max(0, self.held - 1)
        self.refill()
        self.idle_changed.set()

    def trials_wanted(self) -> int:
        return self.plan.trials if self.plan is not None else self.cfg.trials

    async def prepare(self, spare: Spare, reference_source: str, timeout_s: float) -> None:
        """Have a spare draw its trials' inputs from fresh secret seeds, and the referee compute the
        reference's outputs for them; keep those here.

        Under ``prep_sem`` only the drawing of the inputs is one at a time: the spare's
        ``reference_done`` lets the next one start while this one makes its output buffers."""
        sem = self.prep_sem
        if sem is not None:
            await sem.acquire()
        began, reference_done = time.perf_counter(), 0.0

        def done() -> None:
            nonlocal sem, reference_done
            reference_done = reference_done or time.perf_counter()
            held = sem
            if held is not None:
                sem = None
                held.release()

        try:
            await self._prepare(spare, reference_source, timeout_s, on_reference_done=done)
        finally:
            done()
        self.preparations.append((began, reference_done, time.perf_counter()))

    async def _prepare(
        self,
        spare: Spare,
        reference_source: str,
        timeout_s: float,
        on_reference_done: Callable[[], None] | None = None,
    ) -> None:
        started = time.perf_counter()
        task = task_key(reference_source)
        if self.referee.task != task:
            raise ProtocolError("the task's referee is not ready (its task changed or it failed)")
        info = dict(self.referee.info)
        trials = self.trials_wanted()
        seeds = [secrets.randbits(62) for _ in range(trials)]
        scales = trial_scales(trials, [float(x) for x in info.get("range_scales") or []])
        device_verdict = self.plan is not None and self.plan.device_verdict
        on_device = self.plan is not None and self.plan.footprint.input_bytes >= INPUTS_ON_DEVICE_BYTES
        init_on_device = bool(info.get("init_on_device"))
        out_metas = [dict(m) for m in info.get("out_metas") or []]
        variants, variants_note = self.variants.get(task, ([], "the task was not measured"))
        variant_seeds = self.variant_seeds.setdefault(task, [secrets.randbits(62) for _ in variants])
        op = PrepareOp(
            reference_source=reference_source,
            init_seed=self.init_seeds[task],
            trial_seeds=seeds,
            trial_scales=scales,
            out_metas=out_metas,
            device_verdict=device_verdict,
            inputs_on_device=on_device,
            init_on_device=init_on_device,
            in_place_bytes=self.cfg.in_place_bytes,
            shared_outputs=self.plan is not None and self.plan.shared_outputs,
            timed_slots=self.plan.timed_slots if self.plan is not None else 0,
        )
        if variants:
            op["variants"] = [dict(v["overrides"]) for v in variants]
            op["variant_seeds"] = variant_seeds
        msg = op_frame(Op.PREPARE, op)
        data = ReferenceData(
            judged=device_verdict,
            seeds=seeds,
            scales=scales,
            init_seed=self.init_seeds[task],
            on_device=on_device,
            init_on_device=init_on_device,
            info=info,
            variants=list(variants),
            variants_note=variants_note,
        )
        await spare.worker.send(msg)
        try:
            # The referee computes the reference's outputs for the spare's seeds meanwhile (the
            # judge does it after the candidate, for outputs judged on the device; the held-out
            # shapes' are compared on the host for every task). One request for the trials and the
            # held-out shapes (each request copies the model to float64); the held-out shapes'
            # truths are asked for once per task (by its first spare).
            none: dict[str, int] = {}
            trial_seeds = [] if device_verdict else seeds
            shaped = [] if task in self.variant_truths else variants  # none yet: this spare asks
            sizes = [none for _ in trial_seeds] + [dict(v["overrides"]) for v in shaped]
            truths = (
                asyncio.create_task(
                    self.truths(
                        reference_source,
                        trial_seeds + variant_seeds[: len(shaped)],
                        scales[: len(trial_seeds)] + [1.0] * len(shaped),
                        0,
                        overrides=sizes if shaped else None,
                    )
                )
                if sizes
                else None
            )
            try:
                await self._collect_reference(spare, data, timeout_s, on_reference_done)
            finally:
                if truths is not None:
                    done = await asyncio.gather(truths, return_exceptions=True)
            if truths is not None:
                got = done[0]
                if isinstance(got, BaseException):
                    raise got
                if shaped:
                    self.variant_truths[task] = list(got[len(trial_seeds) :])
                for truth in got[: len(trial_seeds)]:
                    data.outputs.append(truth.outputs)
                    data.dtypes.append(truth.dtypes)
                    data.residuals.append(truth.residuals)
                    data.default_errors.append(truth.default_errors)
                    data.fp64_error = data.fp64_error or truth.fp64_error
            data.variant_truths = list(self.variant_truths.get(task, [])) if variants else []
        except asyncio.IncompleteReadError:
            data.discard()
            log = spare.worker.log_text()[-3000:]
            raise WorkerStartError("run", "the worker died while drawing its inputs", log) from None
        except BaseException:
            data.discard()
            raise
        spare.task = task
        spare.reference = data
        self.prepared += 1
        # Start-up phases, then the preparation's (a later name wins; nothing may collide into an error).
        phases = {**(spare.worker.ready.get("phases") or {}), **(data.info.get("phases") or {})}
        logger.info(
            "spare_prepared",
            worker=spare.worker.dir.name,
            startup_s=round(float(spare.worker.ready.get("startup_s") or 0.0), 3),
            prepare_s=round(time.perf_counter() - started, 3),
            lease_s=round(data.lease_s, 3),
            phases={k: round(float(v), 3) for k, v in phases.items()},
            output_slots=data.info.get("output_slots"),
        )

    async def _collect_reference(
        self,
        spare: Spare,
        data: ReferenceData,
        timeout_s: float,
        on_reference_done: Callable[[], None] | None = None,
    ) -> None:
        lease = GpuLease(self.gpu, spare.worker, self.cfg.worker_nice)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    header, _ = await spare.worker.recv(1 << 40)
                    kind = header.get("kind")
                    if await lease.handle(kind):
                        continue
                    if kind is Report.REFERENCE_DONE:
                        if on_reference_done is not None:
                            on_reference_done()
                    elif kind is Report.PREPARED:
                        data.info = {
                            **data.info,
                            "phases": header.get("phases"),
                            "output_slots": header.get("output_slots"),
                        }
                        data.input_sums = [list(x) for x in header.get("input_sums") or []]
                        data.metas = [list(x) for x in header.get("out_metas") or []]
                        if len(data.input_sums) != len(data.seeds) or len(data.metas) != len(data.seeds):
                            raise ProtocolError("the spare reported checksums or outputs for other trials")
                        if data.judged:
                            _take_shared(spare.worker, data.metas, self.plan.timed_slots if self.plan else 0)
                    elif kind is Report.PREPARE_TIME:  # the last frame of a preparation
                        break
                    elif kind is Report.REFERENCE_ERROR:
                        raise InvalidReference(str(header.get("message")), str(header.get("traceback", ""))[-2000:])
                    else:
                        raise ProtocolError(f"unexpected {kind!r} while preparing")
        finally:
            await lease.drop()
            data.lease_s += lease.seconds

    async def truths(
        self,
        reference_source: str,
        seeds: list[int],
        scales: list[float],
        first: int,
        skips: list[int] | None = None,
        timed: bool = False,
        overrides: list[dict[str, int]] | None = None,
    ) -> list[Truth]:
        """The reference's outputs and float64 residuals of ``seeds`` (see :meth:`Referee.truths`;
        ``overrides``: per seed, a held-out shape's sizes), from a truth worker, or from the referee
        itself where the plan has none (a large task). Each measure of the reference at PyTorch's
        defaults on inputs of the task's shape may raise the task's calibration at its scale where
        that fell back (:meth:`Referee.raise_defaults`)."""
        key = task_key(reference_source)
        got = await self._truths(reference_source, seeds, scales, first, skips, timed, overrides)
        for i, truth in enumerate(got):
            if i < len(scales) and not (overrides and i < len(overrides) and overrides[i]):  # the task's shape
                self.referee.raise_defaults(key, truth.default_errors, scales[i])
        return got

    async def _truths(
        self,
        reference_source: str,
        seeds: list[int],
        scales: list[float],
        first: int,
        skips: list[int] | None,
        timed: bool,
        overrides: list[dict[str, int]] | None,
    ) -> list[Truth]:
        key = task_key(reference_source)
        plan = self.plans.get(key)
        # the referee's calibration names the outputs to measure at PyTorch's defaults per trial
        parity = parity_outputs(self.referee.info) if self.referee.task == key else []
        if plan is None or not plan.truth_workers or self.referee.task != key:
            return await self.referee.truths(seeds, scales, first, skips, timed, parity, overrides)
        async with self.truth_workers:
            worker = await self._idle_truth_worker(key)
            if worker is None:
                worker = Referee(self.new_worker, self.gpu, self.cfg.worker_nice, self.cfg.worker_start_timeout_s)
                # built where the referee built its model (it falls back to the CPU where the device refuses)
                op = self._task_op(reference_source, plan, bool(self.referee.info.get("init_on_device")), light=True)
                try:
                    await worker.start_task(key, op)
                except BaseException:
                    await worker.aclose()
                    raise
            kept = False
            try:
                got = await worker.truths(seeds, scales, first, skips, timed, parity, overrides)
                kept = not self.closed and self.referee.task == key and worker.alive
                if kept:
                    self.idle_truth.append(worker)
                return got
            finally:
                if not kept:
                    await worker.aclose()

    async def _idle_truth_worker(self, key: str) -> Referee | None:
        """A truth worker of task ``key`` waiting for work (others are stopped), or None."""
        while self.idle_truth:
            worker = self.idle_truth.pop()
            if worker.task == key and worker.alive:
                return worker
            await worker.aclose()
        return None

    async def _close_truth_workers(self) -> None:
        while self.idle_truth:
            await self.idle_truth.pop().aclose()

    def verdict_dir(self) -> Path:
        """Where the judge's files wait, on the bulk files' file system (moves are renames)."""
        path = bulk_root(self.base) / "verdict"
        bulk_root(self.base).mkdir(mode=0o711, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def compiled_baseline(self) -> bool:
        if self.plan is not None and not self.plan.compiled_baseline:
            return False
        if self.cfg.compiled_baseline is not None:
            return self.cfg.compiled_baseline
        return self.device == "cuda"

    async def acquire(self, reference_source: str, timeout_s: float, turn: Turn | None = None) -> tuple[Spare, bool]:
        """A spare prepared for this reference (and whether it was warm); starts replacements.

        Evaluations waiting for spares together get them in ``turn`` order (lowest first; none
        given: after every ranked one, in arrival order): at a run's start every candidate waits
        for the task's plan, and the first spares go to the first starting points, not to whichever
        candidate compiled first."""
        key = task_key(reference_source)
        await self.plan_for(reference_source)
        me = turn if turn is not None else (UNRANKED, next(self._arrivals))
        self._waiting.add(me)
        try:
            await asyncio.sleep(0)  # those woken with it by the task's plan get in line first
            spare = self._take(key, me)
            warm = spare is not None
            self.refill()
            # a spare on its way or ready, or none may be made now (as many alive as the plan has)
            while spare is None and (self.starting > 0 or self._ready_for(key) or self._full()):
                self.idle_changed.clear()
                await self.idle_changed.wait()
                spare = self._take(key, me)
            self.held += 1  # taken, or about to be made below: either way counted from now
            self._count()
        finally:
            self._waiting.discard(me)
            self.idle_changed.set()  # the waiters after this one may take the spares left
        self.refill()
        if spare is None:
            try:
                worker = await self.new_worker()
            except BaseException:
                self.release()
                raise
            spare = Spare(worker)
            try:
                await self.prepare(spare, reference_source, timeout_s)
            except BaseException:
                self.release()
                await worker.kill(sweep=False)
                if spare.reference is not None:
                    spare.reference.discard()
                raise
            if self.failure is not None:  # workers start again: so may spares
                self._recovered()
                self.refill()
        return spare, warm

    def _ready_for(self, key: str) -> list[Spare]:
        return [s for s in self.idle if s.task == key and s.reference is not None]

    def _take(self, key: str, me: Turn) -> Spare | None:
        """A ready spare for ``me``, unless the waiters ahead of it take every one there is."""
        ready = self._ready_for(key)
        ahead = sum(1 for other in self._waiting if other < me)
        if len(ready) <= ahead:
            return None
        self.idle.remove(ready[0])
        return ready[0]

    def refill(self) -> None:
        """Start spares until ``spares`` are idle or on their way."""
        if self.closed or self.failure is not None:
            return
        while len(self.idle) + self.starting < self.spares_wanted() and not self._full():
            self._spawn_spare(None)

    def prepare_ahead(self) -> None:
        """Prepare the next evaluation's worker now (when none is idle or on its way).

        For a plan that fits one evaluation at a time (no spares): called once an evaluation has
        ended, judge included, so the next one finds its reference ready instead of preparing it
        on its critical path; meanwhile the next candidate compiles (on the CPU). Nothing else
        holds the device then, which is what the plan counted for a preparing spare."""
        if self.closed or self.failure is not None or self.reference_source is None:
            return
        if not self.idle and not self.starting and not self._full():
            self._spawn_spare(None, ahead=True)

    def _spawn_spare(self, worker: Worker | None, ahead: bool = False) -> None:
        self.starting += 1
        self._count()
        task = asyncio.create_task(self._start_spare(worker, ahead))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _start_spare(self, worker: Worker | None, ahead: bool = False) -> None:
        kept = False
        spare: Spare | None = None
        try:
            # the worker that measured the task, or one prepared ahead: kept whatever the plan's spares
            kept_anyway = worker is not None or ahead
            if worker is None:
                worker = await self.new_worker()
            await self.keep_seed(worker, None)
            spare = Spare(worker)
            await self.planned.wait()  # a spare started before the plan prepares by the plan
            if not kept_anyway and len(self.idle) + self.starting > self.spares_wanted():
                return  # the plan wants fewer spares than were started before it was known
            if self.reference_source is not None:
                await self.prepare(spare, self.reference_source, self.cfg.worker_start_timeout_s)
                await self.keep_seed(worker, spare.task)
            if not self.closed:
                self.idle.append(spare)
                kept = True
                self._recovered()
        except asyncio.IncompleteReadError:
            self._failed("the spare died while preparing")
        except (WorkerStartError, InvalidReference, ProtocolError, FrameError, TimeoutError) as exc:
            self._failed(str(exc))
        except Exception as exc:  # a defect of ours: logged whole, and no endless restarts
            logger.exception("spare_failed_unexpectedly")
            self._failed(f"{type(exc).__name__}: {exc}")
        finally:
            self.starting -= 1
            self.idle_changed.set()
            if worker is not None and not kept:
                await worker.kill(sweep=False)
                if spare is not None and spare.reference is not None:
                    spare.reference.discard()

    def _recovered(self) -> None:
        self.failures, self.failure = 0, None

    def _failed(self, error: str) -> None:
        self.failures += 1
        logger.warning("spare_failed", error=error[:500], in_a_row=self.failures)
        if self.failures >= MAX_SPARE_FAILURES:
            self.failure = error

    async def keep_seed(self, worker: Worker, task: str | None) -> None:
        """Keep a candidate-free worker's Triton cache for later spares: the driver build alone
        (``task`` None, the first spare) or with a task's reference kernels (its first prepared spare)."""
        source = worker.dir / "triton"
        if task in self.seeds or task in self.seeding or not source.exists():
            return
        self.seeding.add(task)
        seed = self.base / (f"triton-seed-{task}" if task else "triton-seed")
        try:
            await asyncio.to_thread(copy_tree, source, seed)
            self.seeds[task] = seed
        except OSError as exc:
            logger.warning("triton_seed_failed", error=str(exc)[:300])
        finally:
            self.seeding.discard(task)

    def held_out_bar(self, task: str | None) -> float | None:
        """The least median (ms) at the task's own shape of a correct candidate timed here so far
        (None: none yet): candidates under it are timed at their held-out shapes too."""
        return self.best_ms.get(task or "")

    def note_correct(self, reference_source: str, median_ms: float) -> None:
        """A correct candidate's median at the task's own shape (lowers the held-out bar)."""
        key = task_key(reference_source)
        if median_ms > 0 and median_ms < self.best_ms.get(key, math.inf):
            self.best_ms[key] = median_ms

    def held_out_overrides(self, reference_source: str) -> list[dict[str, int]] | None:
        """The task's held-out shapes as module-level sizes (what the compile stage also compiles
        at), or None while the task is not measured yet."""
        key = task_key(reference_source)
        if key not in self.plans:
            return None
        variants, _ = self.variants.get(key, ([], ""))
        return [dict(v["overrides"]) for v in variants]

    async def plan_for(self, reference_source: str) -> MemoryPlan | None:
        """The task's memory plan, measured first if the pool is not ready for this task yet
        (None on an old reference that cannot be measured)."""
        key = task_key(reference_source)
        stale = self.reference_source is None or task_key(self.reference_source) != key
        if stale or (self.referee.task != key and self.planned.is_set()):
            await self.retarget(reference_source)  # a new task, or its referee died
        await self.planned.wait()  # a concurrent first job may still be measuring it
        return self.plans.get(key)

    async def retarget(self, reference_source: str) -> None:
        """Make the pool ready for a (new) task: its memory plan first (measured in the worker that
        becomes its first spare), then as many spares as the plan allows. Calls run one at a time:
        an evaluation that asks for the task's plan while the evaluator's own preparation of it is
        under way waits for that one instead of measuring again."""
        async with self._retargeting:
            await self._retarget(reference_source)

    async def _retarget(self, reference_source: str) -> None:
        key = task_key(reference_source)
        for spare in list(self.idle):
            if spare.task != key:
                self.idle.remove(spare)
                await self._dispose(spare)
        self.reference_source = reference_source
        self._recovered()
        for other in [k for k in self.variant_truths if k != key]:  # another task's: memory only
            del self.variant_truths[other]
        if key in self.plans and self.referee.task == key:
            self.plan = self.plans[key]
            self.refill()
            return
        self.planned.clear()
        measurer: Worker | None = None
        try:
            if key in self.plans:
                self.plan = self.plans[key]
                referee_worker = await self.new_referee()
            else:
                # The referee's process starts while another measures the task (it becomes a spare).
                first, referee_worker = await asyncio.gather(self.new_worker(), self.new_referee())
                measurer = first
                try:
                    self.plan = await self._measure(first, reference_source)
                except BaseException:
                    await referee_worker.kill(sweep=False)
                    raise
            await self._start_referee(key, reference_source, referee_worker)
        except BaseException:
            if measurer is not None:
                await measurer.kill(sweep=False)
            self.reference_source = None  # no task: spares that started meanwhile stay unprepared
            raise
        finally:
            self.planned.set()
        cut = self.plan.spares < self.cfg.spares or self.plan.trials < self.cfg.trials
        self.prep_sem = asyncio.Semaphore(1) if cut or self.plan.device_verdict else None
        if measurer is not None:
            self._spawn_spare(measurer)  # prepared and kept even with no spares planned: the first job takes it
        self.refill()

    def _task_op(self, reference_source: str, plan: MemoryPlan, init_on_device: bool, light: bool) -> TaskOp:
        """The ``task`` op of a planned task: for its referee, or ``light`` for a truth worker (the
        model alone: no baseline, canary, range trials or FLOPs)."""
        return TaskOp(
            reference_source=reference_source,
            init_seed=self.init_seeds[task_key(reference_source)],
            compiled_baseline=not light and self.compiled_baseline(),
            inputs_on_device=plan.footprint.input_bytes >= INPUTS_ON_DEVICE_BYTES,
            init_on_device=init_on_device,
            calibrate_seed=0 if light else secrets.randbits(62),
            light=light,
        )

    async def _start_referee(self, key: str, reference_source: str, worker: Worker) -> None:
        """The task's referee: its model and baselines built once, before any spare prepares (the
        ``torch.compile`` baseline, where :meth:`compile_aside`, in its own process meanwhile)."""
        assert self.plan is not None
        self.init_seeds.setdefault(key, secrets.randbits(62))
        on_device = self.plan.footprint.param_bytes >= ON_DEVICE_BYTES
        op = self._task_op(reference_source, self.plan, on_device, light=False)
        aside = op["compiled_baseline"] and self.compile_aside()
        if aside:
            op["compiled_baseline"] = False
        await self._close_truth_workers()  # the previous task's
        await self._stop_compiled()
        try:
            await self.referee.start_task(key, op, worker)
        except EvaluatorFault as exc:
            raise WorkerStartError("run", f"the referee could not build the task: {exc}") from None
        if aside:
            built = bool(self.referee.info.get("init_on_device"))  # where the referee's model was built
            compiled_op = TaskOp(
                **{**op, "compiled_baseline": True, "init_on_device": built, "calibrate_seed": secrets.randbits(62)},
                compiled_only=True,
            )
            self.compile_started = time.perf_counter()
            self.compiling = asyncio.create_task(self._build_compiled(key, compiled_op))

    def compile_aside(self) -> bool:
        """Whether the task's ``torch.compile`` baseline is built in its own process beside the
        referee (:attr:`RunnerConfig.compile_aside_bytes`, or its bytes held back by the memory
        plan: :func:`plan_with_aside`)."""
        if self.plan is None or not self.compiled_baseline():
            return False
        return self.plan.compile_aside or small_for_aside(self.plan.footprint, self.cfg)

    async def _build_compiled(self, key: str, op: TaskOp) -> None:
        """Start the compiled baseline's process and wait for it; a failure is logged and kept for
        the verdicts (they are timed beside eager alone, as where ``torch.compile`` fails)."""
        try:
            info = await self.compiled_referee.start_task(key, op)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the baseline is optional; the reason is reported
            self.compile_failed = f"the torch.compile baseline's process failed: {type(exc).__name__}: {exc}"[:1000]
            logger.warning("compiled_baseline_failed", task=key, error=self.compile_failed)
            await self.compiled_referee.aclose()
            return
        if not info.get("compiled"):
            self.compile_failed = str(info.get("compiled_error") or "torch.compile failed")
            await self.compiled_referee.aclose()
            return
        # Sessions from now on time it beside eager: pooled samples of sessions without it go.
        self.referee.ledger.clear()

    def compiled_for(self, task: str | None) -> Referee | None:
        """The ready compiled-baseline process of ``task`` (None: not built aside, not yet, or failed)."""
        r = self.compiled_referee
        if task is None or r.task != task or not r.alive or not r.compiled:
            return None
        return r

    def compiled_note(self, task: str | None) -> str | None:
        """Why a verdict of ``task`` has no ``torch.compile`` time beside it, where the baseline is
        built aside (None: it is ready, or it is built in the referee)."""
        if self.compiling is None or task is None or self.referee.task != task:
            return None
        if self.compile_failed is not None:
            return self.compile_failed
        if self.compiled_for(task) is not None:
            return None
        if self.compiling.done():
            return "the torch.compile baseline's process stopped after it was built"
        waited = time.perf_counter() - self.compile_started
        return f"not ready yet: torch.compile of the reference was being built beside the referee ({waited:.0f} s)"

    async def _stop_compiled(self) -> None:
        """The previous task's compiled baseline: its build cancelled, its process stopped."""
        if self.compiling is not None:
            self.compiling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.compiling
            self.compiling = None
        self.compile_failed = None
        await self.compiled_referee.aclose()

    async def _dispose(self, spare: Spare) -> None:
        await spare.worker.kill(sweep=False)
        if spare.reference is not None:
            spare.reference.discard()

    async def wait_idle(self, n: int, timeout_s: float) -> None:
        """Wait until ``n`` spares are idle (used by ``prepare`` and benchmarks)."""
        async with asyncio.timeout(timeout_s):
            while len(self.idle) < n:
                self.idle_changed.clear()
                if not self.starting:
                    self.refill()
                    if not self.starting:
                        why = f"; {MAX_SPARE_FAILURES} failed in a row, last: {self.failure}" if self.failure else ""
                        raise WorkerStartError(
                            "run", f"only {len(self.idle)} spares can be kept (spares={self.cfg.spares}){why}"
                        )
                await self.idle_changed.wait()

    async def close(self) -> None:
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for spare in self.idle:
            await self._dispose(spare)
        self.idle.clear()
        await self._close_truth_workers()
        await self._stop_compiled()
        await self.referee.aclose()


def decode_outputs(header: dict[str, Any], blobs: Sequence[Blob]) -> list[npt.NDArray[Any]]:
    """Tensors of a frame as numpy arrays; a frame whose tensors and blobs do not match is the run
    process's fault (a :class:`FrameError`), not the evaluator's."""
    metas = header.get("tensors", [])
    if not isinstance(metas, list) or len(metas) != len(blobs):
        count = len(metas) if isinstance(metas, list) else "no list of"
        raise FrameError(f"a frame announced {count} tensors and sent {len(blobs)}")
    return [tensor_from_wire(m, b) for m, b in zip(metas, blobs, strict=True)]
