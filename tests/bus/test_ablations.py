"""Ablation switches really turn their mechanism off: real island, expert, evaluator and migrator
actors on a real nats-server, each run beside a control run with the mechanism on."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from actors.evolution.brain import IslandBrain
from actors.evolution.credit import ExpertProfile
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.kinds.migrator import MigratorActor
from actors.runtime.bus import Bus
from actors.runtime.kv import put_expert_config
from schemas import (
    Ablations,
    Budget,
    EliteAnnouncement,
    ExpertConfig,
    ExpertKind,
    ExpertRef,
    GenerateReply,
    GenerateRequest,
    IslandStatus,
    MigrationPolicy,
    Role,
    subjects,
)
from tests.bus.helpers import end_run, register_run
from tests.bus.scripted import ScriptedExpert
from tests.evolution import factories as f
from tests.evolution.landscape import Landscape


class RecordingExpert(ScriptedExpert):
    """A scripted expert that keeps every request it answered."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.requests: list[GenerateRequest] = []
        self.arrived = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        self.requests.append(request)
        self.arrived.set()
        return await super().generate(request)


@contextlib.asynccontextmanager
async def _island_run(
    nats_url: str, ablations: Ablations, *, llm: bool = False
) -> AsyncIterator[tuple[Bus, RecordingExpert, list[bytes]]]:
    """A one-island run with a recording expert (configured as an LLM expert when ``llm``); yields
    the bus, the expert and the experience queries seen on the bus while it runs."""
    run_id = "ab" + uuid.uuid4().hex[:10]
    name = "rec" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    config = (
        ExpertConfig(name=name, kind=ExpertKind.LLM, role=Role.FUSION, base_url="http://127.0.0.1:9/v1", model="m")
        if llm
        else ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)
    )
    await put_expert_config(bus, config)
    await register_run(
        bus,
        run_id,
        islands=1,
        inflight_per_island=4,  # no diagnoser here, so no feedback frees a slot: four requests at most
        experts=(ExpertRef(name=name),),
        budget=Budget(candidates=1000, wall_s=600),
        eval_timeout_s=5.0,
        ablations=ablations,
    )
    queries: list[bytes] = []

    async def seen(msg):  # type: ignore[no-untyped-def]
        queries.append(msg.data)

    sub = await bus.nc.subscribe(subjects.EXPERIENCE_QUERY, cb=seen)
    recorder = RecordingExpert(name)
    expert = ExpertActor(nats_url=nats_url, config=config, expert=recorder, watch_config=False)
    evaluator = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=NoopRunner(0.01), concurrency=2)
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0", retrieve_ttl_s=0.0)
    tasks = [asyncio.create_task(a.run()) for a in (expert, evaluator)]
    try:
        await asyncio.gather(expert.wait_ready(), evaluator.wait_ready())
        tasks.append(asyncio.create_task(island.run()))
        yield bus, recorder, queries
    finally:
        await end_run(bus, run_id, [expert], tasks)
        await sub.unsubscribe()
        await bus.close()


async def _wait_for_requests(expert: RecordingExpert, n: int) -> None:
    async with asyncio.timeout(30):
        while len(expert.requests) < n:
            expert.arrived.clear()
            await expert.arrived.wait()


@pytest.mark.slow  # ~5 s on a 2-core host; the default run keeps the no-migration run below
@pytest.mark.timeout(90)
async def test_no_experience_run_sends_no_retrieval_request_on_the_bus(nats_url: str) -> None:
    async with _island_run(nats_url, Ablations()) as (_, control, control_queries):
        await _wait_for_requests(control, 2)
    assert control_queries, "the control run's island never asked the experience library"
    async with _island_run(nats_url, Ablations(no_experience=True)) as (_, ablated, queries):
        await _wait_for_requests(ablated, 4)
    assert queries == []
    assert all(r.experiences == () for r in ablated.requests)


@pytest.mark.slow  # a whole run with LLM experts: ~10 s; CI runs it in the slow suite
@pytest.mark.timeout(90)
async def test_no_meta_prompt_run_gives_llm_experts_no_evolved_section(nats_url: str) -> None:
    async with _island_run(nats_url, Ablations(), llm=True) as (_, control, _q):
        await _wait_for_requests(control, 2)
    assert all(r.meta_prompt for r in control.requests[:2]), "the control run's LLM expert got no meta-prompt"
    async with _island_run(nats_url, Ablations(no_meta_prompt=True), llm=True) as (_, ablated, _q):
        await _wait_for_requests(ablated, 3)
    assert [r.meta_prompt for r in ablated.requests] == [""] * len(ablated.requests)


async def _migrator_run(
    nats_url: str, ablations: Ablations, sent: list[bytes], stop: asyncio.Event, arrived: asyncio.Event
) -> None:
    """A migrator between two announced islands, i0 holding an elite, until ``stop``; every
    migration it publishes lands in ``sent``."""
    run_id = "mg" + uuid.uuid4().hex[:10]
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    await register_run(
        bus, run_id, islands=2, migration=MigrationPolicy(interval_s=0.2, on_stagnation=False), ablations=ablations
    )

    async def seen(msg):  # type: ignore[no-untyped-def]
        sent.append(msg.data)
        arrived.set()

    sub = await bus.nc.subscribe(subjects.migrants(run_id, "*"), cb=seen)
    migrator = MigratorActor(nats_url=nats_url, run_id=run_id, tick_s=0.05)
    task = asyncio.create_task(migrator.run())
    try:
        await migrator.wait_ready()
        brain = IslandBrain("i0", f.spec(islands=2), [ExpertProfile(name="template", role=Role.TEMPLATE)], seed=0)
        elite = brain.on_feedback(Landscape(0, fail=0.0).evaluate(brain, brain.next_request())).elite
        assert elite is not None
        ann = EliteAnnouncement(run_id=run_id, elite=elite, island_best=True)
        await bus.publish_durable(subjects.elites(run_id, "i0"), ann, msg_id=f"elite-{run_id}")
        for island in ("i0", "i1"):
            status = IslandStatus(run_id=run_id, island=island, evaluated=1, in_flight=0, archive_size=1)
            await bus.publish_durable(subjects.island_status(run_id, island), status, msg_id=f"st-{run_id}-{island}")
        await stop.wait()
    finally:
        migrator.request_stop("test over")
        await asyncio.gather(task, return_exceptions=True)
        await sub.unsubscribe()
        await bus.close()


@pytest.mark.timeout(90)
async def test_no_migration_run_moves_no_elite_between_islands(nats_url: str) -> None:
    stop = asyncio.Event()
    control: list[bytes] = []
    ablated: list[bytes] = []
    first, never = asyncio.Event(), asyncio.Event()
    runs = [
        asyncio.create_task(_migrator_run(nats_url, Ablations(), control, stop, first)),
        asyncio.create_task(_migrator_run(nats_url, Ablations(no_migration=True), ablated, stop, never)),
    ]
    try:
        async with asyncio.timeout(30):
            await first.wait()
        await asyncio.sleep(1.0)  # many more ticks of the ablated run's migrator
    finally:
        stop.set()
        await asyncio.gather(*runs)
    assert control, "the control run's migrator sent nothing"
    assert ablated == []
