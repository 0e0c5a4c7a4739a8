"""The evaluation service: gate, compile, run in a pre-warmed sandbox, and a trusted verdict.

``EvaluationService.evaluate`` may be called concurrently: compiles of some candidates overlap
the run of another. A candidate runs from ``go`` to ``measured`` under the GPU leases of
:mod:`gpu_runner.lease` (``max_concurrent_runs`` candidates at most): a candidate lease for its
import, construction and trials, which spares preparing references may share, then the exclusive
lease for its timing (:mod:`gpu_runner.run_stage`). Time spent queueing for a compile slot or
the GPU does not count against a job's ``timeout_s``; everything else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psutil
import structlog

from gpu_runner.assemble import Collected, build, evaluator_fault, rejected_by_gate
from gpu_runner.compiler import CompileOutcome, Compiler, compile_env
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.cuda_fit import fit_cuda
from gpu_runner.errors import (
    DeviceUnavailable,
    EvaluatorFault,
    IsolationUnavailable,
    ProtocolError,
    ServiceClosed,
    WorkerStartError,
)
from gpu_runner.forkserver import ForkServer
from gpu_runner.gate import GateReport, check_candidate
from gpu_runner.janitor import Janitor, mark_owner, sweep_stale
from gpu_runner.judge import Judge
from gpu_runner.lease import UNRANKED, CompileLine, GpuGate, Turn, TurnLock
from gpu_runner.pool import RunPool, task_key
from gpu_runner.probe import describe_device, detect_cuda, validate_reference, versions
from gpu_runner.protocol import FrameError
from gpu_runner.run_stage import PHASES, Phase, RunStage
from gpu_runner.sandbox import (
    Isolation,
    bulk_root,
    isolation_refusal,
    make_private_dir,
    probe_isolation,
    unreachable_by_others,
    without_user,
    worker_env,
)
from schemas import Check, CheckName, CheckOutcome, DeviceChoice, EvalResult, EvalStatus, Severity, StageTimes

__all__ = ["EvalJob", "EvaluationService", "RunnerConfig"]
logger = structlog.get_logger(__name__)


def _compile_target(device: str, target: dict[str, Any] | None) -> dict[str, Any] | None:
    """What compile workers build for: the GPU's backend, architecture and warp size."""
    return {k: target[k] for k in ("backend", "arch", "warp")} if device == "cuda" and target else None


def _lap(laps: dict[str, float], name: str, since: float) -> float:
    """Record the seconds since ``since`` under ``name`` (added to what it holds); returns now."""
    now = time.perf_counter()
    laps[name] = round(laps.get(name, 0.0) + now - since, 3)
    return now


