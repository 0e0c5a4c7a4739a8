"""The run stage, parent side: one candidate in a prepared spare, from its job to the data of its verdict.

A candidate runs from ``go`` to ``measured`` under the GPU leases of :mod:`gpu_runner.lease`: the
candidate lease for its import, construction and trials (spares preparing beside it may share
it), then the exclusive lease for its timing, which the parent drives batch by batch against the
referee's baselines (:mod:`gpu_runner.timing_session`). The worker is killed while the GPU is
still held. Its trials' outputs are compared in threads (:mod:`gpu_runner.run_reader`) against the
referee's, or, for tasks whose outputs are judged on the device, by the judge once the worker is
gone; so are the timed calls chosen for judgment. A candidate whose trials already failed is not
timed (except where the judge decides after the run: then the timing comes first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpu_runner.assemble import Collected
from gpu_runner.compare import TrialCheck
from gpu_runner.config import RunnerConfig
from gpu_runner.frames import JobOp, Op, OpFrame, Report, op_frame
from gpu_runner.isolation import Isolation, jit_exec, sandbox_settings
from gpu_runner.judge import Judge
from gpu_runner.judged_trials import judge_trials
from gpu_runner.lease import GpuGate, Turn, renice
from gpu_runner.pool import RunPool, Spare
from gpu_runner.protocol import FrameError
from gpu_runner.run_reader import ReportReader
from gpu_runner.sandbox import Worker, census, chown_tree
from gpu_runner.timing_session import HeldOutShape, SessionAborted, TimingSession
from gpu_runner.triton_cache import copy_tree
from gpu_runner.verdict import RunRecord, runtime_findings
from schemas import Check, CheckName, CheckOutcome, Severity

logger = structlog.get_logger(__name__)

WORTH_WAIT_S = 0.05
"""How long the run stage waits, GPU held, for the trials' comparisons before it times anyway
(an H200 stream of 64 MB relu candidates held the GPU ~1 s each waiting for them)."""
SHIP_INPUTS_BYTES = 16 << 20
"""A trial's inputs up to this size go back to the parent as the call left them (larger ones are
checked in the candidate's process, by checksums: an in-process check). Sending back and
summing 128 MB of inputs per trial took the parent ~1 s per candidate on an H200 host."""

PHASES = ("gate", "compile", "spare", "arm", "gpu_wait", "gpu", "verdict")
"""An evaluation's phases in order: the static gate, the compile, waiting for a prepared spare,
staging the job until the worker is armed, waiting for the GPU, holding it, the comparisons."""


class Phase:
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


def _copy_if_absent(src: str, dst: str) -> str:
    if os.path.exists(dst):
        return dst
    return str(shutil.copy2(src, dst))


def _frame_error(stage: str, exc: FrameError) -> dict[str, Any]:
    """The record's error for a frame the run process should not have sent."""
    return {"stage": stage, "etype": "FrameError", "message": f"the run process sent {exc}"}


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


@dataclass
class _Window:
    """One candidate's run: its worker, what is collected, and where the time went."""

    spare: Spare
    c: Collected
    reader: ReportReader
    phase: Phase
    budget: float
    t0: float = field(default_factory=time.perf_counter)
    stage: str = "start"
    waited: float = 0.0
    held: float | None = None
    exclusive: bool = False
    """Whether the run holds the GPU alone (the timing), not the candidate lease."""
    tree: list[int] | None = None
    marks: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    """Whether the run stage itself failed (an exception the verdict does not cover): the judge will
    not take the worker's files, so it is reaped at once (its device memory freed for the next)."""

    @property
    def worker(self) -> Worker:
        return self.spare.worker

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter() - self.t0


