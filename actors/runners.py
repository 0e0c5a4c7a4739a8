"""The evaluation seam: what an evaluator actor calls to judge one candidate.

``GpuRunner`` wraps ``gpu_runner.EvaluationService`` (the honest evaluator). ``NoopRunner``
evaluates nothing: it exists to measure the fabric itself (benchmarks, bus tests) and says so in
every result it returns, which is flagged for review and so can never become an elite.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from schemas import (
    Candidate,
    DeviceChoice,
    EvalResult,
    EvalStatus,
    KernelLanguage,
    StageTimes,
    Task,
    TorchOpsPolicy,
)


class Runner(Protocol):
    """Evaluates candidates. Never raises for a fault of the candidate: that is a verdict."""

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
    """The honest evaluator: ``gpu_runner.EvaluationService`` (sandboxed, pre-warmed workers)."""

    def __init__(
        self,
        *,
        device: DeviceChoice = DeviceChoice.AUTO,
        timeout_s: float = 180.0,
        spares: int = 2,
        max_concurrent_runs: int = 1,
        isolation: str = "best-effort",
    ) -> None:
        from gpu_runner.config import IsolationMode
        from gpu_runner.service import EvaluationService, RunnerConfig

        self.timeout_s = timeout_s
        self.service = EvaluationService(
            RunnerConfig(
                device=device,
                spares=spares,
                max_concurrent_runs=max_concurrent_runs,
                isolation=IsolationMode(isolation),
            )
        )

    async def start(self) -> None:
        await self.service.start()

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
        )
        return await self.service.evaluate(job)

    async def aclose(self) -> None:
        await self.service.aclose()
