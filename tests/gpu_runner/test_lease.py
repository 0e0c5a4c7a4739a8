"""The GPU gate: timing alone, spares' GPU work together, timing first when both wait; and a
worker's lease, given back at each release or kept across its requests."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import cast

import pytest

from gpu_runner.frames import JudgeOp, OpFrame, Report
from gpu_runner.judge import Judge
from gpu_runner.lease import ARM_PATIENCE_S, UNRANKED, CompileLine, GpuGate, GpuLease, TurnLock
from gpu_runner.referee import Referee
from gpu_runner.sandbox import Worker


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _timing(gate: GpuGate) -> None:
    """How a candidate reaches its timing: the candidate lease, then the upgrade."""
    await gate.acquire_candidate()
    await gate.upgrade()


async def test_shared_holders_run_together_and_keep_timing_out() -> None:
    gate = GpuGate()
    await gate.acquire_shared()
    await gate.acquire_shared()
    assert gate.shared_holders == 2
    timing = asyncio.create_task(_timing(gate))
    await _settle()
    assert not timing.done()  # spares already on the GPU finish first
    late = asyncio.create_task(gate.acquire_shared())
    await _settle()
    assert not late.done()  # a waiting timing stops new shared grants
    await gate.release(exclusive=False)
    await _settle()
    assert not timing.done()
    await gate.release(exclusive=False)
    await _settle()
    assert timing.done()
    assert not late.done()  # nothing shares the GPU with a timing
    await gate.release(exclusive=True)
    await _settle()
    assert late.done()
    assert (gate.shared_holders, gate.exclusive_holders) == (1, 0)


async def test_exclusive_holders_are_bounded() -> None:
    gate = GpuGate(max_exclusive=1)
    order: list[str] = []

    async def run(name: str) -> None:
        await _timing(gate)
        order.append(f"{name}+")
        await asyncio.sleep(0.01)
        order.append(f"{name}-")
        await gate.release(exclusive=True)

    await asyncio.gather(run("a"), run("b"))
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


async def test_a_cancelled_timing_wait_lets_shared_work_in() -> None:
    gate = GpuGate()
    await gate.acquire_shared()
    timing = asyncio.create_task(_timing(gate))
    await _settle()
    late = asyncio.create_task(gate.acquire_shared())
    await _settle()
    assert not late.done()
    timing.cancel()
    await _settle()
    assert late.done()
    assert gate.exclusive_waiting == 0


async def test_spares_waiting_when_a_timing_ends_go_before_the_next_timing() -> None:
    """Phase-fair: a queue of timings does not starve the spares the candidates after it need."""
    gate = GpuGate()
    await _timing(gate)  # candidate A times
    b = asyncio.create_task(_timing(gate))  # candidate B is armed and waits
    s1, s2 = asyncio.create_task(gate.acquire_shared()), asyncio.create_task(gate.acquire_shared())
    await _settle()
    assert not b.done()
    assert not s1.done()
    assert not s2.done()
    await gate.release(exclusive=True)
    await _settle()
    assert s1.done()
    assert s2.done()
    assert not b.done()
    late = asyncio.create_task(gate.acquire_shared())  # arrived after: B goes first
    await gate.release(exclusive=False)
    await gate.release(exclusive=False)
    await _settle()
    assert b.done()
    assert not late.done()
    await gate.release(exclusive=True)
    await _settle()
    assert late.done()


async def test_a_cancelled_spare_does_not_hold_up_the_next_timing() -> None:
    gate = GpuGate()
    await _timing(gate)
    b = asyncio.create_task(_timing(gate))
    s = asyncio.create_task(gate.acquire_shared())
    await _settle()
    s.cancel()  # cancelled before its turn could start: it never holds the GPU
    await _settle()
    await gate.release(exclusive=True)
    await _settle()
    assert b.done()
    await gate.release(exclusive=True)
    s2 = asyncio.create_task(_timing(gate))
    await _settle()
    assert s2.done()


async def test_a_spare_cancelled_during_its_turn_ends_the_turn() -> None:
    gate = GpuGate(max_exclusive=3)
    for _ in range(3):
        await gate.acquire_candidate()
    await gate.upgrade()
    await gate.upgrade()
    s = asyncio.create_task(gate.acquire_shared())
    await _settle()
    await gate.release(exclusive=True)  # the turn is S's, but the other timing still holds the GPU
    up = asyncio.create_task(gate.upgrade())
    await _settle()
    assert not up.done()  # the third candidate's timing waits for S's turn
    assert not s.done()
    s.cancel()
    await _settle()
    assert up.done()
    assert gate.exclusive_holders == 2


async def test_spares_work_beside_a_candidates_trials_but_never_beside_its_timing() -> None:
    gate = GpuGate()
    await gate.acquire_candidate()  # candidate A's trials
    await gate.acquire_shared()  # a spare beside them
    other = asyncio.create_task(gate.acquire_candidate())  # one candidate alive at a time
    await _settle()
    assert not other.done()
    timing = asyncio.create_task(gate.upgrade())
    await _settle()
    assert not timing.done()  # the spare finishes first
    late = asyncio.create_task(gate.acquire_shared())
    await _settle()
    assert not late.done()  # a waiting timing stops new shared grants
    await gate.release(exclusive=False)
    await _settle()
    assert timing.done()
    assert (gate.exclusive_holders, gate.candidate_holders) == (1, 0)
    assert not late.done()
    assert not other.done()
    await gate.release(exclusive=True)
    await _settle()
    assert late.done()  # the spare waiting when the timing ended goes first
    assert other.done()  # and the next candidate's trials may run beside it
    assert gate.usage()["candidate"] > 0


async def test_a_candidate_that_fails_its_trials_gives_back_its_candidate_lease() -> None:
    gate = GpuGate()
    await gate.acquire_candidate()
    nxt = asyncio.create_task(gate.acquire_candidate())
    await _settle()
    assert not nxt.done()
    await gate.release(exclusive=False, candidate=True)
    await _settle()
    assert nxt.done()
    assert gate.candidate_holders == 1


async def test_candidates_waiting_together_get_the_gpu_by_rank_then_arrival() -> None:
    gate = GpuGate(max_exclusive=1)
    await gate.acquire_candidate((0.0, 0))  # the GPU is busy with another candidate's trials
    order: list[tuple[float, int]] = []

    async def run(turn: tuple[float, int]) -> None:
        await gate.acquire_candidate(turn)
        order.append(turn)
        await gate.release(exclusive=False, candidate=True)

    turns = [(UNRANKED, 1), (5.0, 2), (1.0, 4), (5.0, 3), (0.0, 5)]
    tasks = [asyncio.create_task(run(t)) for t in turns]  # they arrive in this order
    await _settle()
    assert order == []
    await gate.release(exclusive=False, candidate=True)
    await asyncio.gather(*tasks)
    assert order == sorted(turns) == [(0.0, 5), (1.0, 4), (5.0, 2), (5.0, 3), (UNRANKED, 1)]


async def test_an_armed_candidate_waits_a_little_for_a_better_ranked_one_still_arming() -> None:
    gate = GpuGate(max_exclusive=1)
    await gate.expect((0.0, 0))  # holds a spare, still arming
    late = asyncio.create_task(gate.acquire_candidate((3.0, 1)))
    await asyncio.sleep(ARM_PATIENCE_S / 4)
    assert not late.done()  # the GPU is free, but the first starting point is on its way
    await gate.acquire_candidate((0.0, 0))  # armed now: it goes first
    await asyncio.sleep(0)
    assert not late.done()
    await gate.release(exclusive=False, candidate=True)
    await late
    await gate.release(exclusive=False, candidate=True)

    # one that never arms (it failed, or is slow) holds the others up no longer than the patience
    await gate.expect((0.0, 2))
    started = asyncio.get_running_loop().time()
    await gate.acquire_candidate((3.0, 3))
    assert asyncio.get_running_loop().time() - started >= ARM_PATIENCE_S * 0.9
    await gate.release(exclusive=False, candidate=True)
    await gate.forget((0.0, 2))  # the run stage's end, whatever happened
    # forgotten (its evaluation ended before it asked): nobody waits for it
    await gate.expect((0.0, 4))
    await gate.forget((0.0, 4))
    await asyncio.wait_for(gate.acquire_candidate((3.0, 5)), ARM_PATIENCE_S / 4)
    await gate.release(exclusive=False, candidate=True)


async def test_a_compiled_candidate_lines_up_after_better_ranked_ones_still_compiling() -> None:
    line = CompileLine()
    order: list[tuple[float, int]] = []
    compiled = {turn: asyncio.Event() for turn in [(0.0, 1), (1.0, 2), (5.0, 0)]}

    async def evaluate(turn: tuple[float, int]) -> None:
        line.enter(turn)
        await compiled[turn].wait()
        await line.wait_turn(turn, 30.0)
        order.append(turn)

    tasks = [asyncio.create_task(evaluate(t)) for t in compiled]
    await _settle()
    compiled[(5.0, 0)].set()  # the mutation's kernels compile first
    await _settle()
    assert order == []  # the first starting points are still compiling
    compiled[(1.0, 2)].set()
    await _settle()
    assert order == []
    compiled[(0.0, 1)].set()
    await asyncio.gather(*tasks)
    assert order == [(0.0, 1), (1.0, 2), (5.0, 0)]
    assert line.ahead((UNRANKED, 9)) == 0  # everyone left


async def test_the_compile_line_waits_no_longer_than_its_patience_and_not_for_one_that_left() -> None:
    line = CompileLine()
    line.enter((0.0, 0))  # a compile that never ends
    line.enter((2.0, 1))
    started = asyncio.get_running_loop().time()
    waited = await line.wait_turn((2.0, 1), 0.2)
    assert 0.18 <= waited < 5.0
    assert asyncio.get_running_loop().time() - started >= 0.18
    assert line.ahead((2.0, 1)) == 1  # it left; the other is still here
    await line.leave((0.0, 0))  # its evaluation ended (an error, a rejection)
    await line.leave((0.0, 0))  # twice is harmless
    line.enter((3.0, 2))
    assert await asyncio.wait_for(line.wait_turn((3.0, 2), 30.0), 1.0) < 1.0
    # patience 0: nobody waits
    line.enter((0.0, 3))
    line.enter((4.0, 4))
    assert await asyncio.wait_for(line.wait_turn((4.0, 4), 0.0), 1.0) < 1.0


async def test_the_turn_lock_goes_by_turn_also_to_waiters_woken_together() -> None:
    lock = TurnLock()
    plan_ready = asyncio.Event()  # as at a run's start: every evaluation waits for the task's plan
    order: list[tuple[float, int]] = []

    async def evaluate(turn: tuple[float, int]) -> None:
        await plan_ready.wait()
        async with lock.hold(turn):
            order.append(turn)
            await asyncio.sleep(0.01)

    turns = [(6.0, 1), (UNRANKED, 2), (2.0, 3), (0.0, 4)]  # woken in this order
    tasks = [asyncio.create_task(evaluate(t)) for t in turns]
    await _settle()
    plan_ready.set()
    await asyncio.gather(*tasks)
    assert order == [(0.0, 4), (2.0, 3), (6.0, 1), (UNRANKED, 2)]


async def test_a_cancelled_waiter_of_the_turn_lock_does_not_hold_up_the_others() -> None:
    lock = TurnLock()
    await lock.acquire((5.0, 0))
    first = asyncio.create_task(lock.acquire((0.0, 1)))
    second = asyncio.create_task(lock.acquire((1.0, 2)))
    await _settle()
    first.cancel()
    await asyncio.wait([first])
    await lock.release()
    await asyncio.wait_for(second, 1.0)
    assert lock.held


async def test_a_turn_lock_of_capacity_two_lets_two_in_by_turn() -> None:
    lock = TurnLock(2)
    inside: list[tuple[float, int]] = []
    release = asyncio.Event()
    most = 0

    async def evaluate(turn: tuple[float, int]) -> None:
        nonlocal most
        async with lock.hold(turn):
            inside.append(turn)
            most = max(most, lock.holders)
            await release.wait()

    turns = [(7.0, 0), (3.0, 1), (0.0, 2), (5.0, 3), (1.0, 4)]
    tasks = [asyncio.create_task(evaluate(t)) for t in turns]
    await _settle()
    assert inside == [(0.0, 2), (1.0, 4)]  # the two best-ranked, though they came third and last
    release.set()
    await asyncio.gather(*tasks)
    assert inside[2:] == [(3.0, 1), (5.0, 3), (7.0, 0)]
    assert most == 2
    assert lock.holders == 0
    with pytest.raises(ValueError, match="at least one"):
        TurnLock(0)


async def test_a_cancelled_upgrade_lets_spares_in_again() -> None:
    gate = GpuGate()
    await gate.acquire_candidate()
    await gate.acquire_shared()
    up = asyncio.create_task(gate.upgrade())
    await _settle()
    late = asyncio.create_task(gate.acquire_shared())
    await _settle()
    assert not late.done()
    up.cancel()  # the candidate's timeout
    await _settle()
    assert late.done()
    assert gate.candidate_holders == 1
    assert gate.exclusive_waiting == 0


class _Peer:
    """The worker's end of a lease: the frames the parent sends it, in order."""

    pid = 0

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, header: OpFrame) -> None:
        self.sent.append(str(header["op"]))


