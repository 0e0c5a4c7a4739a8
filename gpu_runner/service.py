"""The evaluation service: gate, compile, run in a pre-warmed sandbox, and a trusted verdict.

``EvaluationService.evaluate`` may be called concurrently: compiles of some candidates overlap
the run of another. A candidate runs from ``go`` to ``measured`` under the GPU leases of
:mod:`gpu_runner.lease` (``max_concurrent_runs`` candidates at most): a candidate lease for its
import, construction and trials, which spares preparing references may share, then the exclusive
lease for its timing. Time spent queueing for a compile slot or the GPU does not count against a
job's ``timeout_s``; everything else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from gpu_runner.assemble import Collected, build, evaluator_fault, rejected_by_gate
from gpu_runner.compare import TrialCheck, compare_trial
from gpu_runner.compiler import CompileOutcome, Compiler
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
from gpu_runner.frames import Op, Report, op_frame
from gpu_runner.gate import check_candidate
from gpu_runner.isolation import sandbox_settings
from gpu_runner.janitor import Janitor, mark_owner, sweep_stale
from gpu_runner.judge import Judge
from gpu_runner.lease import GpuGate, renice
from gpu_runner.pool import RunPool, Spare, decode_outputs, task_key
from gpu_runner.probe import describe_device, detect_cuda, validate_reference, versions
from gpu_runner.protocol import Blob, FrameError, take_bulk
from gpu_runner.sandbox import (
    Isolation,
    Worker,
    bulk_root,
    chown_tree,
    isolation_refusal,
    jit_exec,
    make_private_dir,
    probe_isolation,
    unreachable_by_others,
    wait_gone,
    without_user,
    worker_env,
)
from gpu_runner.verdict import RunRecord, exit_description
from schemas import Check, CheckName, CheckOutcome, DeviceChoice, EvalResult, Severity, StageTimes

__all__ = ["EvalJob", "EvaluationService", "RunnerConfig"]
logger = structlog.get_logger(__name__)

PHASES = ("gate", "compile", "spare", "arm", "gpu_wait", "gpu", "verdict")
"""An evaluation's phases in order: the static gate, the compile, waiting for a prepared spare,
staging the job until the worker is armed, waiting for the GPU, holding it, the comparisons."""


class _Phase:
    """Which phase one evaluation is in, counted in the service's ``in_flight``."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.now: str | None = None

    def to(self, name: str | None) -> None:
        if self.now is not None:
            self.counts[self.now] -= 1
        self.now = name
        if name is not None:
            self.counts[name] += 1


