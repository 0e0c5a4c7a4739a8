"""The diagnoser on a real nats-server: every result comes back to its island as feedback naming
the candidate it judged. The rules alone never read the candidate; a diagnosis that reads it (an LLM
refiner) gets it from the run stream, by a direct get, or through the stream API on a run stream
made without direct gets."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from actors.kinds.diagnoser import Diagnose, DiagnoserActor, RuleDiagnose
from actors.runtime.bus import Bus
from actors.runtime.kv import put_run
from schemas import Candidate, Diagnosis, EvalResult, EvalStatus, Feedback, RunSpec, Task, subjects
from tests.bus.helpers import REFERENCE, candidate, collect, publish_candidates

pytestmark = pytest.mark.timeout(60)

N = 12


class _ReadsSources:
    """A diagnosis that needs each candidate's source (as an LLM refiner does) and notes it."""

    version = "reads-sources"
    needs_candidate = True

    def __init__(self) -> None:
        self.rules = RuleDiagnose()
        self.seen: dict[str, str] = {}

    async def __call__(self, result: EvalResult, candidate: Candidate | None) -> Diagnosis:
        assert candidate is not None
        self.seen[candidate.candidate_id] = candidate.proposal.source
        return await self.rules(result, None)


async def _diagnose_all(bus: Bus, url: str, run: RunSpec, diagnose: Diagnose) -> tuple[DiagnoserActor, list[Feedback]]:
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
    actor = DiagnoserActor(nats_url=url, run_id=run.run_id, diagnose=diagnose)
    task = asyncio.create_task(actor.run())
    try:
        stream = subjects.run_stream(run.run_id)
        feedback = await collect(bus, stream, subjects.feedback(run.run_id), Feedback, want=N, timeout=30)
    finally:
        actor.request_stop("test over")
        await asyncio.wait_for(task, 30)
    return actor, feedback


def _check(run: RunSpec, feedback: list[Feedback]) -> None:
    judged = sorted(f.candidate_id for f in feedback)
    assert judged == sorted(candidate(run, i).candidate_id for i in range(N))
    for fb in feedback:
        i = int(fb.candidate_id.removeprefix("cand"))
        assert fb.candidate is None  # the island has it
        assert fb.result.summary == f"result {i}"
        assert fb.diagnosis.candidate_id == fb.candidate_id


async def test_diagnoser_feeds_back_every_result_naming_its_candidate_without_reading_it(
    nats_url: str, run_id: str
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    try:
        await bus.ensure_shared_streams()
        await bus.ensure_run_stream(run_id)
        run = RunSpec(run_id=run_id, task=Task.from_source("relu", REFERENCE))
        await put_run(bus, run)
        actor, feedback = await _diagnose_all(bus, nats_url, run, RuleDiagnose())
    finally:
        await bus.close()
    _check(run, feedback)
    assert actor.diagnosed == N
    assert actor._reader is not None
    assert actor._reader.reads == 0  # the rules read only the result


@pytest.mark.parametrize("direct", [True, False], ids=["direct-gets", "stream-api"])
async def test_a_diagnosis_that_reads_sources_gets_the_candidate_it_judged(
    nats_url: str, run_id: str, direct: bool
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    try:
        await bus.ensure_shared_streams()
        if direct:
            await bus.ensure_run_stream(run_id)
        else:  # the run stream as a version without direct gets made it
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
        reads = _ReadsSources()
        actor, feedback = await _diagnose_all(bus, nats_url, run, reads)
    finally:
        await bus.close()
    _check(run, feedback)
    assert reads.seen == {candidate(run, i).candidate_id: candidate(run, i).proposal.source for i in range(N)}
    assert actor._reader is not None
    assert actor._reader.direct is direct
