"""The compile stage's helpers: a candidate's Triton kernels compiled by several processes side by
side (for a CUDA target, on this CPU), each into the shared cache, the stage's own pass finding
every one of them there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runner.config import KERNELS_PER_PROCESS, compile_processes
from gpu_runner.sandboxed.hooks import CompileShare

pytestmark = pytest.mark.timeout(240)

CANDIDATE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _k_add(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n) + 1.0, mask=o < n)


@triton.jit
def _k_mul(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 3.0, mask=o < n)


@triton.jit
def _k_neg(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, -tl.load(x + o, mask=o < n), mask=o < n)


class ModelNew(nn.Module):
    def forward(self, x):
        a = torch.empty_like(x)
        b = torch.empty_like(x)
        c = torch.empty_like(x)
        _k_add[(1,)](x, a, x.numel(), BLOCK=128)
        _k_mul[(1,)](a, b, x.numel(), BLOCK=128)
        _k_neg[(1,)](b, c, x.numel(), BLOCK=128)
        _k_add[(1,)](c, a, x.numel(), BLOCK=256)
        return a
"""

SCRIPT = """
import json, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from gpu_runner.sandboxed.candidate import import_candidate
from gpu_runner.sandboxed.compiling import _CompileOnlyDriver, _compile_in_shares
from gpu_runner.sandboxed.hooks import CompileShare, LaunchLog, install_triton_hooks

processes = int(sys.argv[2])
driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
kernels, share = [], CompileShare()
install_triton_hooks(LaunchLog(), compile_only=True, compiled=kernels, share=share)
cand = import_candidate(sys.argv[1])["ModelNew"]()
x = torch.empty(100)
said = _compile_in_shares(lambda: cand(x), share, processes, kernels) if processes > 1 else ""
import os, pathlib
before = len(list(pathlib.Path(os.environ["TRITON_CACHE_DIR"]).rglob("*.cubin")))
with torch.no_grad():
    cand(x)
print(json.dumps({"said": said, "kernels": len(kernels), "before_full_pass": before}))
"""


def _run(tmp_path: Path, processes: int) -> dict[str, object]:
    cand = tmp_path / "cand.py"
    cand.write_text(CANDIDATE)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cache = tmp_path / f"cache{processes}"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        [sys.executable, str(script), str(cand), str(processes)], env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    out["cubins"] = sorted(p.parent.name for p in cache.rglob("*.cubin"))
    return out


def test_helpers_compile_their_share_into_the_cache_the_stage_reads(tmp_path: Path) -> None:
    alone = _run(tmp_path, 1)
    shared = _run(tmp_path, 3)
    assert len(alone["cubins"]) == 4  # type: ignore[arg-type]  # _k_add twice (two BLOCKs), _k_mul, _k_neg
    assert shared["cubins"] == alone["cubins"]  # the same kernels, content-addressed the same
    assert shared["said"] == "compiled in 3 processes, 2 of 2 helpers finished"
    # every kernel was in the cache before the stage's full pass, which lists each once
    assert shared["before_full_pass"] == 4
    assert shared["kernels"] == 4
    assert alone["before_full_pass"] == 0
    assert alone["kernels"] == 4


def test_a_share_is_every_nth_launch() -> None:
    share = CompileShare(index=1, of=3)
    assert [share.mine() for _ in range(7)] == [False, True, False, False, True, False, False]
    assert all(CompileShare().mine() for _ in range(5))


