"""Evaluator actor: judges candidates with a ``Runner`` and publishes the verdicts.

Reads:  ``kf.<run>.cand.*.*`` (``Candidate``) through the run's shared durable pull consumer
        ``evaluators`` (every candidate goes to one evaluator; ``in_progress`` heartbeats while
        it is judged; a crash means redelivery to another evaluator, never loss).
Writes: ``kf.<run>.result.<island>`` (``EvalResult``) into the run stream with dedup id
        ``result-<candidate>``; the candidate is acked only after the result is stored, so a
        result is never lost and never stored twice.
"""

from __future__ import annotations

import asyncio
import time

from actors.kinds.evaluator_runners import Runner
from actors.runtime.base import Actor
from actors.runtime.bus import ConsumerSpec, Delivery
from actors.runtime.errors import Retry, TaskInvalid, TaskRefused
from actors.runtime.kv import get_run
from actors.runtime.latency import EVALUATION_SECONDS
from actors.runtime.logs import bound
from gpu_runner.errors import InvalidReference, IsolationUnavailable, TaskTooLarge
from schemas import ActorKind, Candidate, EvalStatus, RunEnd, RunSpec, Task, subjects


class EvaluatorActor(Actor):
    """Pulls candidates of one run and evaluates them (see the module docstring)."""

    kind = ActorKind.EVALUATOR
    description = "Evaluates candidate kernels (gpu_runner) and publishes EvalResults"

    def __init__(
        self,
        *,
        nats_url: str,
        run_id: str,
        runner: Runner,
        concurrency: int = 2,
        lookahead: int | None = None,
        ack_wait_s: float = 30.0,
        max_deliver: int = 3,
        actor_id: str | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__(nats_url=nats_url, run_id=run_id, actor_id=actor_id, version=version)
        self.runner = runner
        self.concurrency = concurrency
        self.lookahead = concurrency if lookahead is None else lookahead
        """Candidates taken beyond those judged at once (default: as many), gated and compiled while
        they wait: the evaluator then picks the best-ranked for its spares and the GPU. Taking only
        ``concurrency``, it took whichever island's candidates reached the stream first: on an
        H200 (KernelBench L2-52) one island's four starts, its hedge at 0.58x eager first, while the
        other's first starting point (1.98x, the run's best) waited 11 s in the stream."""
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.task: Task | None = None
        self.spec: RunSpec | None = None
        self.evaluated = 0
        self.refused: TaskRefused | None = None
        """Set when the task cannot be evaluated on this machine (the run ends at once, exit 3)."""
        self.cancelled = 0
        self.gpu_busy_s = 0.0
        """Seconds the GPU was held for this evaluator's candidates (their ``stages.gpu_s``)."""
        self.serving_since: float | None = None
        """When it began taking candidates (wall clock): the window of its throughput and busy fraction."""
        self.checking_since: float | None = None
        """While it checks the task (the reference loaded, built and run once): when that began."""
        self.task_checked = False
        """Whether it has checked the task (until then, starting or checking, it has judged nothing)."""

    def prestart(self) -> None:
        """Start the runner now, before the actor runs (its processes' imports then overlap the rest
        of the run's start-up); the set-up waits for that start, the teardown ends it."""
        self.runner.prestart()

    async def setup(self) -> None:
        self.spec = await get_run(self.bus, self.rid)
        self.task = self.spec.task
        self.checking_since = time.time()
        try:
            await self.runner.start()
            # Candidates are taken from here on: their gate and compile (no GPU) overlap the
            # task's preparation (the memory plan's measure, the first spares), and each waits for
            # a prepared worker after compiling, which is not counted against it. Taken only once
            # the task is prepared, the first candidates of a KernelBench L1-3 run on an H100
            # began compiling 3.5 s after the compile workers could have (at the memory plan).
            preparing = asyncio.create_task(self.runner.prepare(self.task))
            try:
                await self._consume()
            except BaseException:
                preparing.cancel()
                await asyncio.wait([preparing])
                raise
            await preparing  # the task's plan: a refusal (too large) ends the set-up here
            self.checking_since = None
            self.task_checked = True
        except (TaskTooLarge, IsolationUnavailable) as exc:  # no candidate can run here: the run says so and ends
            self.refused = TaskRefused(str(exc))
            raise self.refused from None
        except InvalidReference as exc:  # the task itself fails: no candidate can be judged against it
            self.refused = TaskInvalid(f"the task does not work: {exc.one_line()}")
            raise self.refused from None

    async def _consume(self) -> None:
        consumer = ConsumerSpec(
            stream=subjects.run_stream(self.rid),
            durable=subjects.EVALUATORS,
            filter_subject=subjects.candidates(self.rid),
            ack_wait_s=self.ack_wait_s,
            max_deliver=self.max_deliver,
            batch=self.concurrency + self.lookahead,
        )
        await self.bus.consume(consumer, Candidate, self.handle, concurrency=self.concurrency + self.lookahead)
        self.serving_since = time.time()

    async def handle(self, candidate: Candidate, delivery: Delivery) -> None:
        """Evaluate one candidate and store its result before the candidate is acked."""
        assert self.task is not None
        assert self.spec is not None
        with bound(island=candidate.island, candidate=candidate.candidate_id):
            started = time.perf_counter()
            result = await self.runner.evaluate(
                self.task,
                candidate,
                attempt=delivery.num_delivered,
                evaluator=self.actor_id,
                timeout_s=self.spec.eval_timeout_s,
                torch_ops=self.spec.torch_ops,
                precision=self.spec.precision,
            )
            EVALUATION_SECONDS.labels(self.rid, result.status.value).observe(time.perf_counter() - started)
            if result.status is EvalStatus.EVALUATOR_ERROR and delivery.num_delivered < self.max_deliver:
                # The evaluator failed, not the candidate: judged again (here or by another
                # evaluator); the last attempt's result is stored, so nothing waits forever.
                self.log.warning("evaluator_error", candidate=candidate.candidate_id, summary=result.summary[:300])
                raise Retry(result.summary, delay_s=2.0)
            await self.bus.publish_durable(
                subjects.results(self.rid, candidate.island),
                result,
                msg_id=f"result-{candidate.candidate_id}",
            )
            self.evaluated += 1
            self.gpu_busy_s += result.stages.gpu_s or 0.0
            self.log.info(
                "evaluated",
                island=candidate.island,
                candidate=candidate.candidate_id,
                status=str(result.status),
                speedup=result.speedup_vs_eager,
                attempt=delivery.num_delivered,
            )

    async def _on_run_end(self, end: RunEnd, delivery: Delivery) -> None:
        if end.cancelled and self._bus is not None:
            # The run is over (its deadline, or a second interrupt): stop evaluating at once.
            n = self.bus.abort_consumers()
            self.cancelled += n
            self.log.info("evaluations cancelled: the run ended", reason=str(end.reason), cancelled=n)
        await super()._on_run_end(end, delivery)

    def extra_stats(self) -> dict[str, float | int | str | None]:
        gpu = getattr(self.runner, "gpu", None)
        serving = time.time() - self.serving_since if self.serving_since is not None else None
        return {
            "evaluated": self.evaluated,
            "cancelled": self.cancelled,
            "gpu": gpu.index if gpu is not None else None,
            "gpu_name": gpu.name if gpu is not None else None,
            "gpu_busy_s": round(self.gpu_busy_s, 3),
            "serving_s": round(serving, 3) if serving is not None else None,
        }

    async def teardown(self) -> None:
        await self.runner.aclose()
