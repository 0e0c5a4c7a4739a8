"""The judge (parent side): the referee comparing large outputs on the GPU.

Used for tasks the memory plan marks ``device_verdict`` (:mod:`gpu_runner.memplan`). The judging
runs in the task's referee (:mod:`gpu_runner.referee`), the process that holds the reference and
never runs a candidate, so nothing a candidate did can reach it, and its model serves the truth.
It compares a trial's outputs after the candidate's process tree is gone and the parent has moved
any output files out of the worker's directory (:func:`gpu_runner.protocol.take_bulk`), or maps
the buffers the spare shared before its candidate existed; it sends back only sums and counts, and
the verdict is reached here by :func:`gpu_runner.compare.decide`, the same rules the host
comparison uses. Its GPU work runs under a shared lease, so it never overlaps a timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from gpu_runner.compare import PrecisionRule, TrialCheck, as_rule, decide, scan_from_wire
from gpu_runner.errors import EvaluatorFault
from gpu_runner.frames import JudgeOp, Op, Report, op_frame
from gpu_runner.lease import GpuGate, GpuLease
from gpu_runner.referee import Referee
from gpu_runner.sandbox import Worker
from schemas.task import source_fingerprint

logger = structlog.get_logger(__name__)


class Judge:
    """Compares outputs on the GPU in the referee, a worker that never runs candidate code."""

    def __init__(self, referee: Referee, gate: GpuGate, nice: int, timeout_s: float) -> None:
        self.referee = referee
        self.gate = gate
        self.nice = nice
        self.timeout_s = timeout_s
        self.lock = referee.lock
        """The referee's: one op at a time in its process."""
        self.compared = 0
        self.compared_shared = 0
        """Trials whose outputs came as shared buffers (the rest as files)."""
        self._owner: asyncio.Task[Any] | None = None
        """The task judging a candidate's trials under :meth:`keeping_lease`."""
        self._kept: GpuLease | None = None

    @contextlib.asynccontextmanager
    async def keeping_lease(self) -> AsyncIterator[None]:
        """Judge one candidate's trials back to back: the judge (its lock and its worker's shared
        GPU lease) is held from the first trial to the last, instead of being asked for again
        before each trial. In an H200 run of KernelBench L2-4 two candidates' trials took turns
        on the judge, and some waited ~2 s for the lease behind a timing: the first verdict came
        7.3 s after the candidate's run."""
        async with self.referee.background():
            self._owner = asyncio.current_task()
            try:
                yield
            finally:
                self._owner = None
                kept, self._kept = self._kept, None
                if kept is not None:
                    await kept.drop()

    async def _worker(self) -> Worker:
        worker = self.referee.worker
        if worker is None or worker.dead or worker.proc.returncode is not None:
            raise EvaluatorFault("the referee that judges this task is not running")
        return worker

    async def _ask(self, job: JudgeOp, fds: Sequence[int] = ()) -> dict[str, Any]:
        """Send one trial's job to the judge worker (and ``fds``, its shared outputs' descriptors,
        over the worker's share socket first); its ``judged`` frame."""
        owned = self._owner is not None and self._owner is asyncio.current_task()
        async with contextlib.nullcontext() if owned else self.referee.background():
            worker = await self._worker()
            lease = self._kept if owned and self._kept is not None and self._kept.worker is worker else None
            if lease is None:
                lease = GpuLease(self.gate, worker, self.nice, keep=owned)
                if owned:
                    if self._kept is not None:  # the judge worker it was kept for is gone
                        await self._kept.drop()
                    self._kept = lease
            try:
                async with asyncio.timeout(self.timeout_s):
                    if fds:
                        if worker.share is None:
                            raise OSError("the judge has no share socket")
                        socket.send_fds(worker.share, [json.dumps({"count": len(fds)}).encode()], list(fds))
                    await worker.send(op_frame(Op.JUDGE, job))
                    while True:
                        header, _ = await worker.recv(1 << 20)
                        kind = header.get("kind")
                        if await lease.handle(kind):
                            continue
                        if kind is Report.JUDGED:
                            break
                        raise EvaluatorFault(f"the judge sent {kind!r} while comparing")
            except (TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
                log = worker.log_text()[-500:]
                await self.referee.stop()  # started again for the task's next evaluation
                why = "timed out" if isinstance(exc, TimeoutError) else "died"
                raise EvaluatorFault(f"the judge {why} while comparing outputs: {log}") from None
            finally:
                if not owned or self.referee.worker is not worker:
                    await lease.drop()
                    if self._kept is lease:
                        self._kept = None
        if header.get("error"):
            raise EvaluatorFault(f"the judge could not compare the outputs: {header['error']}")
        phases = header.get("phases")
        if isinstance(phases, dict):  # where a large task's verdict time goes
            logger.debug("judge phases", **{str(k): round(float(v), 3) for k, v in phases.items()})
        self.compared += 1
        self.compared_shared += bool(fds)
        return header

    async def trial(
        self,
        job: JudgeOp,
        cand_meta: list[dict[str, Any]],
        ref_meta: list[dict[str, Any]],
        tolerances: dict[str, tuple[float, float]],
        floors: dict[str, float],
        factor: PrecisionRule | float,
        fds: Sequence[int] = (),
    ) -> TrialCheck:
        """The verdict on one trial: ``job`` names the seeds and the output files, or the shared
        buffers whose descriptors are ``fds`` (in the order of the outputs)."""
        cand_shapes = [tuple(int(n) for n in m.get("shape", [])) for m in cand_meta]
        ref_shapes = [tuple(int(n) for n in m.get("shape", [])) for m in ref_meta]
        cand_dtypes = [str(m.get("dtype")) for m in cand_meta]
        ref_dtypes = [str(m.get("dtype")) for m in ref_meta]
        scans: list[dict[str, Any]] = []
        has_residual: list[bool] = []
        if cand_shapes == ref_shapes and cand_dtypes == ref_dtypes:  # else decide() stops at the difference
            header = await self._ask(job, fds)
            measured = header.get("default_errors")  # may raise the task's calibration where that fell back
            self.referee.raise_defaults(source_fingerprint(job["reference_source"]), measured, float(job["scale"]))
            factor = as_rule(factor).on_trial(measured)  # the user's model on these inputs
            scans = [dict(r) for r in header.get("results") or []]
            has_residual = [bool(x) for x in header.get("has_residual") or []]
            if len(scans) != len(ref_meta) or len(has_residual) != len(ref_meta):
                raise EvaluatorFault("the judge answered with the wrong number of results")

        def exact(i: int) -> tuple[int, int | None]:
            first = scans[i].get("first")
            return int(scans[i]["mismatches"]), None if first is None else int(first)

        def scan(i: int, _atol: float, _rtol: float) -> Any:
            return scan_from_wire(scans[i])

        return decide(
            cand_shapes, cand_dtypes, ref_shapes, ref_dtypes, has_residual, exact, scan, tolerances, floors, factor
        )

    async def aclose(self) -> None:
        """Nothing of its own to close: the pool closes the referee."""
