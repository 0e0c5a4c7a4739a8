"""The evaluation seam: what an evaluator actor calls to judge one candidate.

``GpuRunner`` wraps ``gpu_runner.EvaluationService`` (the honest evaluator). ``NoopRunner``
evaluates nothing: it exists to measure the fabric itself (benchmarks, bus tests) and says so in
every result it returns, which is flagged for review and so can never become an elite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Protocol

from schemas import (
    Candidate,
    DeviceChoice,
    DeviceKind,
    EvalResult,
    EvalStatus,
    KernelLanguage,
    PrecisionMode,
    StageTimes,
    Task,
    TorchOpsPolicy,
)

if TYPE_CHECKING:
    from actors.runtime.gpu_claim import GpuClaim
    from actors.runtime.gpus import Gpu


class Runner(Protocol):
    """Evaluates candidates. Never raises for a fault of the candidate: that is a verdict."""

    def prestart(self) -> None:
        """Begin :meth:`start` now in the background (called inside the event loop, before the
        actor runs); :meth:`start` then waits for that one, and :meth:`aclose` ends it."""
        ...

    async def start(self) -> None:
        """Start workers (pre-warm)."""
        ...

    async def prepare(self, task: Task) -> None:
        """Get ready for candidates of ``task`` (e.g. warm spares with the reference loaded)."""
        ...

    async def evaluate(
        self,
        task: Task,
        candidate: Candidate,
        *,
        attempt: int,
        evaluator: str,
        timeout_s: float | None = None,
        torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID,
        precision: PrecisionMode = PrecisionMode.REFERENCE,
    ) -> EvalResult:
        """The verdict on one candidate, bounded by ``timeout_s`` (the run's ``eval_timeout_s``;
        ``None``: the runner's own default)."""
        ...

    async def aclose(self) -> None:
        """Stop every worker; nothing spawned survives."""
        ...


class NoopRunner:
    """Returns a result without evaluating anything, after ``delay_s`` (see the module docstring)."""

    REVIEW_NOTE = "no-op evaluator: nothing was compiled, run or measured"

    def __init__(self, delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.delay_s = delay_s

    def prestart(self) -> None:
        return None

    async def start(self) -> None:
        return None

    async def prepare(self, task: Task) -> None:
        return None

    async def evaluate(
        self,
        task: Task,
        candidate: Candidate,
        *,
        attempt: int,
        evaluator: str,
        timeout_s: float | None = None,
        torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID,
        precision: PrecisionMode = PrecisionMode.REFERENCE,
    ) -> EvalResult:
        started = time.perf_counter()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return EvalResult(
            run_id=candidate.run_id,
            candidate_id=candidate.candidate_id,
            island=candidate.island,
            task_id=candidate.task_id,
            status=EvalStatus.CORRECT,
            summary=self.REVIEW_NOTE,
            review=(self.REVIEW_NOTE,),
            evaluator=evaluator,
            attempt=attempt,
            stages=StageTimes(total_s=time.perf_counter() - started),
        )

    async def aclose(self) -> None:
        return None


class GpuRunner:
    """The honest evaluator: ``gpu_runner.EvaluationService`` (sandboxed, pre-warmed workers).

    With ``claim`` (one GPU of several, held by this process: :mod:`actors.runtime.gpu_claim`) its workers
    see that GPU alone, its results name it, and the claim is released when the runner closes.
    """

    def __init__(
        self,
        *,
        device: DeviceChoice = DeviceChoice.AUTO,
        timeout_s: float = 180.0,
        spares: int = 2,
        max_concurrent_runs: int = 1,
        isolation: str = "best-effort",
        claim: GpuClaim | None = None,
        compile_workers: int | None = None,
        host_memory_share: float = 1.0,
        max_running: int = 0,
    ) -> None:
        from gpu_runner.config import IsolationMode
        from gpu_runner.service import EvaluationService, RunnerConfig

        self.timeout_s = timeout_s
        self.claim = claim
        self.gpu: Gpu | None = claim.gpu if claim is not None else None
        config = RunnerConfig(
            device=device,
            spares=spares,
            max_concurrent_runs=max_concurrent_runs,
            isolation=IsolationMode(isolation),
            gpu=self.gpu.uuid if self.gpu is not None else None,
            host_memory_share=host_memory_share,
            max_running=max_running,
        )
        if compile_workers is not None:
            config = dataclasses.replace(config, compile_workers=compile_workers)
        self.service = EvaluationService(config)
        self._starting: asyncio.Task[None] | None = None

    def prestart(self) -> None:
        if self._starting is None:
            self._starting = asyncio.create_task(self.service.start())

    async def start(self) -> None:
        self.prestart()
        assert self._starting is not None
        await self._starting

    async def prepare(self, task: Task) -> None:
        await self.service.prepare(task.source)

    async def evaluate(
        self,
        task: Task,
        candidate: Candidate,
        *,
        attempt: int,
        evaluator: str,
        timeout_s: float | None = None,
        torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID,
        precision: PrecisionMode = PrecisionMode.REFERENCE,
    ) -> EvalResult:
        from gpu_runner.service import EvalJob

        job = EvalJob(
            reference_source=task.source,
            candidate_source=candidate.proposal.source,
            language=KernelLanguage(candidate.proposal.language),
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            run_id=candidate.run_id,
            candidate_id=candidate.candidate_id,
            island=candidate.island,
            task_id=candidate.task_id,
            attempt=attempt,
            evaluator=evaluator,
            torch_ops=torch_ops,
            precision=precision.value,
            rank=candidate.rank,
        )
        result = await self.service.evaluate(job)
        return stamp_gpu(result, self.gpu)

    async def aclose(self) -> None:
        try:
            starting = self._starting
            if starting is not None and not starting.done():  # prestarted, never awaited: its start ends
                starting.cancel()
            if starting is not None:
                await asyncio.wait([starting])
                if not starting.cancelled():
                    starting.exception()  # taken here (a failed start nobody awaited), not logged as lost
            await self.service.aclose()
        finally:
            if self.claim is not None:
                self.claim.release()


def stamp_gpu(result: EvalResult, gpu: Gpu | None) -> EvalResult:
    """``result`` naming the GPU that evaluated it (unchanged without one, or on the CPU)."""
    if gpu is None or result.device is None or result.device.kind is not DeviceKind.CUDA:
        return result
    device = result.device.model_copy(update={"gpu_index": gpu.index})
    return result.model_copy(update={"device": device})
