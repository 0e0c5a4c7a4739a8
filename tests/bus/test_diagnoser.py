"""The diagnoser on a real nats-server: every result comes back to its island as feedback carrying
the candidate it judged, read from the run stream (by a direct get, or through the stream API on a
run stream made without direct gets)."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from actors.bus import Bus
from actors.diagnoser import DiagnoserActor, RuleDiagnose
from actors.kv import put_run
from schemas import EvalResult, EvalStatus, Feedback, RunSpec, Task, subjects
from tests.bus.helpers import REFERENCE, candidate, collect, publish_candidates

pytestmark = pytest.mark.timeout(60)

N = 12


async def _diagnose_all(bus: Bus, url: str, run: RunSpec) -> tuple[DiagnoserActor, list[Feedback]]:
    await publish_candidates(bus, run, range(N))
    for i in range(N):
        cand = candidate(run, i)
        result = EvalResult(
            run_id=run.run_id,
            candidate_id=cand.candidate_id,
            island=cand.island,
            task_id=cand.task_id,
            status=EvalStatus.COMPILE_ERROR if i % 2 else EvalStatus.CORRECT,
            summary=f"result {i}",
        )
        await bus.publish_durable(subjects.results(run.run_id, cand.island), result, msg_id=f"result-{i}")
    actor = DiagnoserActor(nats_url=url, run_id=run.run_id, diagnose=RuleDiagnose())
    task = asyncio.create_task(actor.run())
    try:
        stream = subjects.run_stream(run.run_id)
        feedback = await collect(bus, stream, subjects.feedback(run.run_id), Feedback, want=N, timeout=30)
    finally:
        actor.request_stop("test over")
        await asyncio.wait_for(task, 30)
    return actor, feedback


def _check(run: RunSpec, feedback: list[Feedback]) -> None:
    judged = sorted(f.candidate.candidate_id for f in feedback)
    assert judged == sorted(candidate(run, i).candidate_id for i in range(N))
    for fb in feedback:
        i = int(fb.candidate.candidate_id.removeprefix("cand"))
        assert fb.candidate.proposal == candidate(run, i).proposal  # the very candidate that was judged
        assert fb.result.summary == f"result {i}"
        assert fb.diagnosis.candidate_id == fb.candidate.candidate_id


async def test_diagnoser_feeds_back_every_result_with_the_candidate_it_judged(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    try:
        await bus.ensure_shared_streams()
        await bus.ensure_run_stream(run_id)
        run = RunSpec(run_id=run_id, task=Task.from_source("relu", REFERENCE))
        await put_run(bus, run)
        actor, feedback = await _diagnose_all(bus, nats_url, run)
    finally:
        await bus.close()
    _check(run, feedback)
    assert actor._direct  # the run stream answers direct gets
    assert actor.diagnosed == N


async def test_diagnoser_reads_candidates_from_a_run_stream_without_direct_gets(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    try:
        await bus.ensure_shared_streams()
        # The run stream as a version without direct gets made it.
        await bus.js.add_stream(
            StreamConfig(
                name=subjects.run_stream(run_id),
                subjects=[subjects.run_all(run_id)],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=15 * 60,
            )
        )
        run = RunSpec(run_id=run_id, task=Task.from_source("relu", REFERENCE))
        await put_run(bus, run)
        actor, feedback = await _diagnose_all(bus, nats_url, run)
    finally:
        await bus.close()
    _check(run, feedback)
    assert not actor._direct
    assert actor.diagnosed == N
