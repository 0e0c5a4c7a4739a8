"""An island never publishes one kernel twice: a real island and expert actor on a real
nats-server, with an expert whose proposals keep landing on three kernels (as template mutations
of one parent do: 5-7 distinct in 8 for the level-1 dev tasks). Later requests name the island's
kernels in ``avoid``."""

from __future__ import annotations

import asyncio

import pytest

from schemas import (
    Budget,
    GenerateReply,
    GenerateRequest,
    KernelLanguage,
    Proposal,
    source_fingerprint,
)
from tests.bus.helpers import island_with_expert

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
    expert = RepeatingExpert()
    async with island_with_expert(
        nats_url,
        expert,
        inflight_per_island=8,  # more slots than kernels: only duplicates are left to fill them
        budget=Budget(candidates=1000, wall_s=600),
    ) as run:
        async with asyncio.timeout(60):
            while len(expert.requests) <= 8:  # the first eight went out together, before any reply
                expert.arrived.clear()
                await expert.arrived.wait()
        await asyncio.sleep(0.2)
    island = run.island
    sources = [c.proposal.source for c in run.published]
    assert sorted(sources) == sorted(_source(k) for k in range(KERNELS)), sources
    assert island.duplicates >= 2
    assert sum(u.duplicates for u in island.brain.credit.usage.values()) == island.duplicates  # for report.json
    everything = {source_fingerprint(_source(k)) for k in range(KERNELS)}
    assert set(expert.requests[-1].avoid) == everything  # the expert is told what the island has
