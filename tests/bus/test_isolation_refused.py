"""An evaluator whose sandbox cannot hold under ``strict`` isolation refuses the task (the run ends
with the refusal's one line) instead of failing as a crash."""

from __future__ import annotations

import asyncio

import pytest

from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.runtime.bus import Bus
from actors.runtime.errors import TaskRefused
from gpu_runner.config import IsolationMode
from gpu_runner.confine.policy import LAYERS, Layers
from gpu_runner.errors import IsolationUnavailable
from gpu_runner.isolation import Isolation, isolation_refusal
from tests.bus.helpers import register_run

pytestmark = pytest.mark.timeout(60)


class StrictRunner(NoopRunner):
    """A runner whose service found a layer missing under strict isolation (as its start does)."""

    async def start(self) -> None:
        notes = dict.fromkeys(LAYERS, "held")
        notes["landlock"] = "skipped: Landlock is not available (ABI 0); enable Landlock: kernel >= 5.13"
        layers = Layers(notes=notes, userns=True, namespaces=True, landlock=False, seccomp=True)
        refusal = isolation_refusal(Isolation((), "held", "held", None, None, "x", layers), IsolationMode.STRICT)
        assert refusal is not None
        raise IsolationUnavailable(refusal)


async def test_strict_isolation_missing_a_layer_refuses_the_task_with_one_line(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    try:
        await register_run(bus, run_id)
        actor = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=StrictRunner())
        task = asyncio.create_task(actor.run())
        await asyncio.wait_for(actor.wait_ready(), 30)
        with pytest.raises(TaskRefused) as caught:
            await task
    finally:
        await bus.close()
    assert actor.refused is caught.value
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("isolation is strict and landlock does not hold here")
    assert "--isolation best-effort" in text