async def test_a_kept_lease_serves_the_workers_next_request_ahead_of_a_waiting_timing() -> None:
    """The judge's trials of one candidate: it asked the gate again before each one, and a trial
    could wait behind another candidate's whole timing."""
    gate = GpuGate()
    peer = _Peer()
    lease = GpuLease(gate, peer, keep=True)
    assert await lease.handle(Report.GPU_ACQUIRE)  # trial 1
    assert await lease.handle(Report.GPU_RELEASE)
    assert (lease.held, lease.parked) == (True, True)
    assert gate.shared_holders == 1  # kept: still counted on the gate
    timing = asyncio.create_task(_timing(gate))  # another candidate's timing waits meanwhile
    await _settle()
    assert not timing.done()
    granted = asyncio.create_task(lease.handle(Report.GPU_ACQUIRE))  # trial 2: no wait
    await _settle()
    assert granted.done()
    assert peer.sent == ["gpu_granted", "gpu_granted"]
    assert not timing.done()
    assert await lease.handle(Report.GPU_RELEASE)
    await lease.drop()  # the last trial judged
    await _settle()
    assert timing.done()
    assert (lease.held, lease.parked) == (False, False)
    assert gate.shared_holders == 0


async def test_a_lease_not_kept_goes_back_to_the_gate_at_each_release() -> None:
    gate = GpuGate()
    lease = GpuLease(gate, _Peer())
    assert await lease.handle(Report.GPU_ACQUIRE)
    timing = asyncio.create_task(_timing(gate))
    await _settle()
    assert await lease.handle(Report.GPU_RELEASE)
    await _settle()
    assert timing.done()  # the timing goes first
    again = asyncio.create_task(lease.handle(Report.GPU_ACQUIRE))
    await _settle()
    assert not again.done()  # and the worker's next request waits for it
    await gate.release(exclusive=True)
    await _settle()
    assert again.done()
    assert not await lease.handle(Report.GPU_ACQUIRE)  # held: a second request is not a lease frame
    await lease.drop()


