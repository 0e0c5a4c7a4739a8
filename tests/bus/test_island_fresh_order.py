"""An island publishes its fresh starts in the order of their starting points (an expert lists
them best first, and the evaluator takes candidates as they arrive), though the replies come back
in another order: a real island and expert actor on a real nats-server, with an expert that
answers the first starting point last."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.kinds.island_requests import FRESH_ORDER_WAIT_S
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
    subjects,
)
from tests.bus.helpers import end_run, register_run

pytestmark = pytest.mark.timeout(90)

FRESH = 4


class LateFirstExpert:
    """Answers a fresh start with a kernel named by its starting point, the first one ``delay``
    seconds after the others."""

    name = "late-first"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.answered: list[int] = []

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        if request.start == 0:
            await asyncio.sleep(self.delay)
        self.answered.append(request.start)
        source = f"# start {request.start} seed {request.seed}\nclass ModelNew: ...\n"
        proposal = Proposal(source=source, language=KernelLanguage.TRITON, strategy=f"start {request.start}")
        return GenerateReply(request_id=request.request_id, expert=self.name, proposals=(proposal,))

    async def aclose(self) -> None:
        return None


async def _published_order(nats_url: str, delay: float) -> tuple[list[str], list[int]]:
    run_id = "ord" + uuid.uuid4().hex[:10]
    name = "late" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    config = ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)
    await put_expert_config(bus, config)
    await register_run(
        bus,
        run_id,
        islands=1,
        inflight_per_island=FRESH,
        experts=(ExpertRef(name=name),),
        budget=Budget(candidates=FRESH, wall_s=600),
    )
    published: list[str] = []
    all_in = asyncio.Event()

    async def seen(msg):  # type: ignore[no-untyped-def]
        published.append(Candidate.model_validate_json(msg.data).proposal.strategy)
        if len(published) == FRESH:
            all_in.set()

    sub = await bus.nc.subscribe(subjects.candidates(run_id, "i0", "*"), cb=seen)
    expert = LateFirstExpert(delay)
    actor = ExpertActor(nats_url=nats_url, config=config, expert=expert, watch_config=False)
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0", retrieve_ttl_s=0.0)
    tasks = [asyncio.create_task(actor.run())]
    try:
        await actor.wait_ready()
        tasks.append(asyncio.create_task(island.run()))
        async with asyncio.timeout(30):
            await all_in.wait()
    finally:
        await end_run(bus, run_id, [actor], tasks)
        await sub.unsubscribe()
        await bus.close()
    return published, expert.answered


async def test_fresh_starts_are_published_in_the_order_of_their_starting_points(nats_url: str) -> None:
    published, answered = await _published_order(nats_url, delay=0.4)
    assert answered[-1] == 0  # the expert answered the first starting point last
    assert published == [f"start {i}" for i in range(FRESH)]


async def test_a_slow_first_start_holds_the_others_back_no_longer_than_the_wait(nats_url: str) -> None:
    published, _ = await _published_order(nats_url, delay=FRESH_ORDER_WAIT_S + 1.5)
    assert published[-1] == "start 0"
    assert sorted(published[:-1]) == [f"start {i}" for i in range(1, FRESH)]
