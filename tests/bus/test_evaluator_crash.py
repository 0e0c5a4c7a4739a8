"""An evaluator killed with SIGKILL in the middle of a candidate loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

from actors.bus import Bus
from schemas import ActorInfo, EvalResult, subjects
from tests.bus.helpers import actor_info, collect, publish_candidates, register_run, spawn_actor, stop_process


async def _wait_busy(bus: Bus, actor_id: str, timeout: float = 30.0) -> ActorInfo:
    async with asyncio.timeout(timeout):
        while True:
            info = await actor_info(bus, actor_id)
            if info is not None and info.stats.in_flight > 0:
                return info
            await asyncio.sleep(0.1)


async def test_evaluator_crash_redelivers_candidate_exactly_once(nats_url: str, run_id: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test")
    run = await register_run(bus, run_id)
    common = ["--nats", nats_url, "--run", run_id, "--runner", "noop", "--ack-wait", "2", "--eval-concurrency", "2"]
    first = spawn_actor("evaluator", "--id", "evaluator-first", "--noop-delay", "30", *common, log=tmp_path / "a.log")
    second = None
    try:
        await publish_candidates(bus, run, range(6))
        info = await _wait_busy(bus, "evaluator-first")
        assert info.stats.in_flight == 2  # two candidates in hand, none finished (30 s each)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        second = spawn_actor(
            "evaluator", "--id", "evaluator-second", "--noop-delay", "0.05", *common, log=tmp_path / "b.log"
        )
        results = await collect(
            bus, subjects.run_stream(run_id), subjects.results(run_id), EvalResult, want=6, timeout=60
        )
    finally:
        if second is not None:
            assert stop_process(second) == 0
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    counts = Counter(r.candidate_id for r in results)
    assert counts == Counter({f"cand{i:05d}": 1 for i in range(6)})
    assert {r.evaluator for r in results} == {"evaluator-second"}
    assert sum(1 for r in results if r.attempt >= 2) >= 2  # the two that were in hand came back
    lag = await bus.js.consumer_info(subjects.run_stream(run_id), subjects.EVALUATORS)
    await bus.close()
    assert lag.num_pending == 0
