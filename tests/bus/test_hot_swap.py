"""Hot swap of a diagnoser under continuous load: start v2, drain v1; nothing lost or doubled."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from actors.bus import Bus
from schemas import (
    ActorInfo,
    Control,
    ControlAction,
    EvalResult,
    EvalStatus,
    Feedback,
    subjects,
)
from tests.bus.helpers import candidate, collect, register_run, spawn_actor, stop_process, wait_up

TOTAL = 300


async def test_diagnoser_hot_swap_under_load_loses_and_doubles_nothing(
    nats_url: str, run_id: str, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_url, name="test", actor_id="test-swap")
    run = await register_run(bus, run_id)
    common = ["--nats", nats_url, "--run", run_id]
    v1 = spawn_actor("diagnoser", "--id", "diag-v1", "--version", "1.0.0", *common, log=tmp_path / "v1.log")
    v2 = None
    try:
        await wait_up(bus, "diag-v1")

        async def produce() -> None:
            for i in range(TOTAL):
                cand = candidate(run, i)
                await bus.publish_durable(
                    subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id
                )
                result = EvalResult(
                    run_id=run_id,
                    candidate_id=cand.candidate_id,
                    island="i0",
                    task_id=cand.task_id,
                    status=EvalStatus.COMPILE_ERROR,
                    summary="compile error",
                    compile_log="SyntaxError: invalid syntax (line 3)",
                )
                await bus.publish_durable(subjects.results(run_id, "i0"), result, msg_id=f"result-{cand.candidate_id}")
                await asyncio.sleep(0.01)  # continuous load: about 100 results per second

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.8)
        v2 = spawn_actor("diagnoser", "--id", "diag-v2", "--version", "2.0.0", *common, log=tmp_path / "v2.log")
        await wait_up(bus, "diag-v2")
        drained = await bus.request(
            subjects.control("diag-v1"), Control(action=ControlAction.DRAIN, reason="swap"), ActorInfo, timeout=5
        )
        assert drained.version == "1.0.0"
        assert await asyncio.to_thread(v1.wait, 30) == 0  # v1 left cleanly while the load went on
        await producer
        feedback = await collect(
            bus, subjects.run_stream(run_id), subjects.feedback(run_id), Feedback, want=TOTAL, timeout=60
        )
    finally:
        if v2 is not None:
            assert stop_process(v2) == 0
        stop_process(v1)
        await bus.close()
    counts = Counter(f.candidate.candidate_id for f in feedback)
    assert len(counts) == TOTAL, f"lost {TOTAL - len(counts)}"
    assert max(counts.values()) == 1, f"doubled: {[c for c, n in counts.items() if n > 1]}"
    by = Counter(f.diagnosis.diagnoser.split("/")[0] for f in feedback)
    assert by["diag-v1"] > 0
    assert by["diag-v2"] > 0
    assert by["diag-v1"] + by["diag-v2"] == TOTAL
    assert all(f.diagnosis.category.family == "compile" for f in feedback)
