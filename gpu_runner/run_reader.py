"""Reading a spare's reports into the candidate's record: trials compared in threads, the rest kept.

The parent's side of the frames a spare sends between ``job`` and its exit (see
:mod:`gpu_runner.frames`): the sandbox it entered, each trial's outputs (compared with the
referee's in a thread pool while the worker goes on, or left for the judge when the task's
outputs are judged on the device), each trial's inputs as the call left them (checked against the
checksums the spare made before the candidate existed), memory, profile, timed batches and shipped
timed calls (read by :mod:`gpu_runner.timing_session`), an error or the end.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_runner.assemble import Collected
from gpu_runner.compare import TrialCheck, compare_trial, host_checksum, precision_rule
from gpu_runner.config import RunnerConfig, usable_cores
from gpu_runner.frames import Report
from gpu_runner.pool import Spare, decode_outputs
from gpu_runner.protocol import Blob, FrameError
from gpu_runner.sandbox import Worker
from gpu_runner.structure import difference
from gpu_runner.verdict import RunRecord, exit_description, runtime_findings
from schemas import Check, CheckName, CheckOutcome, Severity

_COMPARERS = ThreadPoolExecutor(max_workers=max(2, min(8, usable_cores() // 2)), thread_name_prefix="kf-compare")
"""Output comparisons (tens to hundreds of ms of numpy each) run here, not in the event loop's
default executor, so a burst of them cannot queue the short steps on a candidate's path (the
gate, staging files, storing a compile) behind it, nor take every core from the compilers. Half
the cores, at most 8: a candidate's outputs are judged here for every trial and for the timed
calls shipped from its process (seven comparisons of 0.4-0.9 s each per candidate of a 64 MB
relu on an H200 host), and with 4 threads of 16 cores they queued up to 1.6 s behind each other
and bounded that task's stream."""


def _numbers(value: object, limit: int = 16) -> dict[str, float]:
    """A worker's ``{name: seconds}`` for the logs: only numbers, a few, short names (the worker
    may have run a candidate that rewrote what it sends)."""
    if not isinstance(value, dict):
        return {}
    out = {str(k)[:40]: round(float(v), 4) for k, v in value.items() if isinstance(v, int | float)}
    return dict(list(out.items())[:limit])


async def _decided(check: TrialCheck) -> TrialCheck:
    """A trial's check known without comparing its values (gathered with the compared ones)."""
    return check


