"""Scripted stand-ins at the actors' seams (the ``Expert`` and ``Runner`` protocols), for tests whose
subject is the fabric around them: real actors, a real nats-server, canned proposals and verdicts."""

from __future__ import annotations

import asyncio

from schemas import (
    Candidate,
    EvalResult,
    EvalStatus,
    GenerateReply,
    GenerateRequest,
    KernelLanguage,
    PrecisionMode,
    Proposal,
    Task,
    TimerKind,
    TimingStats,
    TorchOpsPolicy,
)


class ScriptedExpert:
    """Answers every request with ``request.n`` distinct proposals after a short delay."""

    def __init__(self, name: str = "scripted", delay_s: float = 0.02) -> None:
        self.name = name
        self.delay_s = delay_s

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        await asyncio.sleep(self.delay_s)
        proposals = tuple(
            Proposal(
                source=f"# proposal {k} for {request.request_id}\nclass ModelNew: ...\n",
                language=KernelLanguage.TRITON,
                strategy="scripted",
                params={"block": 16 * 2 ** (k % 4)},
            )
            for k in range(request.n)
        )
        return GenerateReply(request_id=request.request_id, expert=self.name, proposals=proposals)

    async def aclose(self) -> None:
        return None


class ScriptedRunner:
    """Judges every candidate correct with a speedup that grows with each evaluation, so results
    become elites (and elites migrate)."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.count = 0

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
        await asyncio.sleep(self.delay_s)
        self.count += 1
        ms = 1.0 / (1.0 + 0.1 * self.count)
        timing = TimingStats(
            median_ms=ms, mean_ms=ms, std_ms=0.0, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms,
            reps=10, rel_stderr=0.0, timer=TimerKind.PERF_COUNTER,
        )  # fmt: skip
        return EvalResult(
            run_id=candidate.run_id,
            candidate_id=candidate.candidate_id,
            island=candidate.island,
            task_id=candidate.task_id,
            status=EvalStatus.CORRECT,
            summary="scripted verdict",
            speedup_vs_eager=1.0 + 0.1 * self.count,
            timing=timing,
            evaluator=evaluator,
            attempt=attempt,
        )

    async def aclose(self) -> None:
        return None
