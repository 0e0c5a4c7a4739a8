"""An evaluator killed with SIGKILL in the middle of a candidate loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from actors.runtime.bus import Bus
from actors.runtime.kv import put_run
from schemas import (
    ActorInfo,
    Candidate,
    DeviceChoice,
    EvalResult,
    EvalStatus,
    KernelLanguage,
    Proposal,
    RunSpec,
    Task,
    subjects,
)
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
        # four candidates in hand (two judged at once, two more taken to pick the best-ranked
        # from), none finished (30 s each)
        assert info.stats.in_flight == 4
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
    assert sum(1 for r in results if r.attempt >= 2) >= 4  # the four that were in hand came back
    lag = await bus.js.consumer_info(subjects.run_stream(run_id), subjects.EVALUATORS)
    await bus.close()
    assert lag.num_pending == 0


GPU_RUNNER_TESTS = Path(__file__).resolve().parents[1] / "gpu_runner"


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_real_evaluator_killed_holding_a_candidate_yields_exactly_one_result(
    nats_url: str, run_id: str, tmp_path: Path
) -> None:
    """The real evaluator (gpu_runner on the CPU, Triton interpreter) is SIGKILLed, process group
    and all, while it holds a candidate; a second evaluator gets it again and publishes exactly one
    result for it (counted on a core subscription, which the stream's de-duplication cannot hide)."""
    bus = await Bus.connect(nats_url, name="test", actor_id="test-real-crash")
    reference = (GPU_RUNNER_TESTS / "references" / "add_relu.py").read_text()
    source = (GPU_RUNNER_TESTS / "candidates" / "honest_add_relu.py").read_text()
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    run = RunSpec(run_id=run_id, task=Task.from_source("add_relu", reference), device=DeviceChoice.CPU)
    await put_run(bus, run)
    published: Counter[str] = Counter()

    async def count(msg: Msg) -> None:
        published[EvalResult.model_validate_json(msg.data).candidate_id] += 1

    tally = await bus.nc.subscribe(subjects.results(run_id), cb=count)
    common = ["--nats", nats_url, "--run", run_id, "--device", "cpu", "--spares", "1", "--ack-wait", "5"]
    common += ["--eval-concurrency", "1"]
    first = spawn_actor("evaluator", "--id", "evaluator-real-1", *common, log=tmp_path / "a.log")
    second = None
    try:
        cand = Candidate(
            candidate_id="crash00001",
            run_id=run_id,
            island="i0",
            task_id=run.task.task_id,
            expert="test",
            proposal=Proposal(source=source, language=KernelLanguage.TRITON),
        )
        await bus.publish_durable(subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id)
        info = await _wait_busy(bus, "evaluator-real-1", timeout=240)
        assert info.stats.in_flight == 1
        assert published["crash00001"] == 0  # held, not finished
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        held = await bus.js.consumer_info(subjects.run_stream(run_id), subjects.EVALUATORS)
        assert held.num_ack_pending == 1, "the killed evaluator had acknowledged a candidate it never judged"
        second = spawn_actor("evaluator", "--id", "evaluator-real-2", *common, log=tmp_path / "b.log")
        results = await collect(
            bus, subjects.run_stream(run_id), subjects.results(run_id), EvalResult, want=1, timeout=300
        )
        await asyncio.sleep(1.0)  # a second result would follow right behind
    finally:
        if second is not None:
            assert stop_process(second) == 0
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        await tally.unsubscribe()
        await bus.close()
    assert [r.candidate_id for r in results] == ["crash00001"]
    (result,) = results
    assert result.evaluator == "evaluator-real-2"
    assert result.attempt >= 2  # the same candidate, delivered again
    assert result.status is EvalStatus.CORRECT, result.summary
    assert published == Counter({"crash00001": 1})