@dataclass
class ReportReader:
    """Absorbs one run worker's reports into ``c`` (its record, checks and pending comparisons)."""

    cfg: RunnerConfig
    worker: Worker
    c: Collected
    spare: Spare
    max_blob: int
    timed_seeds: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Trial numbers past the trials': the (seed, place in its batch) of the timed calls shipped under them."""

    @property
    def record(self) -> RunRecord:
        """The run's record (made before the job is sent)."""
        assert self.c.record is not None
        return self.c.record

    async def until(self, *until: Report) -> Report | None:
        """Absorb frames until one of the kinds ``until`` arrives (that kind) or the worker is done,
        failed or gone (None)."""
        got = await self._next(until, absorb_wanted=False)
        return got[0]["kind"] if got is not None else None

    async def take(self, kind: Report) -> tuple[dict[str, Any], list[Blob]] | None:
        """Absorb frames until one of ``kind`` arrives: its header and blobs (a shipped timed call's
        frame is also absorbed as its trial); None once the worker is done, failed or gone."""
        return await self._next((kind,), absorb_wanted=kind is Report.TRIAL)

    async def _next(self, until: tuple[Report, ...], absorb_wanted: bool) -> tuple[dict[str, Any], list[Blob]] | None:
        worker, c = self.worker, self.c
        assert c.record is not None
        while True:
            try:
                header, later = await worker.recv_deferring_bulk(self.max_blob)
            except asyncio.IncompleteReadError:
                await worker.proc.wait()
                c.record.died = exit_description(worker.proc.returncode)
                return None
            kind = header["kind"]
            if kind is not Report.TRIAL and later is None and "bulk" in header:
                # a worker keeps its trials' files for the judge; the rest (a held-out shape's
                # outputs, the inputs as a call left them) is checked here, in the parent, for every task
                later = worker.read_bulk_later(header.pop("bulk"), self.max_blob)
            if kind in until and not absorb_wanted:
                if later is None and "bulk" in header:  # a worker whose trial files stay for the judge
                    later = worker.read_bulk_later(header.pop("bulk"), self.max_blob)
                blobs = await asyncio.wrap_future(later) if later is not None else []
                return header, blobs
            blobs = []
            if later is not None and kind is not Report.TRIAL:  # only trial outputs wait
                blobs, later = await asyncio.wrap_future(later), None
            if not await self._absorb(header, blobs, later):
                return None
            if kind in until:
                return header, blobs

    async def _absorb(self, header: dict[str, Any], blobs: list[Blob], later: Future[list[Blob]] | None) -> bool:
        """Keep one report; False once the worker has said its last word (an error or done)."""
        record, kind = self.record, header["kind"]
        if kind in (Report.SANDBOX, Report.DONE):
            record.phases.update(_numbers(header.get("phases")))
        if kind is Report.SANDBOX:
            record.sandbox = dict(header["checks"])
            detail = ", ".join(f"{k}={v}" for k, v in record.sandbox.items())
            self.c.checks.append(Check(name=CheckName.SANDBOX_LIMITS, outcome=CheckOutcome.PASSED, detail=detail))
        elif kind is Report.TRIAL:
            self._trial(header, blobs, later)
        elif kind is Report.SHAPE_TRIAL:
            self._shape_trial(header, blobs)
        elif kind is Report.INPUTS:
            self._inputs(header, blobs)
        elif kind is Report.LATER_CALLS:
            record.later_changed = bool(header["first_outputs_changed"])
        elif kind is Report.MEMORY:
            record.memory_peak = int(header["peak_bytes"])
        elif kind is Report.PROFILE:
            record.profile = header
        elif kind is Report.TIMED:
            raise FrameError("a timed batch's frame came when none was asked for")
        elif kind is Report.ERROR:
            record.error = header
        elif kind is Report.DONE:
            record.done = header
        return kind not in (Report.ERROR, Report.DONE)

    def _inputs(self, header: dict[str, Any], blobs: list[Blob]) -> None:
        """A trial's inputs as the call left them, against the checksums of the pristine ones."""
        ref = self.spare.reference
        assert ref is not None
        t = int(header["trial"])
        if not 0 <= t < len(ref.input_sums):
            raise FrameError(f"inputs of trial {t}, which does not exist")
        pristine = [s for s in ref.input_sums[t] if s is not None]
        metas = list(header["tensors"])
        if len(metas) != len(blobs):
            raise FrameError(f"inputs of trial {t}: {len(metas)} tensors announced, {len(blobs)} sent")
        # Their bytes as they are (the checksum is of the bytes, whatever the dtype).
        after = [host_checksum(np.frombuffer(b, dtype=np.uint8)) for b in blobs]
        self.record.inputs_checked += 1
        if after != pristine:
            self.record.mutated_trials.append(t)

    def _trial(self, header: dict[str, Any], blobs: list[Blob], later: Future[list[Blob]] | None) -> None:
        """One trial's outputs: left for the judge, or compared with the reference's in a thread."""
        ref, c = self.spare.reference, self.c
        assert ref is not None
        t = int(header["trial"])
        timed = t in self.timed_seeds
        if not (0 <= t < len(ref.seeds) or timed):
            raise FrameError(f"trial {t} does not exist")
        if timed:  # a shipped timed call: compared once the referee has its truth
            if ref.judged:
                c.pending.append((t, header))
            else:
                c.timed_frames[t] = (header, blobs, later)
            return
        info = dict(header["info"])
        self.record.trial_infos.append({"trial": t, **info})
        after = info.get("input_sums_after")
        if after is not None and t < len(ref.input_sums) and list(after) != list(ref.input_sums[t]):
            self.record.mutated_trials.append(t)  # large inputs: checked in the candidate's process
        differs = difference(ref.info.get("out_structure"), info.get("structure"))
        if differs is not None:  # nested otherwise than the reference's outputs: incorrect as it is
            c.compares.append(asyncio.create_task(_decided(TrialCheck(False, "incorrect.shape", differs))))
            return
        if ref.judged:  # judged on the GPU once the worker is gone
            c.pending.append((t, header))
            return
        dtypes = [str(m.get("dtype")) for m in header["tensors"]]
        residuals = ref.residuals[t] if t < len(ref.residuals) else None
        # Read (bulk files) and compared in threads while the worker goes on, and after the GPU is
        # released: the run stage gathers every comparison before the verdict.
        scale = ref.scales[t] if t < len(ref.scales) else 1.0
        measured = ref.default_errors[t] if t < len(ref.default_errors) else None
        compare = self.compare(
            header, blobs, later, dtypes, ref.outputs[t], ref.dtypes[t], residuals, c.compare_times, scale, measured
        )
        c.compares.append(asyncio.create_task(compare))

    def _shape_trial(self, header: dict[str, Any], blobs: list[Blob]) -> None:
        """The candidate at one held-out shape: what it raised, or its outputs compared with the
        reference's at that shape (the same rules as a trial's, and the same checks of what its
        process saw: a forward that launches nothing of its own there computes with PyTorch)."""
        ref, c = self.spare.reference, self.c
        assert ref is not None
        v = int(header["variant"])
        if not 0 <= v < min(len(ref.variants), len(ref.variant_truths)) or v in c.shape_compares:
            raise FrameError(f"held-out shape {v} does not exist, or came twice")
        if v in self.record.shape_raised:
            raise FrameError(f"held-out shape {v} came twice")
        label = str(ref.variants[v]["label"])
        info = dict(header["info"])
        raised = info.get("raised")
        if raised is not None:
            what = raised if isinstance(raised, dict) else {}
            self.record.shape_raised[v] = f"{what.get('etype', 'Exception')}: {what.get('message', '')}"[:300]
            return
        gate = c.gate
        own = set(gate.triton_kernels) | set(gate.cuda_kernels)
        refusals = [
            f
            for f in runtime_findings(
                [{**info, "trial": f"at {label}"}], own, gate.admitted_aten_ops, gate.op_namespaces
            )
            if f.severity is Severity.REJECT
        ]
        differs = difference(ref.info.get("out_structure"), info.get("structure"))
        if refusals or differs is not None:
            why = refusals[0].message if refusals else f"at {label}: {differs}"
            c.shape_compares[v] = asyncio.create_task(_decided(TrialCheck(False, "incorrect.held_out", why)))
            return
        truth = ref.variant_truths[v]
        dtypes = [str(m.get("dtype")) for m in header["tensors"]]
        cand = decode_outputs(header, blobs)
        c.shape_compares[v] = asyncio.create_task(
            self.compare_arrays(
                cand, dtypes, truth.outputs, truth.dtypes, truth.residuals, measured=truth.default_errors
            )
        )

    async def compare(
        self,
        header: dict[str, Any],
        blobs: list[Blob],
        later: Future[list[Blob]] | None,
        dtypes: list[str],
        ref_outputs: list[Any],
        ref_dtypes: list[str],
        residuals: list[Any] | None,
        timings: list[tuple[float, float, float]],
        scale: float = 1.0,
        measured: list[Any] | None = None,
    ) -> TrialCheck:
        """One trial's outputs as its frame brought them (read from its files when they are),
        compared (under the precision rule of trials drawn at ``scale``, and of the reference's
        error at PyTorch's defaults ``measured`` on the trial's inputs)."""
        t0 = time.perf_counter()
        if later is not None:
            blobs = await asyncio.wrap_future(later)
        cand = decode_outputs(header, blobs)
        t_read = time.perf_counter()
        began: list[float] = []
        check = await self.compare_arrays(cand, dtypes, ref_outputs, ref_dtypes, residuals, began, scale, measured)
        end = time.perf_counter()
        # Where a comparison's time goes (for throughput work): reading the outputs, the queue, the arithmetic.
        timings.append((t_read - t0, began[0] - t_read, end - began[0]))
        return check

    async def compare_arrays(
        self,
        cand: list[Any],
        dtypes: list[str],
        ref_outputs: list[Any],
        ref_dtypes: list[str],
        residuals: list[Any] | None,
        began: list[float] | None = None,
        scale: float = 1.0,
        measured: list[Any] | None = None,
    ) -> TrialCheck:
        """Outputs already in host memory compared with the reference's, in a comparer thread
        (``began`` gets the moment the thread took it)."""
        cfg = self.cfg
        assert self.spare.reference is not None
        rule = precision_rule(cfg, self.spare.reference.info, self.c.job.precision, scale, measured)

        def run() -> TrialCheck:
            if began is not None:
                began.append(time.perf_counter())
            return compare_trial(
                cand,
                dtypes,
                ref_outputs,
                ref_dtypes,
                residuals,
                dict(cfg.tolerances),
                dict(cfg.precision_floors),
                rule,
            )

        return await asyncio.get_running_loop().run_in_executor(_COMPARERS, run)