class EvaluationService:
    """Honest, sandboxed evaluation of candidates against KernelBench references."""

    def __init__(self, config: RunnerConfig) -> None:
        self.cfg = config
        self.device = ""
        self.iso: Isolation | None = None
        self.runs: RunPool | None = None
        self.compiler: Compiler | None = None
        self.base: Path | None = None
        self._own_base = False
        self.gpu = GpuGate(config.max_concurrent_runs)
        self.closed = False
        self.described: dict[str, Any] | None = None
        """The device as the parent can describe it (no CUDA here), until a worker reports its own."""
        self.stats: dict[str, int] = {}
        self.in_flight: dict[str, int] = dict.fromkeys(PHASES, 0)
        """How many evaluations are in each phase now (for benchmarks: what an idle GPU waits for)."""
        self._reaping: set[asyncio.Task[None]] = set()
        self.janitor: Janitor | None = None
        self._one_at_a_time = TurnLock()
        """Held from a spare to the verdict where the plan fits one evaluation at a time (by turn)."""
        self._arrivals = itertools.count()
        """Evaluations in the order they arrived (the second half of their turn)."""
        self._line = CompileLine()
        """Evaluations being gated and compiled, by turn (the first verdicts follow the ranks)."""
        self._gates = TurnLock()
        """The static gate, one candidate at a time by turn: it is Python holding the interpreter's
        lock, so side by side a run's first candidates' gates end nearly together. Eight
        KernelBench L3-22 candidates on a 2-core host: the first gate done at 5.8 s side by side,
        at 0.9 s one after another (all eight at 7.3 and 8.7 s); the first then compiles while the
        next is gated."""
        self._running = TurnLock(config.max_running) if config.max_running else None
        """Evaluations past the compile line at once (``RunnerConfig.max_running``), by turn."""
        self._stage: RunStage | None = None
        self.start_phases: dict[str, float] = {}
        """Seconds of each phase of :meth:`start` (and ``process_s``: since this process began)."""
        self._forks: dict[str, ForkServer] = {}
        """The fork servers started, by worker mode."""

    async def start(self) -> None:
        """Probe the device and the sandbox, and start the spares.

        The fork servers (3.9-7.4 s of imports on an H100 host) start before the isolation probe
        (3.7-4.3 s there: interpreters that import torch and start CUDA under each layer), beside
        it: neither needs the other. A start that fails leaves nothing running."""
        laps: dict[str, float] = {}
        t = time.perf_counter()
        try:
            target = await self._detect()
            t = _lap(laps, "detect_s", t)
            nice = shutil.which("nice") if self.cfg.worker_nice else None
            nice_prefix: tuple[str, ...] = (nice, "-n", str(self.cfg.worker_nice)) if nice else ()
            cache = await self._make_folders()
            t = _lap(laps, "folders_s", t)
            if self.cfg.fork_server:
                self._start_fork_servers(target, nice_prefix, cache)
            software, _ = await asyncio.gather(asyncio.to_thread(versions, self.cfg.python), self._probe(laps))
            t = _lap(laps, "probe_s", t)
            assert self.iso is not None
            if nice_prefix:
                self.iso = dataclasses.replace(self.iso, prefix=(*nice_prefix, *self.iso.prefix))
            self._confine_folders(cache)
            self._start_pools(target, cache, software)
            _lap(laps, "pools_s", t)
        except BaseException:
            await self.aclose()
            raise
        with contextlib.suppress(psutil.Error):  # the process's own start and imports before this service
            laps["process_s"] = round(time.time() - psutil.Process().create_time(), 3)
        self.start_phases = laps
        logger.info(
            "evaluator_started",
            device=self.device,
            network=self.iso.network,
            pids=self.iso.pids,
            user=self.iso.user,
            layers=self.iso.notes(),
            spares=self.cfg.spares,
            phases=laps,
        )

    async def _detect(self) -> dict[str, Any] | None:
        """The GPU this service evaluates on (``nvidia-smi``; no CUDA here), or None: the CPU."""
        target = await asyncio.to_thread(detect_cuda, self.cfg.gpu)
        if self.cfg.device is DeviceChoice.CUDA and target is None:
            raise DeviceUnavailable("cuda", "nvidia-smi finds no GPU")
        self.device = "cuda" if target is not None and self.cfg.device is not DeviceChoice.CPU else "cpu"
        return target

    async def _probe(self, laps: dict[str, float]) -> None:
        """The isolation this machine grants (``self.iso``); ``laps`` gets CUDA's confinement fit."""
        self.iso = await asyncio.to_thread(
            probe_isolation,
            self.cfg.network_isolation,
            self.cfg.pid_isolation,
            self.cfg.sandbox_user,
            self.cfg.python,
            self.device == "cuda",
            self.cfg.confine_layers(),
        )
        if self.device == "cuda":
            t = time.perf_counter()
            self.iso = await asyncio.to_thread(
                fit_cuda, self.iso, self.cfg.python, None, self.cfg.resolved_cache_dir() / "cuda_fit"
            )
            _lap(laps, "cuda_fit_s", t)
        refusal = isolation_refusal(self.iso, self.cfg.isolation)
        if refusal is not None:
            raise IsolationUnavailable(refusal)

    async def _make_folders(self) -> Path:
        """The service's working folders, watched by a janitor; returns the cache folder."""
        if self.cfg.work_dir is not None:
            self.base = Path(self.cfg.work_dir)
            self.base.mkdir(parents=True, exist_ok=True)
        else:
            self.base = Path(tempfile.mkdtemp(prefix="kf-runner-"))
            self._own_base = True
        os.chmod(self.base, 0o711)
        # Folders of evaluators that were killed before they could clean up go now; this one's
        # are watched by a janitor process that removes them (and kills what runs from them)
        # however this process ends.
        bulk = bulk_root(self.base)
        await asyncio.to_thread(sweep_stale, [Path(tempfile.gettempdir()), bulk.parent])
        bulk.mkdir(mode=0o711, exist_ok=True)
        for folder in (self.base, bulk) if self._own_base else (bulk,):
            mark_owner(folder)
        self.janitor = Janitor([bulk, self.base] if self._own_base else [bulk], self.cfg.python)
        cache = self.cfg.resolved_cache_dir()
        (cache / "compile").mkdir(parents=True, exist_ok=True)
        return cache

    def _confine_folders(self, cache: Path) -> None:
        """The service's folders hidden from workers, and the sandbox user dropped where it cannot reach them."""
        assert self.iso is not None
        assert self.base is not None
        hidden = [str(self.base), str(cache), str(bulk_root(self.base))]
        self.iso = dataclasses.replace(self.iso, hidden=tuple(hidden))
        if self.iso.uid is not None:
            # The unprivileged sandbox user must reach its working folders; where a parent folder
            # is private (e.g. under /root or pytest's 0700 temp root), run without the drop.
            blocked = unreachable_by_others(self.base)
            if blocked is not None:
                self.iso = without_user(self.iso, f"the sandbox user cannot reach {blocked}")

    def _pool_env(self, cache: Path) -> dict[str, str]:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

    def _start_fork_servers(self, target: dict[str, Any] | None, nice_prefix: tuple[str, ...], cache: Path) -> None:
        """Start (in the background) the run and compile workers' fork servers."""
        assert self.base is not None
        self._forks["run"] = self._fork_server(
            "run", nice_prefix, {**self._pool_env(cache), **self.cfg.worker_device_env()}
        )
        self._forks["compile"] = self._fork_server(
            "compile",
            nice_prefix,
            compile_env(self.cfg, self.base, self.device, _compile_target(self.device, target), "forkserver-compile"),
        )

    def _start_pools(self, target: dict[str, Any] | None, cache: Path, software: dict[str, str]) -> None:
        """The run and compile pools (on the fork servers started), and the run stage."""
        assert self.iso is not None
        assert self.base is not None
        self.runs = RunPool(self.cfg, self.iso, self.device, self.base, self._pool_env(cache), self.gpu)
        self.described = describe_device(self.device, target, software)
        # Compile workers run at the run workers' niceness. (Five steps below them, tried while
        # spares started from fresh interpreters, made no difference to the stream once spares
        # were forked: 0.309 cand/s either way, in bench/results/gpu_runner_h200.txt.)
        self.compiler = Compiler(
            self.cfg, self.iso, self.device, self.base, f"{software['torch']} {software['triton']}"
        )
        self.compiler.target = _compile_target(self.device, target)
        self.runs.forks = self._forks.get("run")
        self.compiler.forks = self._forks.get("compile")
        self._stage = RunStage(self.cfg, self.iso, self.device, self.gpu, self.runs, self._background)
        self.compiler.refill()
        self.runs.refill()

    def _fork_server(self, mode: str, nice_prefix: tuple[str, ...], env: dict[str, str]) -> ForkServer:
        """Start (in the background) the fork server for workers of ``mode``."""
        assert self.base is not None
        name = f"forkserver-{mode}"
        home = make_private_dir(self.base, name, None, None)
        # Device checks through NVML, not the CUDA runtime: nothing in the server may start CUDA.
        server_env = worker_env({**env, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}, home)
        cmd = [*nice_prefix, self.cfg.python, "-m", "gpu_runner.forkserver", "--mode", mode, "--device", self.device]
        server = ForkServer(mode)
        server.start(cmd, server_env, home, self.base / f"{name}.log", self.cfg.worker_start_timeout_s)
        return server

    async def prepare(self, reference_source: str) -> None:
        """Make the spares task-specific: reference outputs computed before candidates arrive."""
        runs = self._require()
        validate_reference(reference_source)
        await runs.retarget(reference_source)

    async def wait_spares(self, n: int | None = None, timeout_s: float = 300.0) -> None:
        """Wait until ``n`` (default: ``spares``) spares are idle and prepared."""
        await self._require().wait_idle(self.cfg.spares if n is None else n, timeout_s)

    @property
    def stage(self) -> RunStage:
        """The run stage (once started)."""
        if self._stage is None:
            raise ServiceClosed("the evaluation service is not started")
        return self._stage

    @property
    def judge(self) -> Judge | None:
        """The judge comparing large outputs on the GPU (None until a task's plan needs it)."""
        return self._stage.judge if self._stage is not None else None

    def _require(self) -> RunPool:
        if self.closed or self.runs is None:
            raise ServiceClosed("the evaluation service is not started or already closed")
        return self.runs

    def _isolation_checks(self) -> list[Check]:
        assert self.iso is not None
        out = []
        for name, note in self.iso.notes().items():
            skipped = note.startswith("skipped")
            out.append(Check(name=name, outcome=CheckOutcome.SKIPPED if skipped else CheckOutcome.PASSED, detail=note))
        return out

    async def evaluate(self, job: EvalJob) -> EvalResult:
        """The verdict on one candidate; raises only when the evaluator itself cannot work."""
        phase = Phase(self.in_flight)
        try:
            return await self._evaluate(job, phase)
        finally:
            phase.to(None)

    async def _evaluate(self, job: EvalJob, phase: Phase) -> EvalResult:
        started = time.perf_counter()
        # its place in line for a spare and for the GPU: the candidate's rank, then its arrival
        turn: Turn = (UNRANKED if job.rank is None else float(job.rank), next(self._arrivals))
        validate_reference(job.reference_source)
        self._line.enter(turn)
        if self.compiler is not None:
            self.compiler.cores.arriving(turn)
        try:
            return await self._evaluate_in_line(job, phase, started, turn)
        finally:
            if self.compiler is not None:
                await self.compiler.cores.forget(turn)
            await self._line.leave(turn)

    async def _evaluate_in_line(self, job: EvalJob, phase: Phase, started: float, turn: Turn) -> EvalResult:
        runs = self._require()
        c = await self._gate(job, phase, started, turn)
        if self.compiler is not None:
            await self.compiler.cores.arrived(turn)
        gate = c.gate
        if gate.syntax_error:
            error = {"etype": "SyntaxError", "stage": "parse", "message": gate.syntax_error}
            c.compile = CompileOutcome(ok=False, needed=False, error=error)
            return self._finish(c, started)
        if gate.rejected and self.cfg.enforce_gate:
            first = next(f for f in gate.findings if f.severity is Severity.REJECT)
            where = f" (line {first.line})" if first.line else ""
            return self._finish(
                c, started, rejected_by_gate(c, f"rejected: {first.rule.value}: {first.message}{where}")
            )
        if not await self._compile(c, started, phase, turn):
            return self._finish(c, started)
        budget = job.timeout_s - (time.perf_counter() - started)
        # Waiting for a prepared worker (the evaluator's start-up, a cold start, the reference's
        # preparation) is the evaluator's time, not the candidate's: not part of its budget.
        phase.to("spare")
        async with contextlib.AsyncExitStack() as serial:
            try:
                async with asyncio.timeout(self.cfg.worker_start_timeout_s):
                    plan = await runs.plan_for(job.reference_source)
            except (TimeoutError, WorkerStartError, ProtocolError, FrameError, EvaluatorFault) as exc:
                return self._no_worker(c, started, exc)
            # a candidate compiled before the task was measured: at its held-out shapes too, while
            # the pool prepares a spare for it (the pool's own work, started once the plan is known)
            await self._await_late(c, self._compile_late(c, turn))
            # better-ranked candidates still gated or compiling beside it line up first (up to the patience)
            soon = self.compiler.cores.beside(turn) if self.compiler is not None else None
            c.stages = c.stages.model_copy(
                update={"line_s": await self._line.wait_turn(turn, self.cfg.compile_patience_s, soon)}
            )
            if self._running is not None:
                await serial.enter_async_context(self._running.hold(turn))
            one_at_a_time = plan is not None and plan.device_verdict and plan.spares == 0
            if one_at_a_time:
                # The plan fits one evaluation at a time (prepare, run, judge): the next waits.
                await serial.enter_async_context(self._one_at_a_time.hold(turn))
            result = await self._acquire_and_run(runs, c, started, budget, phase, turn)
            if one_at_a_time:  # the next evaluation's reference, while its candidate compiles
                runs.prepare_ahead()
            return result

    async def _gate(self, job: EvalJob, phase: Phase, started: float, turn: Turn) -> Collected:
        """The static gate's report, and the evaluation's first checks (the gate's and the isolation's)."""
        phase.to("gate")
        async with self._gates.hold(turn):
            gate = await asyncio.to_thread(check_candidate, job.candidate_source, job.reference_source, job.torch_ops)
        gate_s = time.perf_counter() - started
        gate_check = Check(
            name=CheckName.STATIC_GATE,
            outcome=CheckOutcome.FAILED if gate.rejected or gate.syntax_error else CheckOutcome.PASSED,
            detail=gate.syntax_error
            or f"{len(gate.findings)} finding(s)" + ("" if self.cfg.enforce_gate else " (not enforced)"),
        )
        c = Collected(job=job, cfg=self.cfg, gate=gate, checks=[gate_check, *self._isolation_checks()])
        # The device this evaluator runs candidates on, also for a verdict reached before any run
        # (its own worker's report replaces it when the candidate runs).
        c.device = self._require().last_ready.get("device") or self.described
        c.stages = StageTimes(gate_s=gate_s)
        return c

    async def _compile(self, c: Collected, started: float, phase: Phase, turn: Turn | None = None) -> bool:
        """Compile the candidate within the job's time left; whether it may run."""
        assert self.compiler is not None
        job = c.job
        budget = job.timeout_s - (time.perf_counter() - started)
        variants = self._held_out_overrides(job.reference_source, c.gate)
        c.compile_pending = variants is None
        t_compile = time.perf_counter()
        try:
            async with asyncio.timeout(max(0.01, budget)):
                phase.to("compile")
                c.compile = await self.compiler.compile(
                    job.candidate_source,
                    job.reference_source,
                    c.gate,
                    min(self.cfg.compile_timeout_s, budget),
                    variants or (),
                    turn=turn,
                )
        except TimeoutError:
            c.timed_out = f"the compile stage exceeded the {job.timeout_s:g} s timeout"
            return False
        c.stages = c.stages.model_copy(
            update={"compile_s": time.perf_counter() - t_compile, "compile_cache_hit": c.compile.cache_hit}
        )
        c.checks.append(
            Check(
                name=CheckName.COMPILE,
                outcome=CheckOutcome.PASSED if c.compile.ok else CheckOutcome.FAILED,
                detail=("cache hit; " if c.compile.cache_hit else "") + (c.compile.aot or ""),
            )
        )
        if c.compile.ok:
            return True
        if c.compile.timed_out:
            c.compile.error.setdefault("stage", "compile")
        return False

    def _held_out_overrides(self, reference_source: str, gate: GateReport) -> list[dict[str, int]] | None:
        """The held-out shapes the compile stage compiles a candidate's Triton kernels at too (the
        run process may not start ``ptxas``: a kernel first launched at a held-out shape would
        raise there): ``[]`` where there is nothing to compile at, None while the task is still
        being measured (the evaluator starts that first; the compile does not wait for it, and
        :meth:`_compile_late` compiles at the shapes beside the spare's preparation)."""
        assert self.compiler is not None
        if self.cfg.held_out_shapes <= 0 or not gate.triton_kernels or not self.compiler.needed(gate):
            return []
        if self.compiler.device != "cuda":
            return []
        return self._require().held_out_overrides(reference_source)

    def _compile_late(self, c: Collected, turn: Turn) -> Coroutine[Any, Any, CompileOutcome] | None:
        """Once the task is measured: for a candidate compiled before its held-out shapes were
        known, the same compile at them too (None where none is needed)."""
        assert self.compiler is not None
        if not c.compile_pending or c.compile is None or not c.compile.ok:
            return None
        variants = self._held_out_overrides(c.job.reference_source, c.gate)
        if not variants:
            return None
        budget = max(0.01, min(self.cfg.compile_timeout_s, c.job.timeout_s))
        return self.compiler.compile(
            c.job.candidate_source,
            c.job.reference_source,
            c.gate,
            budget,
            variants,
            seed=c.compile.triton_dir,
            turn=turn,  # its place for the cores, as its first compile had (not after every ranked one)
        )

    async def _await_late(self, c: Collected, late: Coroutine[Any, Any, CompileOutcome] | None) -> None:
        """Use the compile at the held-out shapes where it succeeded (a superset of the first);
        else the first stays, and the shapes it lacks raise in the run stage (said there)."""
        if late is None:
            return
        try:
            outcome = await late
        except Exception as exc:  # noqa: BLE001 - the first compile stands; logged
            logger.warning("held_out_compile_failed", candidate=c.job.candidate_id, error=repr(exc)[:300])
            return
        if outcome.ok:
            c.compile = outcome
        else:
            logger.warning("held_out_compile_failed", candidate=c.job.candidate_id, error=str(outcome.error)[:300])

    async def _acquire_and_run(
        self, runs: RunPool, c: Collected, started: float, budget: float, phase: Phase, turn: Turn
    ) -> EvalResult:
        job = c.job
        try:
            async with asyncio.timeout(self.cfg.worker_start_timeout_s):
                spare, warm = await runs.acquire(job.reference_source, self.cfg.worker_start_timeout_s, turn)
        except (TimeoutError, WorkerStartError, ProtocolError, FrameError, EvaluatorFault) as exc:
            return self._no_worker(c, started, exc)
        try:
            t_run = time.perf_counter()
            detail = "pre-warmed, prepared spare" if warm else "cold start on the critical path"
            outcome = CheckOutcome.PASSED if warm else CheckOutcome.SKIPPED
            c.checks.append(Check(name=CheckName.WARM_WORKER, outcome=outcome, detail=detail))
            try:
                waited = await self.stage.run(spare, c, max(0.01, budget), phase, turn)
            except EvaluatorFault as exc:
                return self._finish(c, started, evaluator_fault(c, exc.reason))
            finally:
                if spare.reference is not None:
                    spare.reference.discard()
            c.stages = c.stages.model_copy(update={"run_s": time.perf_counter() - t_run - waited})
            return self._finish(c, started)
        finally:
            runs.release()  # its process gone and its outputs judged: another spare may be made

    def _no_worker(self, c: Collected, started: float, exc: BaseException) -> EvalResult:
        """The evaluator's own failure to measure the task or prepare a worker for it."""
        why = str(exc) or f"none was ready within {self.cfg.worker_start_timeout_s:g} s"
        return self._finish(c, started, evaluator_fault(c, f"no run worker could be prepared: {why}"[:2000]))

    def _finish(self, c: Collected, started: float, result: EvalResult | None = None) -> EvalResult:
        c.stages = c.stages.model_copy(update={"total_s": time.perf_counter() - started})
        result = build(c) if result is None else result.model_copy(update={"stages": c.stages})
        if result.status is EvalStatus.CORRECT and result.timing is not None and self.runs is not None:
            self.runs.note_correct(c.job.reference_source, result.timing.median_ms)
        self.stats[result.status.value] = self.stats.get(result.status.value, 0) + 1
        logger.info("evaluated", candidate=c.job.candidate_id, status=result.status.value, summary=result.summary[:200])
        return result

    def _background(self, reap: Coroutine[Any, Any, None]) -> None:
        """Reap killed workers off the critical path; ``aclose`` waits for every one."""
        task = asyncio.create_task(reap)
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def aclose(self) -> None:
        """Stop every worker; nothing this service spawned survives."""
        if self.closed:
            return
        self.closed = True
        if self._reaping:
            await asyncio.gather(*self._reaping, return_exceptions=True)
        if self.judge is not None:
            await self.judge.aclose()
        # Side by side: the pools, then both fork servers (each waits for its server to exit,
        # 0.7-0.8 s apiece on a 2-core host, one after the other before), all before the janitor.
        pools = [p.close() for p in (self.runs, self.compiler) if p is not None]
        closed = await asyncio.gather(*pools, return_exceptions=True)
        # the pools' (or, after a failed start, no pool's)
        closed += await asyncio.gather(*(f.close() for f in self._forks.values()), return_exceptions=True)
        if self.base is not None:
            await asyncio.to_thread(shutil.rmtree, bulk_root(self.base), True)
        if self._own_base and self.base is not None:
            await asyncio.to_thread(shutil.rmtree, self.base, True)
        if self.janitor is not None:
            await asyncio.to_thread(self.janitor.close)
        failed = next((e for e in closed if isinstance(e, BaseException)), None)
        if failed is not None:  # raised as before, once everything was stopped
            raise failed

    async def __aenter__(self) -> EvaluationService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def task_id(self, reference_source: str) -> str:
        """The id a task gets from its reference source."""
        return task_key(reference_source)
