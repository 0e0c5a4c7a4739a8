"""An island whose expert comes up late waits for it: unanswered requests are not declines.

In a cluster run an island can start well before the expert actor (a slower machine, a restart):
CI saw an island ask six times in its first 5 s with no expert serving, then give
up after about 15 s with nothing evaluated, ending the run with ``no_progress``. Declines still end a
hopeless run that fast; an expert that never answered is waited for (``UNANSWERED_GIVE_UP_S``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from actors.runtime.bus import Bus
from actors.runtime.kv import put_run
from schemas import Budget, IslandStatus, RunSpec, Task, subjects
from tests.bus.helpers import spawn_actor, stop_process, wait_up

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
LATE_S = 25.0
"""Longer than the ~15 s after which unanswered requests alone made the island give up."""


@pytest.mark.slow  # waits for the late expert
async def test_an_island_started_before_its_expert_waits_for_it(nats_url: str, run_id: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test-late-expert")
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    task = Task.from_source("quickstart", (ROOT / "examples" / "quickstart.py").read_text())
    await put_run(bus, RunSpec(run_id=run_id, task=task, islands=1, budget=Budget(candidates=10_000, wall_s=600)))
    latest: list[IslandStatus] = []
    evaluated = asyncio.Event()

    async def on_status(msg: Msg) -> None:
        status = IslandStatus.model_validate_json(msg.data)
        latest.append(status)
        if status.evaluated >= 2:
            evaluated.set()

    sub = await bus.nc.subscribe(subjects.island_status(run_id), cb=on_status)
    run = ["--nats", nats_url, "--run", run_id]
    procs = [
        spawn_actor("evaluator", "--runner", "noop", "--noop-delay", "0.05", *run, log=tmp_path / "evaluator.log"),
        spawn_actor("diagnoser", *run, log=tmp_path / "diagnoser.log"),
        spawn_actor("island", "--island", "i0", "--id", "island-early", *run, log=tmp_path / "island.log"),
    ]
    try:
        await wait_up(bus, "island-early", timeout=120)
        await asyncio.sleep(LATE_S)
        assert not [s for s in latest if s.stopped is not None], [s.stopped for s in latest]
        procs.append(spawn_actor("expert", "--name", "template", "--nats", nats_url, log=tmp_path / "expert.log"))
        async with asyncio.timeout(150):
            await evaluated.wait()
    finally:
        await sub.unsubscribe()
        for proc in procs:
            stop_process(proc)
        await bus.close()
    assert "expert unavailable" in (tmp_path / "island.log").read_text()  # it did ask before the expert came
    assert not [s for s in latest if s.stopped is not None], [s.stopped for s in latest]