class RunStage:
    """Runs candidates in prepared spares: stage, arm, trials and timing under the GPU leases, verdict data."""

    def __init__(
        self,
        cfg: RunnerConfig,
        iso: Isolation,
        device: str,
        gpu: GpuGate,
        runs: RunPool,
        background: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.cfg, self.iso, self.device, self.gpu, self.runs = cfg, iso, device, gpu, runs
        self.background = background
        self.judge: Judge | None = None
        """Compares large outputs on the GPU (started with the first task whose plan needs it)."""

    async def run(self, spare: Spare, c: Collected, budget: float, phase: Phase, turn: Turn | None = None) -> float:
        """Run the job in the spare; returns the seconds spent queueing for the GPU. ``turn``: its
        place in line for the GPU among candidates waiting together (:meth:`GpuGate.acquire_candidate`)."""
        if turn is not None:
            await self.gpu.expect(turn)
        try:
            w = await self._arm(spare, c, budget, phase)
            try:
                await self._drive(w, turn)
            except TimeoutError:
                w.reader.record.timed_out = True
                c.timed_out = f"the evaluation exceeded {c.job.timeout_s:g} s (after {w.stage})"
            except FrameError as exc:
                w.reader.record.error = _frame_error(w.stage, exc)
            except SessionAborted:
                pass  # the worker's error or death is in the record
            except BaseException:
                w.failed = True  # no judge will take its files: the worker is reaped now
                raise
            finally:
                self._end_worker(w)
        finally:
            if turn is not None:
                await asyncio.shield(self.gpu.forget(turn))  # one that never asked for its lease
        await self._verdict_data(w)
        record = w.reader.record
        measured = sum(float(i.get("elapsed_s", 0.0)) for i in record.trial_infos)
        if c.session is not None:
            measured += c.session.elapsed_s
        measure_s = measured if record.trial_infos else None
        c.stages = c.stages.model_copy(update={"measure_s": measure_s, "gpu_s": w.held})
        return w.waited

    async def _arm(self, spare: Spare, c: Collected, budget: float, phase: Phase) -> _Window:
        """Stage the candidate's files in the spare and send it the job."""
        phase.to("arm")
        assert c.compile is not None
        ref = spare.reference
        assert ref is not None
        worker = spare.worker
        c.device, c.peaks, c.reference = worker.ready.get("device"), worker.ready.get("peaks") or {}, ref
        c.record = RunRecord()
        manifest = await asyncio.to_thread(self._stage_files, spare, c)
        profiled, why = profile_kernels(self.device, c.job.candidate_source, manifest, self.cfg.enforce_gate)
        outcome = CheckOutcome.PASSED if profiled else CheckOutcome.SKIPPED
        c.checks.append(Check(name=CheckName.KERNEL_PROFILE, outcome=outcome, detail=why))
        plan = self.runs.plans.get(spare.task or "")
        c.trials = len(ref.seeds) or None
        c.planned_bytes = plan.device_per_candidate if plan is not None and plan.device_per_candidate else None
        worker.keep_bulk = ref.judged
        await worker.send(self._job_op(spare, c, manifest, profiled, plan.poison_bytes if plan is not None else None))
        biggest = max((a.size for outs in ref.outputs for a in outs), default=1)
        for metas in ref.metas:
            biggest = max([biggest, *(int(m.get("nbytes", 0)) for m in metas)])
        # the largest frame: a trial's outputs (widened), or its inputs sent back whole; the inputs'
        # size as the referee drew them where the memory plan could not measure it (a model whose
        # construction reads a value: SwinMLP's 6 MB of inputs met a cap of 2.3 MB and every
        # candidate failed with a FrameError)
        planned = plan.footprint.input_bytes if plan is not None else 0
        inputs = max(planned, int(ref.info.get("input_bytes") or 0))
        reader = ReportReader(self.cfg, worker, c, spare, max(8 * 4 * biggest, inputs) + (1 << 20))
        return _Window(spare=spare, c=c, reader=reader, phase=phase, budget=budget)

    def _job_op(
        self, spare: Spare, c: Collected, manifest: dict[str, str], profiled: bool, poison: int | None
    ) -> OpFrame:
        """The ``job`` op: the candidate, its sandbox, and what its trials send back (no tolerance,
        no reference: the candidate's process decides nothing)."""
        assert spare.reference is not None
        worker = spare.worker
        exec_ok = jit_exec(self.device, c.compile)
        sandbox = sandbox_settings(self.cfg, self.iso, worker.dir, worker.bulk, "run", exec_ok)
        return op_frame(
            Op.JOB,
            JobOp(
                candidate_path=str(worker.dir / "candidate.py"),
                ext_manifest=manifest,
                sandbox=sandbox,
                profile_kernels=profiled,
                device_verdict=spare.reference.judged,
                poison_bytes=poison,
                in_place_bytes=self.cfg.in_place_bytes,
                ship_inputs_bytes=SHIP_INPUTS_BYTES,
            ),
        )

    async def _drive(self, w: _Window, turn: Turn | None) -> None:
        """Wait for the worker to arm, then hold the GPU for its trials and timing (``turn``: its
        place in line for it)."""
        async with asyncio.timeout(w.budget):
            armed = await w.reader.until(Report.ARMED)
        w.mark("armed")
        w.budget -= time.perf_counter() - w.t0
        if not armed:
            return
        w.stage = "armed"
        t_wait = time.perf_counter()
        w.phase.to("gpu_wait")
        await self.gpu.acquire_candidate(turn)
        try:
            w.phase.to("gpu")
            w.waited = time.perf_counter() - t_wait
            await self._on_gpu(w)
        finally:
            await asyncio.shield(self.gpu.release(exclusive=w.exclusive, candidate=not w.exclusive))

    async def _on_gpu(self, w: _Window) -> None:
        """Trials, their first judgment, timing and the end of the worker's reports under the GPU lease."""
        t_go = time.perf_counter()
        w.c.checks.append(self._priority(w.worker))
        try:
            await w.worker.send(op_frame(Op.GO))
            async with asyncio.timeout(max(0.01, w.budget)):
                reached = await w.reader.until(Report.TRIALS_DONE)
            w.budget -= time.perf_counter() - t_go
            if reached is Report.TRIALS_DONE:
                w.mark("trials_done")
                w.reader.record.census["trials_done"] = census(w.worker.pid)
                if await self._worth_timing(w):
                    await self._timing(w)
            w.mark("measured")
            w.stage = "measured"
        finally:
            # Killed while the GPU is still ours: nothing the candidate left running reaches the
            # next timing. (Waiting for its CUDA teardown here cost seconds of exclusive GPU per
            # candidate; it is reaped in the background.)
            w.tree = w.worker.terminate()
            w.held = time.perf_counter() - t_go
            w.phase.to("verdict")
            w.mark("killed")

    async def _worth_timing(self, w: _Window) -> bool:
        """Whether the trials leave anything to time: no refusal in what the worker saw, inputs
        unchanged and, where the parent compares, every trial correct (awaited here; outputs the
        judge compares after the run are timed first)."""
        record, c = w.reader.record, w.c
        own = set(c.gate.triton_kernels) | set(c.gate.cuda_kernels)
        refusals = runtime_findings(record.trial_infos, own, c.gate.admitted_aten_ops, c.gate.op_namespaces)
        if any(f.severity is Severity.REJECT for f in refusals) or record.mutated_trials or record.later_changed:
            return False
        assert w.spare.reference is not None
        if len(record.trial_infos) < len(w.spare.reference.seeds):
            return False
        if w.spare.reference.judged or not c.compares:
            return True
        # Comparisons still running are not waited for with the GPU held: the candidate is timed,
        # and its verdict waits for them (a wrong one is then incorrect, timed for nothing).
        done, _ = await asyncio.wait(c.compares, timeout=WORTH_WAIT_S)
        return all(not t.cancelled() and t.exception() is None and t.result().ok for t in done)

    async def _timing(self, w: _Window) -> None:
        """The timing session on the exclusive lease, then ``finish`` (the profile, if asked)."""
        ref = w.spare.reference
        assert ref is not None
        referee = self.runs.referee
        t_up = time.perf_counter()
        # Waiting for the referee and for spares to leave the GPU is queueing, not the candidate's time.
        compiled = self.runs.compiled_for(w.spare.task)
        async with contextlib.AsyncExitStack() as held:
            await held.enter_async_context(referee.session())
            if compiled is not None:  # its own process (built beside the referee): to oneself too
                await held.enter_async_context(compiled.session())
            await self.gpu.upgrade()  # the timing has the GPU alone
            w.exclusive = True
            w.waited += time.perf_counter() - t_up
            w.mark("exclusive")
            plan = self.runs.plans.get(w.spare.task or "")
            session = TimingSession(
                self.cfg,
                self.device,
                referee,
                w.reader,
                first_timed_trial=len(ref.seeds),
                in_bytes=plan.footprint.input_bytes if plan is not None else 0,
                out_bytes=plan.footprint.output_bytes if plan is not None else 0,
                shippable=plan.timed_slots if plan is not None else 0,
                compiled=compiled,
                compiled_note=self.runs.compiled_note(w.spare.task),
                held_out=self._held_out_shapes(w),
                held_out_bar_ms=self.runs.held_out_bar(w.spare.task) if self.cfg.held_out_timing == "best" else None,
            )
            w.c.session = session.rec
            t0 = time.perf_counter()
            try:
                await session.run(max(0.01, w.budget))
            except SessionAborted:
                return
            finally:
                w.budget -= time.perf_counter() - t0
        w.stage = "timed"
        w.reader.record.census["timed"] = census(w.worker.pid)
        await w.worker.send(op_frame(Op.FINISH))
        async with asyncio.timeout(max(0.01, w.budget)):
            if await w.reader.until(Report.MEASURED) is Report.MEASURED:
                await w.reader.until()

    def _held_out_shapes(self, w: _Window) -> list[HeldOutShape]:
        """The held-out shapes to time the candidate at: those its trial there did not raise at
        (whether it was right there is judged beside the timing; the report keeps only the
        times of shapes judged correct)."""
        ref = w.spare.reference
        if self.cfg.held_out_timing == "off" or ref is None:
            return []
        raised = w.reader.record.shape_raised
        return [
            HeldOutShape(variant=v, overrides=dict(variant["overrides"]), nbytes=int(variant.get("nbytes") or 0))
            for v, variant in enumerate(ref.variants)
            if v not in raised
        ]

    def _end_worker(self, w: _Window) -> None:
        """Kill the worker (if the GPU window did not) and reap it unless the judge still needs its files."""
        worker, record = w.worker, w.reader.record
        if w.tree is None:
            w.tree = worker.terminate()
        assert w.spare.reference is not None
        if not w.spare.reference.judged or w.failed:  # else after the judge took the output files
            self.background(worker.reap(w.tree, sweep=self.iso.pids.startswith("skipped")))
        record.log = worker.log_text()
        w.mark("terminated")
        # Where the run stage's time goes (seconds since the job was sent), for overhead work.
        session = w.c.session
        logger.debug(
            "run phases",
            candidate=w.c.job.candidate_id,
            waited_s=w.waited,
            worker=record.phases,
            timing_rounds=session.rounds if session else None,
            timing_elapsed_s=session.elapsed_s if session else None,
            **w.marks,
        )

    async def _verdict_data(self, w: _Window) -> None:
        """The trials' and the judged timed calls' comparisons: judged on the device now, or
        gathered from the threads that ran them."""
        c, record = w.c, w.reader.record
        ref = w.spare.reference
        assert ref is not None
        assert w.tree is not None
        trials = len(ref.seeds)
        if ref.judged:
            try:
                if c.pending:
                    checks = await self._judge_trials(w, w.tree)
                    order = [t for t, _ in c.pending]
                    record.trial_checks = [k for t, k in zip(order, checks, strict=False) if t < trials]
                    c.timed_checks = [k for t, k in zip(order, checks, strict=False) if t >= trials]
            finally:
                self.background(w.worker.reap(w.tree, sweep=self.iso.pids.startswith("skipped")))
        else:
            await self._timed_checks(w)
        if c.shape_compares:
            shaped = await asyncio.gather(*c.shape_compares.values(), return_exceptions=True)
            for v, o in zip(c.shape_compares, shaped, strict=True):
                if isinstance(o, FrameError):
                    record.error = _frame_error("held_out_shape", o)
                elif isinstance(o, BaseException):
                    raise o
                else:
                    record.shape_checks[v] = o
        if not c.compares:
            return
        t_gather = time.perf_counter()
        outcomes = await asyncio.gather(*c.compares, return_exceptions=True)
        if c.compare_times:
            logger.debug(
                "verdict phases",
                candidate=c.job.candidate_id,
                after_window_s=round(time.perf_counter() - t_gather, 3),
                read_s=round(max(t[0] for t in c.compare_times), 3),
                queued_s=round(max(t[1] for t in c.compare_times), 3),
                compare_s=round(max(t[2] for t in c.compare_times), 3),
            )
        bad = next((o for o in outcomes if isinstance(o, FrameError)), None)
        if bad is not None:
            record.error = _frame_error("forward", bad)
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, FrameError):
                raise o
        # after the judge's, where it judged the others (a trial nested otherwise is not judged)
        record.trial_checks += [o for o in outcomes if isinstance(o, TrialCheck)]

    async def _timed_checks(self, w: _Window) -> None:
        """The timed calls chosen for judgment, against the referee's truth of their seeds (host
        comparison: the outputs came with their batch, or were shipped after it)."""
        c = w.c
        session = c.session
        ref = w.spare.reference
        assert ref is not None
        first = len(ref.seeds)
        if session is None or not (session.kept or c.timed_frames):
            return
        kept = [k for k in session.kept if k.outputs is not None]
        shipped = sorted(c.timed_frames)
        keys = [(k.seed, k.skip) for k in kept] + [w.reader.timed_seeds[t] for t in shipped]
        if not keys:
            return
        seeds, skips = [s for s, _ in keys], [k for _, k in keys]
        truths = await self.runs.truths(c.job.reference_source, seeds, [1.0] * len(seeds), first, skips, timed=True)
        jobs: list[Any] = [
            w.reader.compare_arrays(
                k.outputs or [],
                k.dtypes,
                truth.outputs,
                truth.dtypes,
                truth.residuals,
                measured=truth.default_errors,
            )
            for k, truth in zip(kept, truths[: len(kept)], strict=True)
        ]
        for t, truth in zip(shipped, truths[len(kept) :], strict=True):
            header, blobs, later = c.timed_frames[t]
            dtypes = [str(m.get("dtype")) for m in header["tensors"]]
            jobs.append(
                w.reader.compare(
                    header,
                    blobs,
                    later,
                    dtypes,
                    truth.outputs,
                    truth.dtypes,
                    truth.residuals,
                    c.compare_times,
                    measured=truth.default_errors,
                )
            )
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        for o in outcomes:
            if isinstance(o, FrameError):
                w.reader.record.error = _frame_error("timing", o)
            elif isinstance(o, BaseException):
                raise o
        c.timed_checks = [o for o in outcomes if isinstance(o, TrialCheck)]

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

    async def _judge_trials(self, w: _Window, tree: list[int]) -> list[TrialCheck]:
        """Compare the trials' output files on the GPU once nothing of the candidate can write them."""
        runs = self.runs
        if self.judge is None:
            self.judge = Judge(runs.referee, self.gpu, self.cfg.worker_nice, self.cfg.worker_start_timeout_s)
        assert w.spare.reference is not None
        checks: list[TrialCheck] = []
        try:
            await judge_trials(
                self.judge,
                self.cfg,
                w.worker,
                tree,
                w.c.pending,
                w.spare.reference,
                w.c.job.reference_source,
                w.reader.max_blob,
                runs.verdict_dir(),
                checks,
                w.reader.timed_seeds,
                w.c.job.precision,
            )
        except FrameError as exc:
            w.reader.record.error = _frame_error("forward", exc)
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
            copy_tree(triton_dir, worker.dir / "triton", copy_function=_copy_if_absent)
        manifest: dict[str, str] = {}
        for key, so in c.compile.ext_manifest.items():
            dst = worker.dir / "prebuilt" / key / Path(so).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dst)
            manifest[key] = str(dst)
        chown_tree(worker.dir, self.iso.uid, self.iso.gid)
        return manifest