class _JudgeWorker:
    """A judge worker as the parent sees it, scripted: each judge job asks for the GPU lease,
    gives it back and answers (the comparison itself is test_judge.py's)."""

    pid = 0
    share = None
    dead = False

    def __init__(self) -> None:
        self.frames: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self.proc = SimpleNamespace(returncode=None)

    async def send(self, header: OpFrame) -> None:
        if header["op"] == "judge":
            await self.frames.put({"kind": Report.GPU_ACQUIRE})
        elif header["op"] == "gpu_granted":
            await self.frames.put({"kind": Report.GPU_RELEASE})
            await self.frames.put({"kind": Report.JUDGED, "results": [], "has_residual": []})

    async def recv(self, _limit: int) -> tuple[dict[str, object], bytes]:
        return await self.frames.get(), b""


_JOB = JudgeOp(
    reference_source="",
    init_seed=0,
    seed=0,
    skip=0,
    scale=1.0,
    on_device=False,
    init_on_device=False,
    input_sums=[],
    outputs=[],
)


@pytest.mark.parametrize("keeping", [True, False])
async def test_the_judge_keeps_its_lease_across_one_candidates_trials(keeping: bool) -> None:
    gate = GpuGate()
    worker = _JudgeWorker()

    async def start() -> Worker:
        return cast(Worker, worker)

    referee = Referee(start, gate, nice=0, timeout_s=5.0)
    referee.worker = cast(Worker, worker)  # the task's referee, which judges its outputs
    judge = Judge(referee, gate, nice=0, timeout_s=5.0)
    await judge._ask(_JOB)  # an earlier candidate judged
    order: list[str] = []

    async def timing() -> None:
        await _timing(gate)
        order.append("timing")
        await _settle()
        await gate.release(exclusive=True)

    async def trials() -> None:
        async with judge.keeping_lease() if keeping else contextlib.nullcontext():
            await judge._ask(_JOB)
            order.append("trial 1")
            other = asyncio.create_task(timing())  # another candidate's timing arrives
            await _settle()
            for n in (2, 3):
                await judge._ask(_JOB)
                order.append(f"trial {n}")
        await other

    await asyncio.wait_for(trials(), 5.0)
    if keeping:
        assert order == ["trial 1", "trial 2", "trial 3", "timing"]  # the trials back to back
    else:
        assert order == ["trial 1", "timing", "trial 2", "trial 3"]  # each trial queued again
    assert (gate.shared_holders, gate.exclusive_holders) == (0, 0)
