"""The run's ``--eval-timeout`` reaches the runner that judges each candidate (it used to stop at
the island and controller, leaving the runner's 180 s default in force)."""

from __future__ import annotations

import asyncio

from actors.commands.cli import build_parser
from actors.commands.run import build_spec, check_task_source
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.runtime.bus import Bus
from schemas import Candidate, DeviceChoice, EvalResult, PrecisionMode, Task, TorchOpsPolicy, subjects
from tests.bus.helpers import collect, publish_candidates, register_run


class RecordingRunner(NoopRunner):
    """The no-op runner, remembering the bound each evaluation was given."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

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
        self.timeouts.append(timeout_s)
        return await super().evaluate(
            task,
            candidate,
            attempt=attempt,
            evaluator=evaluator,
            timeout_s=timeout_s,
            torch_ops=torch_ops,
            precision=precision,
        )


def test_eval_timeout_option_lands_in_the_run_spec() -> None:
    from pathlib import Path

    task = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    args = build_parser().parse_args(["run", str(task), "--eval-timeout", "42.5"])
    assert build_spec(args, check_task_source(task), DeviceChoice.CPU).eval_timeout_s == 42.5


async def test_eval_timeout_of_the_run_reaches_the_runner(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    runner = RecordingRunner()
    try:
        run = await register_run(bus, run_id, eval_timeout_s=7.5)
        actor = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=runner)
        task = asyncio.create_task(actor.run())
        await actor.wait_ready()
        await publish_candidates(bus, run, range(3))
        await collect(bus, subjects.run_stream(run_id), subjects.results(run_id), EvalResult, want=3, timeout=30)
        actor.request_stop("test over")
        await task
    finally:
        await bus.close()
    assert runner.timeouts == [7.5, 7.5, 7.5]
