"""An evaluator takes candidates while its task is still being prepared (their gate and compile
overlap the memory plan's measure and the first spares); a task it then refuses still ends its
set-up with the refusal."""

from __future__ import annotations

import asyncio

import pytest

from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.runtime.bus import Bus
from actors.runtime.errors import TaskRefused
from gpu_runner.errors import TaskTooLarge
from schemas import Candidate, EvalResult, PrecisionMode, Task, TorchOpsPolicy, subjects
from tests.bus.helpers import collect, publish_candidates, register_run

pytestmark = pytest.mark.timeout(60)


class SlowPreparation(NoopRunner):
    """The no-op runner, whose task preparation lasts until the test lets it end (or refuses the
    task); it counts the candidates handed to it before the preparation ended."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse
        self.release = asyncio.Event()
        self.prepared = False
        self.before_prepared = 0

    async def prepare(self, task: Task) -> None:
        await self.release.wait()
        if self.refuse:
            raise TaskTooLarge("task needs ~90.0 GiB of device memory for one evaluation; this GPU has 79.1 GiB free")
        self.prepared = True

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
        if not self.prepared:
            self.before_prepared += 1
            await self.release.wait()  # as the real runner: the run stage waits for the task's plan
        return await super().evaluate(
            task,
            candidate,
            attempt=attempt,
            evaluator=evaluator,
            timeout_s=timeout_s,
            torch_ops=torch_ops,
            precision=precision,
        )


async def _until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_candidates_are_taken_while_the_task_is_prepared(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    runner = SlowPreparation()
    try:
        run = await register_run(bus, run_id)
        actor = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=runner, concurrency=2)
        task = asyncio.create_task(actor.run())
        await publish_candidates(bus, run, range(5))
        # the preparation still runs: the candidates have reached the runner all the same, as many
        # as it judges at once and as many again (the look-ahead it picks the best-ranked from)
        assert await _until(lambda: runner.before_prepared == 4, 20), runner.before_prepared
        await asyncio.sleep(0.5)
        assert runner.before_prepared == 4  # the fifth waits in the stream
        assert not runner.prepared
        runner.release.set()
        await asyncio.wait_for(actor.wait_ready(), 20)
        got = await collect(bus, subjects.run_stream(run_id), subjects.results(run_id), EvalResult, want=5, timeout=30)
        assert len(got) == 5
        actor.request_stop("test over")
        await task
    finally:
        await bus.close()


async def test_a_task_refused_by_its_preparation_ends_the_set_up_with_the_refusal(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    runner = SlowPreparation(refuse=True)
    try:
        run = await register_run(bus, run_id)
        actor = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=runner)
        task = asyncio.create_task(actor.run())
        await publish_candidates(bus, run, range(2))
        assert await _until(lambda: runner.before_prepared >= 1, 20)
        runner.release.set()
        with pytest.raises(TaskRefused) as caught:
            await asyncio.wait_for(task, 30)
    finally:
        await bus.close()
    assert actor.refused is caught.value
    assert str(caught.value).startswith("task needs ~90.0 GiB of device memory")