def test_every_launch_site_of_one_kernel_goes_to_one_process(tmp_path: Path) -> None:
    """Shared by kernel, not by launch order: the sites of one compiled kernel (a function the
    template's repeated layers share, launched with other offsets) are one process's, so no two
    processes compile it; another constexpr or a misaligned size is another kernel."""
    import torch

    from gpu_runner.sandboxed.candidate import import_candidate
    from gpu_runner.sandboxed.hooks import launch_key

    path = tmp_path / "cand.py"
    path.write_text(CANDIDATE)
    ns = import_candidate(str(path))
    add, mul = ns["_k_add"], ns["_k_mul"]
    x, y = torch.empty(256), torch.empty(256)
    sites = [((x, y, 64), {"BLOCK": 128}), ((y, x, 4096), {"BLOCK": 128}), ((x, x, 32), {"BLOCK": 128})]
    keys = {launch_key(add, args, kw) for args, kw in sites}
    assert len(keys) == 1  # one kernel: sizes that are multiples of 16, aligned tensors, one BLOCK
    assert launch_key(add, (x, y, 64), {"BLOCK": 256}) not in keys
    assert launch_key(add, (x, y, 1), {"BLOCK": 128}) not in keys  # Triton specialises a 1
    assert launch_key(add, (x, y, 63), {"BLOCK": 128}) not in keys  # and a multiple of 16
    assert launch_key(mul, (x, y, 64), {"BLOCK": 128}) not in keys
    for args, kw in sites:
        owners = [i for i in range(5) if CompileShare(index=i, of=5).mine_for(add, args, kw)]
        assert len(owners) == 1
        assert owners == [i for i in range(5) if CompileShare(index=i, of=5).mine_for(add, sites[0][0], sites[0][1])]
    assert CompileShare().mine_for(add, (x, y, 64), {"BLOCK": 128})  # one process: all of them
    share = CompileShare(index=1, of=3)
    assert [share.mine_for(object(), (), {}) for _ in range(4)] == [False, True, False, False]  # no key: by order


def test_processes_grow_with_kernels_up_to_the_jobs() -> None:
    assert compile_processes(16, 3) == 1
    assert compile_processes(16, 2 * KERNELS_PER_PROCESS) == 2
    assert compile_processes(4, 150) == 4
    assert compile_processes(1, 150) == 1


def test_a_compile_takes_the_cores_its_kernels_can_use() -> None:
    assert compile_processes(16, 3) == 1
    assert compile_processes(16, 8) == 2
    assert compile_processes(16, 838) == 16  # KernelBench L3-15's DenseNet-121: every core
    assert compile_processes(1, 838) == 1


async def test_compiles_share_the_cores_first_in_line_first() -> None:
    """A whole model's compile has every core alone; the next waits for them, and one that asked
    later does not pass it by (a small compile behind a large one waits its turn)."""
    import asyncio

    from gpu_runner.compiler import CoreBudget

    budget = CoreBudget(16)
    order: list[str] = []

    async def compile_(name: str, want: int, hold: asyncio.Event) -> None:
        got = await budget.take(want)
        order.append(f"{name}:{got}")
        await hold.wait()
        await budget.give(got)

    done = [asyncio.Event() for _ in range(3)]
    first = asyncio.create_task(compile_("a", 16, done[0]))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(compile_("b", 16, done[1]))
    await asyncio.sleep(0.01)
    small = asyncio.create_task(compile_("c", 1, done[2]))
    await asyncio.sleep(0.05)
    assert order == ["a:16"]  # b waits for every core; c, behind b, waits too
    done[0].set()
    await asyncio.sleep(0.05)
    assert order == ["a:16", "b:16"]
    done[1].set()
    await asyncio.sleep(0.05)
    assert order == ["a:16", "b:16", "c:1"]
    done[2].set()
    await asyncio.gather(first, second, small)
    assert budget.free == 16
    assert await budget.take(99) == 16  # never more than there are


async def test_a_compile_cancelled_in_line_lets_the_next_in() -> None:
    import asyncio

    from gpu_runner.compiler import CoreBudget

    budget = CoreBudget(4)
    held = await budget.take(4)
    waiting = asyncio.create_task(budget.take(4))
    after = asyncio.create_task(budget.take(1))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.sleep(0.01)
    assert not after.done()  # the cores are still held
    await budget.give(held)
    assert await asyncio.wait_for(after, 1) == 1


