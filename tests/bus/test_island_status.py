"""An island's statuses on a real nats-server: it says at once when it starts to stagnate (the
migrator acts on that edge), and does not repeat itself on every feedback while it stays stagnant."""

from __future__ import annotations

import asyncio

import pytest

from actors.kinds.island import IslandActor
from actors.runtime.bus import Bus
from schemas import (
    Diagnosis,
    DiagnosisCategory,
    EvalStatus,
    Feedback,
    IslandStatus,
    subjects,
)
from tests.bus.helpers import candidate, collect, register_run, result_for, wait_evaluated

pytestmark = pytest.mark.timeout(60)

N = 45
"""Feedbacks sent: the island stagnates after 20 (its window) without a clean result."""


async def test_island_says_when_it_starts_to_stagnate_and_not_on_every_feedback_after(
    nats_url: str, run_id: str
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    # No expert serves this run's experts: the island asks, gets no reply and backs off.
    run = await register_run(bus, run_id, islands=1)
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0", status_every_s=3600.0)
    task = asyncio.create_task(island.run())
    try:
        await asyncio.wait_for(island.wait_ready(), 30)
        for i in range(N):
            cand = candidate(run, i)
            result = result_for(cand, EvalStatus.COMPILE_ERROR, "does not compile")
            diagnosis = Diagnosis(
                candidate_id=cand.candidate_id, category=DiagnosisCategory.COMPILE_SYNTAX, summary="does not compile"
            )
            feedback = Feedback(run_id=run_id, island="i0", candidate=cand, result=result, diagnosis=diagnosis)
            await bus.publish_durable(subjects.feedback(run_id, "i0"), feedback, msg_id=f"feedback-{i}")
        await wait_evaluated(island, N)
        stream = subjects.run_stream(run_id)
        statuses: list[IslandStatus] = await collect(
            bus, stream, subjects.island_status(run_id, "i0"), IslandStatus, want=2, timeout=10
        )
    finally:
        island.request_stop("test over")
        await asyncio.wait_for(task, 30)
        await bus.close()
    assert not statuses[0].stagnating  # the announcement at start
    stagnant = [s for s in statuses if s.stagnating]
    assert stagnant, "the island never said it stagnates"
    # At once: on the feedback that made it stagnant (the 20th), or on one of the few handled
    # beside it (the island handles many feedbacks at a time; each waits for its experience batch).
    assert 20 <= stagnant[0].evaluated <= 28, [s.evaluated for s in statuses]
    # Still stagnant for 25 more feedbacks: nothing more to say (status_every_s is an hour).
    assert len(stagnant) == 1, [s.evaluated for s in statuses]