_COMPARERS = ThreadPoolExecutor(max_workers=max(2, min(4, (os.cpu_count() or 2) // 4)), thread_name_prefix="kf-compare")
"""Output comparisons (tens to hundreds of ms of numpy each) run here, not in the event loop's
default executor, so a burst of them cannot queue the short steps on a candidate's path (the
gate, staging files, storing a compile) behind it, nor take every core from the compilers."""


def _copy_if_absent(src: str, dst: str) -> str:
    if os.path.exists(dst):
        return dst
    return str(shutil.copy2(src, dst))


def _numbers(value: object, limit: int = 16) -> dict[str, float]:
    """A worker's ``{name: seconds}`` for the logs: only numbers, a few, short names (the worker
    may have run a candidate that rewrote what it sends)."""
    if not isinstance(value, dict):
        return {}
    out = {str(k)[:40]: round(float(v), 4) for k, v in value.items() if isinstance(v, int | float)}
    return dict(list(out.items())[:limit])


def profile_kernels(device: str, source: str, manifest: dict[str, str], gate_enforced: bool) -> tuple[bool, str]:
    """Whether to list the device kernels of one forward with CUPTI, and why (not).

    A candidate whose code is Python and Triton launches nothing the Triton launch hooks and the
    aten dispatcher do not see (the gate refuses ctypes, foreign libraries and dynamic code);
    compiled extension code can call vendor libraries directly, which only the profiler shows.
    With the gate off, nothing is ruled out: always profile.
    """
    if device != "cuda":
        return False, "no device kernels on the CPU"
    if manifest or "load_inline" in source or "cpp_extension" in source:
        return True, "compiled extension code: kernel names from CUPTI"
    if not gate_enforced:
        return True, "static gate not enforced: kernel names from CUPTI"
    return False, "Python and Triton only: every launch seen by the launch hooks and the aten dispatcher"


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
        self._one_at_a_time = asyncio.Lock()
        self.judge: Judge | None = None
        """Compares large outputs on the GPU (started with the first task whose plan needs it)."""

    async def start(self) -> None:
        """Probe the device and the sandbox, and start the spares."""
        target = await asyncio.to_thread(detect_cuda, self.cfg.gpu)
        if self.cfg.device is DeviceChoice.CUDA and target is None:
            raise DeviceUnavailable("cuda", "nvidia-smi finds no GPU")
        self.device = "cuda" if target is not None and self.cfg.device is not DeviceChoice.CPU else "cpu"
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
            self.iso = await asyncio.to_thread(fit_cuda, self.iso, self.cfg.python)
        refusal = isolation_refusal(self.iso, self.cfg.isolation)
        if refusal is not None:
            raise IsolationUnavailable(refusal)
        nice = shutil.which("nice")
        nice_prefix: tuple[str, ...] = ()
        if self.cfg.worker_nice and nice:
            nice_prefix = (nice, "-n", str(self.cfg.worker_nice))
            self.iso = dataclasses.replace(self.iso, prefix=(*nice_prefix, *self.iso.prefix))
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
        hidden = [str(self.base), str(cache), str(bulk_root(self.base))]
        self.iso = dataclasses.replace(self.iso, hidden=tuple(hidden))
        if self.iso.uid is not None:
            # The unprivileged sandbox user must reach its working folders; where a parent folder
            # is private (e.g. under /root or pytest's 0700 temp root), run without the drop.
            blocked = unreachable_by_others(self.base)
            if blocked is not None:
                self.iso = without_user(self.iso, f"the sandbox user cannot reach {blocked}")
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        self.runs = RunPool(self.cfg, self.iso, self.device, self.base, env, self.gpu)
        software = await asyncio.to_thread(versions, self.cfg.python)
        self.described = describe_device(self.device, target, software)
        # Compile workers run at the run workers' niceness. (Five steps below them, tried while
        # spares started from fresh interpreters, made no difference to the stream once spares
        # were forked: 0.309 cand/s either way, runs M and N in bench/results/gpu_runner_h200.txt.)
        self.compiler = Compiler(
            self.cfg, self.iso, self.device, self.base, f"{software['torch']} {software['triton']}"
        )
        self.compiler.target = (
            {k: target[k] for k in ("backend", "arch", "warp")} if self.device == "cuda" and target else None
        )
        if self.cfg.fork_server:
            self.runs.forks = self._fork_server("run", nice_prefix, {**env, **self.cfg.worker_device_env()})
            self.compiler.forks = self._fork_server("compile", nice_prefix, self.compiler.env("forkserver-compile"))
        self.compiler.refill()
        self.runs.refill()
        logger.info(
            "evaluator_started",
            device=self.device,
            network=self.iso.network,
            pids=self.iso.pids,
            user=self.iso.user,
            layers=self.iso.notes(),
            spares=self.cfg.spares,
        )

    def _fork_server(self, mode: str, nice_prefix: tuple[str, ...], env: dict[str, str]) -> ForkServer:
        """Start (in the background) the fork server for workers of ``mode``."""
        assert self.iso is not None
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
        phase = _Phase(self.in_flight)
        try:
            return await self._evaluate(job, phase)
        finally:
            phase.to(None)

    async def _evaluate(self, job: EvalJob, phase: _Phase) -> EvalResult:
        runs = self._require()
        assert self.compiler is not None
        started = time.perf_counter()
        validate_reference(job.reference_source)
        phase.to("gate")
        gate = await asyncio.to_thread(check_candidate, job.candidate_source, job.reference_source, job.torch_ops)
        gate_s = time.perf_counter() - started
        rejected = gate.rejected
        gate_check = Check(
            name=CheckName.STATIC_GATE,
            outcome=CheckOutcome.FAILED if rejected or gate.syntax_error else CheckOutcome.PASSED,
            detail=gate.syntax_error
            or f"{len(gate.findings)} finding(s)" + ("" if self.cfg.enforce_gate else " (not enforced)"),
        )
        c = Collected(job=job, cfg=self.cfg, gate=gate, checks=[gate_check, *self._isolation_checks()])
        # The device this evaluator runs candidates on, also for a verdict reached before any run
        # (its own worker's report replaces it when the candidate runs).
        c.device = runs.last_ready.get("device") or self.described
        c.stages = StageTimes(gate_s=gate_s)
        if gate.syntax_error:
            c.compile = CompileOutcome(
                ok=False, needed=False, error={"etype": "SyntaxError", "stage": "parse", "message": gate.syntax_error}
            )
            return self._finish(c, started)
        if rejected and self.cfg.enforce_gate:
            first = next(f for f in gate.findings if f.severity is Severity.REJECT)
            where = f" (line {first.line})" if first.line else ""
            return self._finish(
                c, started, rejected_by_gate(c, f"rejected: {first.rule.value}: {first.message}{where}")
            )
        budget = job.timeout_s - (time.perf_counter() - started)
        t_compile = time.perf_counter()
        try:
            async with asyncio.timeout(max(0.01, budget)):
                phase.to("compile")
                c.compile = await self.compiler.compile(
                    job.candidate_source, job.reference_source, gate, min(self.cfg.compile_timeout_s, budget)
                )
        except TimeoutError:
            c.timed_out = f"the compile stage exceeded the {job.timeout_s:g} s timeout"
            return self._finish(c, started)
        c.stages = StageTimes(
            gate_s=gate_s, compile_s=time.perf_counter() - t_compile, compile_cache_hit=c.compile.cache_hit
        )
        c.checks.append(
            Check(
                name=CheckName.COMPILE,
                outcome=CheckOutcome.PASSED if c.compile.ok else CheckOutcome.FAILED,
                detail=("cache hit; " if c.compile.cache_hit else "") + (c.compile.aot or ""),
            )
        )
        if not c.compile.ok:
            if c.compile.timed_out:
                c.compile.error.setdefault("stage", "compile")
            return self._finish(c, started)
        budget = job.timeout_s - (time.perf_counter() - started)
        # Waiting for a prepared worker (the evaluator's start-up, a cold start, the reference's
        # preparation) is the evaluator's time, not the candidate's: not part of its budget.
        phase.to("spare")
        async with contextlib.AsyncExitStack() as serial:
            plan = runs.plans.get(task_key(job.reference_source))
            if plan is not None and plan.device_verdict and plan.spares == 0:
                # The plan fits one evaluation at a time (prepare, run, judge): the next waits.
                await serial.enter_async_context(self._one_at_a_time)
            return await self._acquire_and_run(runs, c, started, budget, phase)

    async def _acquire_and_run(
        self, runs: RunPool, c: Collected, started: float, budget: float, phase: _Phase
    ) -> EvalResult:
        job = c.job
        try:
            async with asyncio.timeout(self.cfg.worker_start_timeout_s):
                spare, warm = await runs.acquire(job.reference_source, self.cfg.worker_start_timeout_s)
        except (TimeoutError, WorkerStartError, ProtocolError, FrameError) as exc:
            why = str(exc) or f"none was ready within {self.cfg.worker_start_timeout_s:g} s"
            return self._finish(c, started, evaluator_fault(c, f"no run worker could be prepared: {why}"[:2000]))
        t_run = time.perf_counter()
        detail = "pre-warmed, prepared spare" if warm else "cold start on the critical path"
        outcome = CheckOutcome.PASSED if warm else CheckOutcome.SKIPPED
        c.checks.append(Check(name=CheckName.WARM_WORKER, outcome=outcome, detail=detail))
        try:
            waited = await self._run(spare, c, max(0.01, budget), phase)
        except EvaluatorFault as exc:
            return self._finish(c, started, evaluator_fault(c, exc.reason))
        finally:
            if spare.reference is not None:
                spare.reference.discard()
        c.stages = c.stages.model_copy(update={"run_s": time.perf_counter() - t_run - waited})
        return self._finish(c, started)

    def _finish(self, c: Collected, started: float, result: EvalResult | None = None) -> EvalResult:
        c.stages = c.stages.model_copy(update={"total_s": time.perf_counter() - started})
        result = build(c) if result is None else result.model_copy(update={"stages": c.stages})
        self.stats[result.status.value] = self.stats.get(result.status.value, 0) + 1
        logger.info("evaluated", candidate=c.job.candidate_id, status=result.status.value, summary=result.summary[:200])
        return result

    async def _run(self, spare: Spare, c: Collected, budget: float, phase: _Phase) -> float:
        """Run the job in the spare; returns the seconds spent queueing for the GPU."""
        phase.to("arm")
        assert self.iso is not None
        assert c.compile is not None
        assert spare.reference is not None
        worker, job = spare.worker, c.job
        c.device, c.peaks, c.reference = worker.ready.get("device"), worker.ready.get("peaks") or {}, spare.reference
        record = c.record = RunRecord()
        manifest = await asyncio.to_thread(self._stage_files, spare, c)
        profiled, why = profile_kernels(self.device, c.job.candidate_source, manifest, self.cfg.enforce_gate)
        c.checks.append(
            Check(
                name=CheckName.KERNEL_PROFILE,
                outcome=CheckOutcome.PASSED if profiled else CheckOutcome.SKIPPED,
                detail=why,
            )
        )
        dtype = spare.reference.info.get("out_dtype", "float32")
        atol, rtol = self.cfg.tolerances.get(dtype, (0.0, 0.0))
        timing_cfg = {
            k: getattr(self.cfg, k)
            for k in (
                "timing_budget_s",
                "timing_min_reps",
                "timing_max_reps",
                "timing_target_rel_err",
                "warmup_min_calls",
                "warmup_min_s",
                "guard_reps",
                "timing_lead_us",
            )
        }
        plan = self._require().plans.get(spare.task or "")
        device_verdict = spare.reference.judged
        c.trials = len(spare.reference.seeds) or None
        c.planned_bytes = plan.device_per_candidate if plan is not None and plan.device_per_candidate else None
        worker.keep_bulk = device_verdict
        sandbox = sandbox_settings(self.cfg, self.iso, worker.dir, worker.bulk, "run", jit_exec(self.device, c.compile))
        await worker.send(
            op_frame(
                Op.JOB,
                candidate_path=str(worker.dir / "candidate.py"),
                ext_manifest=manifest,
                sandbox=dict(sandbox),
                atol=atol,
                rtol=rtol,
                timing=timing_cfg,
                profile_kernels=profiled,
                device_verdict=device_verdict,
                poison_bytes=plan.poison_bytes if plan is not None else None,
                in_place_bytes=self.cfg.in_place_bytes,
                admitted_aten_ops=sorted(c.gate.admitted_aten_ops),
            )
        )
        biggest = max((a.size for outs in spare.reference.outputs for a in outs), default=1)
        for metas in spare.reference.metas:
            biggest = max([biggest, *(int(m.get("nbytes", 0)) for m in metas)])
        max_blob = 8 * 4 * biggest + (1 << 20)
        stage, waited, held = "start", 0.0, None
        marks: dict[str, float] = {}
        tree: list[int] | None = None
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(budget):
                armed = await self._collect(worker, c, spare, max_blob, until=(Report.ARMED,))
            marks["armed"] = time.perf_counter() - t0
            budget -= time.perf_counter() - t0
            if armed:
                stage = "armed"
                t_wait = time.perf_counter()
                phase.to("gpu_wait")
                await self.gpu.acquire_candidate()
                exclusive, upgrade_wait = False, 0.0
                try:
                    phase.to("gpu")
                    waited = time.perf_counter() - t_wait
                    t_go = time.perf_counter()
                    c.checks.append(self._priority(worker))
                    try:
                        await worker.send(op_frame(Op.GO))
                        async with asyncio.timeout(max(0.01, budget)) as window:
                            reached = await self._collect(
                                worker, c, spare, max_blob, until=(Report.TRIALS_DONE, Report.MEASURED)
                            )
                            if reached is Report.TRIALS_DONE:
                                marks["trials_done"] = time.perf_counter() - t0
                                t_up = time.perf_counter()
                                # Waiting for spares to leave the GPU is queueing, not the candidate's
                                # time: no deadline while it lasts, and the deadline moves by the wait.
                                deadline = window.when()
                                window.reschedule(None)
                                await self.gpu.upgrade()  # the timing has the GPU alone
                                exclusive = True
                                upgrade_wait = time.perf_counter() - t_up
                                waited += upgrade_wait
                                window.reschedule((deadline or 0.0) + upgrade_wait)
                                marks["exclusive"] = time.perf_counter() - t0
                                await worker.send(op_frame(Op.TIME))
                                reached = await self._collect(worker, c, spare, max_blob, until=(Report.MEASURED,))
                        budget -= time.perf_counter() - t_go - upgrade_wait
                        marks["measured"] = time.perf_counter() - t0
                        stage = "measured"
                        if reached is not None:
                            async with asyncio.timeout(max(0.01, budget)):
                                await self._collect(worker, c, spare, max_blob, until=())
                        marks["done"] = time.perf_counter() - t0
                    finally:
                        # Killed while the GPU is still ours: nothing the candidate left running
                        # reaches the next timing. (Waiting for its CUDA teardown here cost 1.9 s
                        # of exclusive GPU per candidate on an H200; it is reaped in the background.)
                        tree = worker.terminate()  # inline: 0.01-0.1 s on the H200 (run M)
                        held = time.perf_counter() - t_go
                        phase.to("verdict")
                        marks["killed"] = time.perf_counter() - t0
                finally:
                    await asyncio.shield(self.gpu.release(exclusive=exclusive, candidate=not exclusive))
        except TimeoutError:
            record.timed_out = True
            c.timed_out = f"the evaluation exceeded {job.timeout_s:g} s (after {stage})"
        except FrameError as exc:
            record.error = {"stage": stage, "etype": "FrameError", "message": f"the run process sent {exc}"}
        finally:
            if tree is None:
                tree = worker.terminate()
            if not device_verdict:  # else after the judge took the output files (the reap removes the folder)
                self._background(worker.reap(tree, sweep=self.iso.pids.startswith("skipped")))
            record.log = worker.log_text()
            marks["terminated"] = time.perf_counter() - t0
            # Where the run stage's time goes (seconds since the job was sent), for overhead work.
            logger.debug(
                "run phases",
                candidate=job.candidate_id,
                waited_s=waited,
                worker=record.phases,
                **marks,
            )
        if device_verdict:
            try:
                if c.pending:
                    record.trial_checks = await self._judge_trials(worker, tree, c, spare, max_blob)
            finally:
                self._background(worker.reap(tree, sweep=self.iso.pids.startswith("skipped")))
        if c.compares:
            t_gather = time.perf_counter()
            outcomes = await asyncio.gather(*c.compares, return_exceptions=True)
            if c.compare_times:
                logger.debug(
                    "verdict phases",
                    candidate=job.candidate_id,
                    after_window_s=round(time.perf_counter() - t_gather, 3),
                    read_s=round(max(t[0] for t in c.compare_times), 3),
                    queued_s=round(max(t[1] for t in c.compare_times), 3),
                    compare_s=round(max(t[2] for t in c.compare_times), 3),
                )
            bad = next((o for o in outcomes if isinstance(o, FrameError)), None)
            if bad is not None:
                record.error = {"stage": "forward", "etype": "FrameError", "message": f"the run process sent {bad}"}
            for o in outcomes:
                if isinstance(o, BaseException) and not isinstance(o, FrameError):
                    raise o
            record.trial_checks = [o for o in outcomes if isinstance(o, TrialCheck)]
        measured = sum(float(i.get("elapsed_s", 0.0)) for i in record.trial_infos)
        if record.timing is not None:
            measured += float(record.timing.get("elapsed_s", 0.0))
        c.stages = c.stages.model_copy(update={"measure_s": measured if record.trial_infos else None, "gpu_s": held})
        return waited

    def _priority(self, worker: Worker) -> Check:
        """Give the worker about to be timed the CPU back from the niceness every worker starts with."""
        if not self.cfg.worker_nice:
            return Check(name=CheckName.PRIORITY, outcome=CheckOutcome.SKIPPED, detail="skipped: worker_nice is 0")
        error = renice(worker.pid, 0)
        if error is not None:
            detail = (
                f"skipped: cannot raise the priority ({error.strerror}); all workers at nice {self.cfg.worker_nice}"
            )
            return Check(name=CheckName.PRIORITY, outcome=CheckOutcome.SKIPPED, detail=detail)
        return Check(
            name=CheckName.PRIORITY,
            outcome=CheckOutcome.PASSED,
            detail=f"nice 0 while timed; starting, preparing and compiling workers at nice {self.cfg.worker_nice}",
        )

    async def _collect(
        self, worker: Worker, c: Collected, spare: Spare, max_blob: int, until: tuple[Report, ...]
    ) -> Report | None:
        """Absorb frames until one of the kinds ``until`` arrives (that kind) or the worker is done,
        failed or gone (None)."""
        assert c.record is not None
        while True:
            try:
                header, later = await worker.recv_deferring_bulk(max_blob)
            except asyncio.IncompleteReadError:
                await worker.proc.wait()
                c.record.died = exit_description(worker.proc.returncode)
                return None
            kind = header["kind"]
            if kind in until:
                return kind  # type: ignore[no-any-return]
            blobs: list[Blob] = []
            if later is not None and kind is not Report.TRIAL:  # only trial outputs wait
                blobs, later = await asyncio.wrap_future(later), None
            if not await self._absorb(header, blobs, c, spare, later):
                return None

    async def _absorb(
        self,
        header: dict[str, Any],
        blobs: list[Blob],
        c: Collected,
        spare: Spare,
        later: Future[list[Blob]] | None = None,
    ) -> bool:
        record, ref = c.record, spare.reference
        assert record is not None
        assert ref is not None
        kind = header["kind"]
        if kind in (Report.SANDBOX, Report.DONE):
            record.phases.update(_numbers(header.get("phases")))
        if kind is Report.SANDBOX:
            record.sandbox = dict(header.get("checks", {}))
            c.checks.append(
                Check(
                    name=CheckName.SANDBOX_LIMITS,
                    outcome=CheckOutcome.PASSED,
                    detail=", ".join(f"{k}={v}" for k, v in record.sandbox.items()),
                )
            )
        elif kind is Report.TRIAL:
            t = int(header["trial"])
            if not ref.judged and not 0 <= t < len(ref.outputs):
                raise FrameError(f"trial {t} does not exist")
            if ref.judged:  # judged on the GPU once the worker is gone
                if not 0 <= t < len(ref.metas):
                    raise FrameError(f"trial {t} does not exist")
                c.pending.append((t, header))
                record.trial_infos.append({"trial": t, **header.get("info", {})})
                return True
            dtypes = [str(m.get("dtype")) for m in header.get("tensors", [])]
            residuals = ref.residuals[t] if t < len(ref.residuals) else None
            # Read (bulk files) and compared in threads while the worker goes on, and after the
            # GPU is released: ``_run`` gathers every comparison before the verdict.
            compare = self._compare(
                header, blobs, later, dtypes, ref.outputs[t], ref.dtypes[t], residuals, c.compare_times
            )
            c.compares.append(asyncio.create_task(compare))
            record.trial_infos.append({"trial": t, **header.get("info", {})})
        elif kind is Report.MEMORY:
            record.memory_peak = int(header.get("peak_bytes", 0))
        elif kind is Report.PROFILE:
            record.profile = header
        elif kind is Report.TIMING:
            record.timing = header
        elif kind is Report.ERROR:
            record.error = header
            return False
        elif kind is Report.DONE:
            record.done = header
            return False
        return True

    async def _compare(
        self,
        header: dict[str, Any],
        blobs: list[Blob],
        later: Future[list[Blob]] | None,
        dtypes: list[str],
        ref_outputs: list[Any],
        ref_dtypes: list[str],
        residuals: list[Any] | None,
        timings: list[tuple[float, float, float]],
    ) -> TrialCheck:
        t0 = time.perf_counter()
        if later is not None:
            blobs = await asyncio.wrap_future(later)
        cand = decode_outputs(header, blobs)
        t_read = time.perf_counter()
        began: list[float] = []

        def run() -> TrialCheck:
            began.append(time.perf_counter())
            return compare_trial(
                cand,
                dtypes,
                ref_outputs,
                ref_dtypes,
                residuals,
                dict(self.cfg.tolerances),
                dict(self.cfg.precision_floors),
                self.cfg.precision_factor,
            )

        check = await asyncio.get_running_loop().run_in_executor(_COMPARERS, run)
        end = time.perf_counter()
        # Where a comparison's time goes (for throughput work): reading the outputs, the queue, the arithmetic.
        timings.append((t_read - t0, began[0] - t_read, end - began[0]))
        return check

    async def _judge_trials(
        self, worker: Worker, tree: list[int], c: Collected, spare: Spare, max_blob: int
    ) -> list[TrialCheck]:
        """Compare the trials' output files on the GPU once nothing of the candidate can write them.

        The worker's whole tree is dead first (a killed process's DMA may still be landing while
        the kernel tears it down); then each file is moved out of the worker's folder into a
        folder of the parent's, and the judge reads it from there.
        """
        ref = spare.reference
        assert ref is not None
        assert c.record is not None
        await worker.proc.wait()
        await asyncio.to_thread(wait_gone, tree, 30.0)
        if self.judge is None:
            runs = self._require()
            folder = str(runs.verdict_dir())
            self.judge = Judge(
                lambda: runs.new_worker({"KF_JUDGE_DIR": folder}),
                self.gpu,
                self.cfg.worker_nice,
                self.cfg.worker_start_timeout_s,
            )
        ref.files = self._require().verdict_dir() / worker.dir.name
        ref.files.mkdir(mode=0o700)
        checks: list[TrialCheck] = []
        dst = os.open(ref.files, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for t, header in c.pending:
                metas = list(header.get("tensors", []))
                ref_metas = ref.metas[t]
                same = [(m.get("dtype"), list(m.get("shape", []))) for m in metas] == [
                    (m.get("dtype"), list(m.get("shape", []))) for m in ref_metas
                ]
                outputs: list[dict[str, Any]] = []
                if same:
                    if "bulk" not in header:
                        raise EvaluatorFault(f"trial {t}'s outputs did not come as files")
                    names = await asyncio.to_thread(take_bulk, worker.bulk_fd, header["bulk"], dst, f"c{t}_", max_blob)
                    for name, meta in zip(names, ref_metas, strict=True):
                        tol = self.cfg.tolerances.get(str(meta.get("dtype")))
                        outputs.append(
                            {
                                "cand": str(ref.files / name),
                                "dtype": str(meta.get("dtype")),
                                "atol": tol[0] if tol else 0.0,
                                "rtol": tol[1] if tol else 0.0,
                                "exact": tol is None,
                            }
                        )
                job = {
                    "reference_source": c.job.reference_source,
                    "init_seed": ref.init_seed,
                    "seed": ref.seeds[t],
                    "on_device": ref.on_device,
                    "input_sums": ref.input_sums[t],
                    "outputs": outputs,
                }
                check = await self.judge.trial(
                    job,
                    metas,
                    ref_metas,
                    dict(self.cfg.tolerances),
                    dict(self.cfg.precision_floors),
                    self.cfg.precision_factor,
                )
                checks.append(check)
                for out in outputs:  # each trial's files go as soon as they are judged
                    with contextlib.suppress(OSError):
                        os.unlink(out["cand"])
        except FrameError as exc:
            c.record.error = {"stage": "forward", "etype": "FrameError", "message": f"the run process sent {exc}"}
        finally:
            os.close(dst)
        return checks

    def _stage_files(self, spare: Spare, c: Collected) -> dict[str, str]:
        assert c.compile is not None
        assert self.iso is not None
        worker = spare.worker
        (worker.dir / "candidate.py").write_text(c.job.candidate_source)
        triton_dir = c.compile.triton_dir
        if triton_dir is not None:
            # Triton's cache is content-addressed: a file already there (e.g. the launcher the
            # reference's own kernel loaded) is identical, and overwriting a loaded shared
            # library in place crashes the process that has it mapped. Copy only what is new.
            shutil.copytree(triton_dir, worker.dir / "triton", dirs_exist_ok=True, copy_function=_copy_if_absent)
        manifest: dict[str, str] = {}
        for key, so in c.compile.ext_manifest.items():
            dst = worker.dir / "prebuilt" / key / Path(so).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dst)
            manifest[key] = str(dst)
        chown_tree(worker.dir, self.iso.uid, self.iso.gid)
        return manifest

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
        if self.runs is not None:
            await self.runs.close()
        if self.compiler is not None:
            await self.compiler.close()
        for pool in (self.runs, self.compiler):
            if pool is not None and pool.forks is not None:
                await pool.forks.close()
        if self.base is not None:
            await asyncio.to_thread(shutil.rmtree, bulk_root(self.base), True)
        if self._own_base and self.base is not None:
            await asyncio.to_thread(shutil.rmtree, self.base, True)
        if self.janitor is not None:
            await asyncio.to_thread(self.janitor.close)

    async def __aenter__(self) -> EvaluationService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def task_id(self, reference_source: str) -> str:
        """The id a task gets from its reference source."""
        return task_key(reference_source)
