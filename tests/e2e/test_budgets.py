"""A run's budgets are exact and counted from its stream: ``--candidates N`` evaluates exactly N
with several islands, a NATS restart in the middle changes no count, ``--seconds S`` ends within a
few seconds of S with the evaluations still running cancelled and recorded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.controller import RunController
from actors.commands.outcome import RunOutcome
from actors.commands.run import build_spec, check_task_source
from actors.runtime.bus import Bus
from actors.runtime.options import RunOptions
from actors.runtime.quota import CandidateQuota
from schemas import Candidate, DeviceChoice, EvalResult, Message, RunEnd, StopReason, decode_any, subjects
from tests.bus.helpers import RestartableServer

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _controller(url: str, tmp_path: Path, *options: str) -> RunController:
    args = build_parser().parse_args(
        ["run", str(QUICKSTART), "--device", "cpu", "--runner", "noop", "--embedder", "hashing", "--quiet",
         "--library-dir", str(tmp_path / "library"), *options]
    )  # fmt: skip
    spec = build_spec(args, check_task_source(args.task), DeviceChoice.CPU)
    seeds = [p.read_text() for p in args.seed_candidate]
    return RunController(spec=spec, url=url, run_dir=tmp_path / "run", options=RunOptions.from_args(args), seeds=seeds)


async def _stream(url: str, run_id: str) -> list[Message]:
    bus = await Bus.connect(url, name="test-replay", actor_id="test-replay")
    try:
        stream = subjects.run_stream(run_id)
        last = int((await bus.js.stream_info(stream)).state.last_seq)
        sub = await bus.js.subscribe(subjects.run_all(run_id), stream=stream, ordered_consumer=True)
        out: list[Message] = []
        while last:
            msg = await sub.next_msg(timeout=10.0)
            with contextlib.suppress(ValueError):  # a poison candidate a test published is left out
                out.append(decode_any(msg.data))
            if int(msg.metadata.sequence.stream) >= last:
                break
        await sub.unsubscribe()
        return out
    finally:
        await bus.close()


def _of(messages: list[Message], kind: type[Message]) -> list[Message]:
    return [m for m in messages if isinstance(m, kind)]


async def _run(controller: RunController, seconds: float) -> RunOutcome:
    async with asyncio.timeout(seconds):
        return await controller.run(asyncio.Event())


@pytest.mark.timeout(180)
async def test_candidate_budget_is_exact_with_several_islands(nats_url: str, tmp_path: Path) -> None:
    controller = _controller(
        nats_url, tmp_path, "--islands", "3", "--inflight", "4", "--candidates", "29", "--seconds", "150",
        "--evaluators", "2",
    )  # fmt: skip
    outcome = await _run(controller, 170)
    assert outcome.reason is StopReason.CANDIDATES
    assert outcome.evaluated == 29
    messages = await _stream(nats_url, controller.spec.run_id)
    assert len({c.candidate_id for c in _of(messages, Candidate)}) == 29  # type: ignore[attr-defined]
    assert len({r.candidate_id for r in _of(messages, EvalResult)}) == 29  # type: ignore[attr-defined]
    bus = await Bus.connect(nats_url, name="test-quota", actor_id="test-quota")
    try:
        assert await CandidateQuota(bus, controller.spec.run_id, 29).issued() == 29
    finally:
        await bus.close()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[RestartableServer]:
    server = RestartableServer(tmp_path / "js")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow  # a run across a server restart: ~7 s; CI runs it in the slow suite
@pytest.mark.timeout(240)
async def test_counts_survive_a_nats_restart_in_the_middle(restartable: RestartableServer, tmp_path: Path) -> None:
    controller = _controller(
        restartable.url, tmp_path, "--islands", "2", "--inflight", "2", "--candidates", "40", "--seconds", "200",
        "--noop-delay", "0.1",
    )  # fmt: skip
    run = asyncio.create_task(_run(controller, 220))
    async with asyncio.timeout(150):
        while controller.progress.evaluated < 8:
            if controller.watcher is not None:
                controller.watcher.changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await controller.watcher.changed.wait()
            else:
                await asyncio.sleep(0.1)  # the watcher does not exist yet
    restartable.stop()
    await asyncio.sleep(2.0)
    restartable.start()
    outcome = await run
    assert outcome.reason is StopReason.CANDIDATES
    assert outcome.evaluated == 40
    messages = await _stream(restartable.url, controller.spec.run_id)
    results = {r.candidate_id for r in _of(messages, EvalResult)}  # type: ignore[attr-defined]
    assert len(results) == 40
    assert len({c.candidate_id for c in _of(messages, Candidate)}) == 40  # type: ignore[attr-defined]


@pytest.mark.slow  # a 40 s wall budget run out
@pytest.mark.timeout(180)
async def test_wall_budget_ends_on_time_and_cancels_what_is_in_flight(nats_url: str, tmp_path: Path) -> None:
    # Evaluations take 60 s: none can finish before the 40 s deadline (startup included). Two
    # seed candidates are in flight from the start.
    seed = tmp_path / "seed.py"
    seed.write_text("class ModelNew: ...\n")
    controller = _controller(
        nats_url, tmp_path, "--islands", "2", "--inflight", "2", "--candidates", "1000", "--seconds", "40",
        "--noop-delay", "60", "--eval-timeout", "120", "--seed-candidate", str(seed), "--seed-candidate", str(seed),
    )  # fmt: skip
    outcome = await _run(controller, 120)
    assert outcome.reason is StopReason.WALL_TIME
    deadline = controller.spec.created_at + 40
    messages = await _stream(nats_url, controller.spec.run_id)
    (end,) = _of(messages, RunEnd)
    assert end.at - deadline < 3.0, f"the run ended {end.at - deadline:.1f} s after its deadline"  # type: ignore[attr-defined]
    stopped = max(a.stopped_at or float("inf") for a in controller.actors)
    assert stopped - end.at < 5.0, f"the actors stopped {stopped - end.at:.1f} s after the run ended"  # type: ignore[attr-defined]
    issued = {c.candidate_id for c in _of(messages, Candidate)}  # type: ignore[attr-defined]
    assert issued
    assert set(end.cancelled) == issued  # type: ignore[attr-defined]
    assert outcome.cancelled == len(issued)
    assert not _of(messages, EvalResult)


@pytest.mark.slow  # a 12 s wall budget run out
@pytest.mark.timeout(120)
async def test_a_dead_lettered_candidate_is_said_apart_from_those_cancelled_in_flight(
    nats_url: str, tmp_path: Path
) -> None:
    """A candidate the evaluator cannot read is dead-lettered, never judged: at the run's end it is
    counted as dead-lettered (with where to read why), not as "cancelled in flight"."""
    controller = _controller(
        nats_url, tmp_path, "--islands", "1", "--inflight", "1", "--candidates", "1000", "--seconds", "12",
        "--noop-delay", "60", "--eval-timeout", "120",
    )  # fmt: skip
    run_id = controller.spec.run_id
    running = asyncio.create_task(_run(controller, 100))
    bus = await Bus.connect(nats_url, name="test-poison", actor_id="test-poison")
    try:
        stream = subjects.run_stream(run_id)
        for _ in range(100):  # until the controller made the run's stream
            with contextlib.suppress(Exception):
                await bus.js.stream_info(stream)
                break
            await asyncio.sleep(0.1)
        await bus.js.publish(subjects.candidates(run_id, "i0", "poison1"), b"{not a candidate", stream=stream)
    finally:
        await bus.close()
    outcome = await running
    assert outcome.dead_lettered == 1
    # while it ran, the progress line counted it apart, not as in flight
    assert "poison1" in controller.progress.dead_lettered
    assert "poison1" not in controller.progress.in_flight
    assert "dead-lettered=1" in controller.progress.line()
    assert "poison1" not in controller.cancelled
    assert outcome.cancelled == len(controller.cancelled)
    summary = outcome.summary(12.0)
    assert f"1 dead-lettered (kfoundry dlq --run {run_id})" in summary, summary
    (end,) = _of(await _stream(nats_url, run_id), RunEnd)
    assert "poison1" not in end.cancelled  # type: ignore[attr-defined]
