"""An island never publishes one kernel twice: a real island and expert actor on a real
nats-server, with an expert whose proposals keep landing on three kernels (as template mutations
of one parent do: 5-7 distinct in 8 for the level-1 dev tasks). Later requests name the island's
kernels in ``avoid``."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.runtime.bus import Bus
from actors.runtime.kv import put_expert_config
from schemas import (
    Budget,
    Candidate,
    ExpertConfig,
    ExpertKind,
    ExpertRef,
    GenerateReply,
    GenerateRequest,
    KernelLanguage,
    Proposal,
    Role,
    source_fingerprint,
    subjects,
)
from tests.bus.helpers import end_run, register_run

pytestmark = pytest.mark.timeout(90)

KERNELS = 3


def _source(k: int) -> str:
    return f"# kernel {k}\nclass ModelNew: ...\n"


class RepeatingExpert:
    """Answers request ``i`` with kernel ``i % KERNELS``, and keeps the requests."""

    name = "repeating"

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.arrived = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        k = len(self.requests) % KERNELS
        self.requests.append(request)
        self.arrived.set()
        proposal = Proposal(source=_source(k), language=KernelLanguage.TRITON, strategy=f"kernel {k}")
        return GenerateReply(request_id=request.request_id, expert=self.name, proposals=(proposal,))

    async def aclose(self) -> None:
        return None


async def test_an_island_publishes_each_kernel_once_and_tells_its_expert_what_it_has(nats_url: str) -> None:
    run_id = "dup" + uuid.uuid4().hex[:10]
    name = "rep" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    config = ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)
    await put_expert_config(bus, config)
    await register_run(
        bus,
        run_id,
        islands=1,
        inflight_per_island=8,  # more slots than kernels: only duplicates are left to fill them
        experts=(ExpertRef(name=name),),
        budget=Budget(candidates=1000, wall_s=600),
    )
    published: list[Candidate] = []

    async def seen(msg):  # type: ignore[no-untyped-def]
        published.append(Candidate.model_validate_json(msg.data))

    sub = await bus.nc.subscribe(subjects.candidates(run_id, "i0", "*"), cb=seen)
    expert = RepeatingExpert()
    actor = ExpertActor(nats_url=nats_url, config=config, expert=expert, watch_config=False)
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0", retrieve_ttl_s=0.0)
    tasks = [asyncio.create_task(actor.run())]
    try:
        await actor.wait_ready()
        tasks.append(asyncio.create_task(island.run()))
        async with asyncio.timeout(60):
            while len(expert.requests) <= 8:  # the first eight went out together, before any reply
                expert.arrived.clear()
                await expert.arrived.wait()
        await asyncio.sleep(0.2)
    finally:
        await end_run(bus, run_id, [actor], tasks)
        await sub.unsubscribe()
        await bus.close()
    sources = [c.proposal.source for c in published]
    assert sorted(sources) == sorted(_source(k) for k in range(KERNELS)), sources
    assert island.duplicates >= 2
    assert sum(u.duplicates for u in island.brain.credit.usage.values()) == island.duplicates  # for report.json
    everything = {source_fingerprint(_source(k)) for k in range(KERNELS)}
    assert set(expert.requests[-1].avoid) == everything  # the expert is told what the island has