async def test_the_best_ranked_compile_goes_first_whatever_arrived_first() -> None:
    """Of the compiles waiting for the cores, the candidate of the lowest turn (its island's rank,
    then its arrival) goes first: an island's first starting point is compiled before its variants
    that reached the compiler earlier."""
    import asyncio

    from gpu_runner.compiler import CoreBudget

    budget = CoreBudget(8)
    held = await budget.take(8)
    order: list[str] = []

    async def compile_(name: str, turn: tuple[float, int]) -> None:
        got = await budget.take(8, turn)
        order.append(name)
        await budget.give(got)

    late_variant = asyncio.create_task(compile_("variant, rank 3", (3.0, 0)))
    await asyncio.sleep(0.01)
    unranked = asyncio.create_task(compile_("unranked", (float("inf"), 1)))
    await asyncio.sleep(0.01)
    first_start = asyncio.create_task(compile_("default, rank 0", (0.0, 2)))
    await asyncio.sleep(0.01)
    assert order == []
    await budget.give(held)
    await asyncio.gather(late_variant, unranked, first_start)
    assert order == ["default, rank 0", "variant, rank 3", "unranked"]


async def test_a_compile_waits_for_better_ranked_candidates_still_in_the_gate() -> None:
    """A better-ranked candidate still in the static gate goes first: the free cores are not
    taken by a worse-ranked one that left the gate a moment earlier."""
    import asyncio

    from gpu_runner.compiler import CoreBudget

    budget = CoreBudget(8, patience_s=30.0)
    best, worse = (0.0, 1), (4.0, 0)
    budget.arriving(best)
    budget.arriving(worse)
    order: list[str] = []

    async def compile_(name: str, turn: tuple[float, int]) -> None:
        got = await budget.take(8, turn)
        order.append(name)
        await budget.give(got)

    second = asyncio.create_task(compile_("worse", worse))  # left its gate first
    await asyncio.sleep(0.05)
    assert order == []  # the cores are free, but the better-ranked one is still gated
    await budget.arrived(best)  # gated: it compiles now
    await compile_("best", best)
    await asyncio.wait_for(second, 1)
    assert order == ["best", "worse"]


async def test_a_better_ranked_candidate_held_in_the_gate_is_waited_for_only_a_patience() -> None:
    """One that does not leave the gate (or leaves it without compiling: refused, or no compile
    needed) delays the others by the patience from its arrival at most, or not at all once it
    says so."""
    import asyncio
    import time

    from gpu_runner.compiler import CoreBudget

    budget = CoreBudget(4, patience_s=0.3)
    budget.arriving((0.0, 0))
    started = time.monotonic()
    assert await budget.take(4, (1.0, 1)) == 4
    assert 0.25 <= time.monotonic() - started < 2.0
    await budget.give(4)
    assert await asyncio.wait_for(budget.take(4, (1.0, 4)), 0.2) == 4  # its patience is spent
    await budget.give(4)
    budget.arriving((0.0, 2))
    waiting = asyncio.create_task(budget.take(4, (1.0, 3)))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await budget.arrived((0.0, 2))  # refused by the gate: never compiles
    assert await asyncio.wait_for(waiting, 0.2) == 4


async def test_a_compiled_candidate_does_not_wait_for_a_better_ranked_one_compiled_after_it() -> None:
    """The compile line waits for better-ranked candidates compiling beside this one (or still in
    the gate), not for one that waited for its cores: that one is a whole compile away."""
    import asyncio

    from gpu_runner.compiler import CoreBudget
    from gpu_runner.lease import CompileLine

    budget, line = CoreBudget(8), CompileLine()
    best, beside, worse = (0.0, 2), (1.0, 1), (4.0, 0)
    for turn in (best, beside, worse):
        line.enter(turn)
    got = await budget.take(4, worse)  # the worse-ranked one arrived first
    got_beside = await budget.take(4, beside)  # compiles beside it
    queued = asyncio.create_task(budget.take(8, best))  # waits for every core
    await asyncio.sleep(0.01)
    await budget.give(got, worse)  # the worse-ranked one is compiled
    soon = budget.beside(worse)
    assert soon(beside)
    assert not soon(best)
    waiting = asyncio.create_task(line.wait_turn(worse, 30.0, soon))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the one compiling beside it goes first
    await budget.give(got_beside, beside)
    await line.leave(beside)
    assert await asyncio.wait_for(waiting, 1.0) < 1.0  # not for the best, still queued for cores
    assert await asyncio.wait_for(queued, 1.0) == 8
