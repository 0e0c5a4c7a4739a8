"""An island publishes its fresh starts in the order of their starting points (an expert lists
them best first, and the evaluator takes candidates as they arrive), though the replies come back
in another order: a real island and expert actor on a real nats-server, with an expert that
answers the first starting point last."""

from __future__ import annotations

import asyncio

import pytest

from actors.kinds.island_requests import FRESH_ORDER_WAIT_S
from schemas import Budget, GenerateReply, GenerateRequest, KernelLanguage, Proposal
from tests.bus.helpers import island_with_expert

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
    expert = LateFirstExpert(delay)
    budget = Budget(candidates=FRESH, wall_s=600)
    async with island_with_expert(nats_url, expert, inflight_per_island=FRESH, budget=budget) as run:
        await run.wait_published(FRESH)
    return [c.proposal.strategy for c in run.published], expert.answered


async def test_fresh_starts_are_published_in_the_order_of_their_starting_points(nats_url: str) -> None:
    published, answered = await _published_order(nats_url, delay=0.4)
    assert answered[-1] == 0  # the expert answered the first starting point last
    assert published == [f"start {i}" for i in range(FRESH)]


@pytest.mark.slow  # ~3 s on a 2-core host: waits out the first start; the order above stays
async def test_a_slow_first_start_holds_the_others_back_no_longer_than_the_wait(nats_url: str) -> None:
    published, _ = await _published_order(nats_url, delay=FRESH_ORDER_WAIT_S + 1.5)
    assert published[-1] == "start 0"
    assert sorted(published[:-1]) == [f"start {i}" for i in range(1, FRESH)]
