"""A stop requested while an actor is still setting up ends it at once (its setup cancelled, its
teardown run), instead of after the setup: a run whose budget ends while its evaluator is starting
(fork servers, the reference, CUDA) must not wait for the start."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.runtime.base import Actor
from schemas import ActorKind, ActorState

pytestmark = pytest.mark.timeout(60)


class SlowSetup(Actor):
    kind = ActorKind.DIAGNOSER

    def __init__(self, nats_url: str, setup_s: float, fail: bool = False) -> None:
        super().__init__(nats_url=nats_url, run_id=None)
        self.setup_s, self.fail = setup_s, fail
        self.setting_up = asyncio.Event()
        self.setup_cancelled = False
        self.torn_down = False

    async def setup(self) -> None:
        self.setting_up.set()
        try:
            await asyncio.sleep(self.setup_s)
        except asyncio.CancelledError:
            self.setup_cancelled = True
            raise
        if self.fail:
            raise RuntimeError("setup failed")

    async def teardown(self) -> None:
        self.torn_down = True


async def test_a_stop_during_setup_cancels_it_and_tears_down(nats_url: str) -> None:
    actor = SlowSetup(nats_url, setup_s=30.0)
    task = asyncio.create_task(actor.run())
    await asyncio.wait_for(actor.setting_up.wait(), 20)
    asked = time.monotonic()
    actor.request_stop("run ended (wall_time)")
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - asked < 5.0
    assert actor.setup_cancelled
    assert actor.torn_down
    assert actor.state is ActorState.STOPPED


async def test_a_setup_that_finishes_first_runs_the_actor_and_a_failed_one_still_raises(nats_url: str) -> None:
    actor = SlowSetup(nats_url, setup_s=0.05)
    task = asyncio.create_task(actor.run())
    await asyncio.wait_for(actor._ready.wait(), 20)
    assert actor.state is ActorState.RUNNING
    actor.request_stop("done")
    await asyncio.wait_for(task, 10)
    assert not actor.setup_cancelled
    failing = SlowSetup(nats_url, setup_s=0.05, fail=True)
    with pytest.raises(RuntimeError, match="setup failed"):
        await asyncio.wait_for(failing.run(), 20)
    assert failing.torn_down
