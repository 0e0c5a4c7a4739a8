"""An island on a real nats-server takes feedback that only names its candidate: a candidate it did
not publish itself (a seed, or one of an earlier incarnation of the island) is read back from the
run stream, so its archive holds the very source that was judged."""

from __future__ import annotations

import asyncio

import pytest

from actors.kinds.island import IslandActor
from actors.runtime.bus import Bus
from schemas import Diagnosis, DiagnosisCategory, EvalStatus, Feedback, subjects
from tests.bus.helpers import candidate, publish_candidates, register_run, result_for, wait_evaluated
from tests.evolution.factories import timing

pytestmark = pytest.mark.timeout(60)

N = 6


async def test_island_reads_back_the_candidates_it_does_not_have(nats_url: str, run_id: str) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    run = await register_run(bus, run_id, islands=1)
    # Published by someone else (as the controller publishes seeds): this island never had them.
    await publish_candidates(bus, run, range(N))
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0")
    task = asyncio.create_task(island.run())
    try:
        await asyncio.wait_for(island.wait_ready(), 30)
        for i in range(N):
            cand = candidate(run, i)
            result = result_for(
                cand,
                EvalStatus.CORRECT,
                "correct",
                speedup_vs_eager=1.0 + i / 10,
                timing=timing(1.0 / (1.0 + i / 10)),
            )
            diagnosis = Diagnosis(candidate_id=cand.candidate_id, category=DiagnosisCategory.AT_SOL, summary="ok")
            feedback = Feedback(run_id=run_id, island="i0", result=result, diagnosis=diagnosis)
            await bus.publish_durable(subjects.feedback(run_id, "i0"), feedback, msg_id=f"feedback-{i}")
        await wait_evaluated(island, N)
        assert island._reader is not None
        reads = island._reader.reads
        best = island.brain.archive.best()
    finally:
        island.request_stop("test over")
        await asyncio.wait_for(task, 30)
        await bus.close()
    assert reads == N
    assert best is not None
    fittest = candidate(run, N - 1)
    assert best.candidate.candidate_id == fittest.candidate_id
    assert best.candidate.proposal == fittest.proposal  # as published: source and all
