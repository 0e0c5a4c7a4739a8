"""An island killed with SIGKILL and started again continues from its archive store (the
``kf_archives`` KV bucket): its evaluated count and state survive, and it goes on counting from there."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from actors.runtime.bus import Bus
from actors.runtime.kv import load_text, put_run
from schemas import Budget, IslandStatus, RunSpec, Task, subjects
from tests.bus.helpers import spawn_actor, stop_process, wait_up

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
async def test_island_killed_and_restarted_continues_from_its_archive_store(
    nats_url: str, run_id: str, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test-island-restart")
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    task = Task.from_source("quickstart", (ROOT / "examples" / "quickstart.py").read_text())
    await put_run(bus, RunSpec(run_id=run_id, task=task, islands=1, budget=Budget(candidates=10_000, wall_s=600)))
    latest: dict[str, IslandStatus] = {}
    history: list[int] = []
    target = {"evaluated": 6}
    reached = asyncio.Event()

    async def on_status(msg: Msg) -> None:
        status = IslandStatus.model_validate_json(msg.data)
        latest[status.island] = status
        history.append(status.evaluated)
        if status.evaluated >= target["evaluated"]:
            reached.set()

    sub = await bus.nc.subscribe(subjects.island_status(run_id), cb=on_status)
    run = ["--nats", nats_url, "--run", run_id]
    helpers = [
        spawn_actor("expert", "--name", "template", "--nats", nats_url, log=tmp_path / "expert.log"),
        spawn_actor("evaluator", "--runner", "noop", "--noop-delay", "0.05", *run, log=tmp_path / "evaluator.log"),
        spawn_actor("diagnoser", *run, log=tmp_path / "diagnoser.log"),
    ]
    island = spawn_actor("island", "--island", "i0", "--id", "island-a", *run, log=tmp_path / "island-a.log")
    second = None
    try:
        await wait_up(bus, "island-a", timeout=120)
        async with asyncio.timeout(120):
            await reached.wait()
        await asyncio.sleep(1.5)  # past the island's save interval (1 s)
        os.killpg(island.pid, signal.SIGKILL)
        island.wait(timeout=10)
        saved = await load_text(bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(run_id, "i0"))
        assert saved is not None, "the island left nothing in its archive store"
        stored = json.loads(saved)
        kept = _evaluated(stored)
        assert kept >= 6
        target["evaluated"] = kept + 1
        history.clear()
        reached.clear()
        second = spawn_actor("island", "--island", "i0", "--id", "island-b", *run, log=tmp_path / "island-b.log")
        await wait_up(bus, "island-b", timeout=120)
        async with asyncio.timeout(120):
            await reached.wait()
    finally:
        await sub.unsubscribe()
        for proc in [*helpers, *([second] if second else [])]:
            stop_process(proc)
        if island.poll() is None:
            os.killpg(island.pid, signal.SIGKILL)
        await bus.close()
    restored = [
        json.loads(line)
        for line in (tmp_path / "island-b.log").read_text().splitlines()
        if line.startswith("{") and '"island restored"' in line
    ]
    assert restored, "the second island started from scratch"
    assert restored[0]["evaluated"] == kept
    # It went on counting from where the first one stopped, never from zero.
    assert history
    assert min(history) >= kept, history
    assert latest["i0"].evaluated > kept


def _evaluated(state: dict[str, object]) -> int:
    value = state.get("evaluated")
    assert isinstance(value, int), sorted(state)
    return value
