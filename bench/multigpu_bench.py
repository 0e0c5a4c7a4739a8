"""Benchmark: the evaluator stream on 1, 2 and 4 GPUs of one machine, and A/A on GPU 0 under load.

    python bench/multigpu_bench.py                      # on the GPU machine
    python bench/multigpu_bench.py --sizes 1 --aa 0     # the 1-GPU row alone
    python bench/multigpu_bench.py --device cpu --quick # a smoke run of this script on the CPU

Setup as ``kfoundry run`` has it: one ``EvaluationService`` per GPU in this one process, each
pinned to its GPU by UUID (``RunnerConfig.gpu``), with ``cores // n`` compile workers and ``1/n``
of the host's memory, ``--spares`` spares and ``--concurrency`` candidates in flight each (the
evaluator actor's defaults). The stream: ``--per-gpu`` distinct Triton candidates per GPU (the
stream of ``bench/gpu_runner_bench.py``, against its plain PyTorch reference), pulled from one
shared queue, after every service's spares are ready. Per GPU: candidates per second and the busy
fraction (GPU held for candidates alone, ``stages.gpu_s``, over the stream's wall time, as
``report.json`` counts it; and held by anything, candidates or spares, from the GPU lease). The
scaling ratio is the n-GPU rate over n times the 1-GPU rate (the goal: at least 0.9).

Compile capacity: distinct candidates compiled at once by all the machine's cores (no GPU work);
when the n-GPU stream reaches most of it, compiles bind before the GPUs do.

A/A: ``bench/gpu_runner_bench.py``'s A/A (a reference launching one Triton kernel, a candidate
launching an identical one; eager median / candidate median, 1.00 is perfect) on GPU 0, first
with the other GPUs idle, then while every other GPU evaluates a stream (goal: 1.00 +- 0.02).

Prints progress lines on stderr, the table last. With fewer GPUs than a row needs, it says so in
one line and measures what it can (with none: one line, exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.kinds.evaluator_runners import stamp_gpu
from actors.runtime.gpu_usage import gpu_usage
from actors.runtime.gpus import Gpu, compile_workers_per_gpu, list_gpus
from bench.gpu_runner_bench import REFERENCE, TORCH_REFERENCE, candidate, job, log
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.gate import check_candidate
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalResult, EvalStatus


@dataclass(frozen=True)
class Setup:
    device: DeviceChoice
    per_gpu: int
    concurrency: int
    spares: int
    n_aa: int
    tmp: Path
    quick: bool

    @property
    def elements(self) -> int:
        return (1 << 24) if self.device is DeviceChoice.CUDA else (1 << 12)

    def config(self, gpu: Gpu | None, n: int, name: str) -> RunnerConfig:
        cuda = self.device is DeviceChoice.CUDA
        return RunnerConfig(
            device=self.device,
            gpu=gpu.uuid if gpu is not None else None,
            spares=self.spares,
            compile_workers=compile_workers_per_gpu(n),
            host_memory_share=1.0 / n,
            cache_dir=self.tmp / "cache",
            work_dir=self.tmp / name,
            timing_budget_s=2.0 if cuda else 0.5,
            timing_min_reps=30 if cuda else 5,
        )


@dataclass
class Served:
    """One pinned service and what it evaluated."""

    gpu: Gpu | None
    svc: EvaluationService
    results: list[EvalResult]


async def _serve(served: Served, queue: asyncio.Queue[EvalJob], concurrency: int) -> None:
    async def one_lane() -> None:
        while True:
            try:
                j = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            r = await served.svc.evaluate(j)
            served.results.append(stamp_gpu(r, served.gpu))

    await asyncio.gather(*(one_lane() for _ in range(concurrency)))


async def _start(
    stack: contextlib.AsyncExitStack, setup: Setup, gpus: list[Gpu | None], reference: str, tag: str
) -> list[Served]:
    n = len(gpus)
    services = [EvaluationService(setup.config(g, n, f"work-{tag}-{g.index if g else 'cpu'}")) for g in gpus]
    for svc in services:
        await stack.enter_async_context(svc)
    await asyncio.gather(*(svc.prepare(reference) for svc in services))
    await asyncio.gather(*(svc.wait_spares(timeout_s=600) for svc in services))
    return [Served(g, svc, []) for g, svc in zip(gpus, services, strict=True)]


def _stream_jobs(reference: str, count: int, offset: int) -> list[EvalJob]:
    return [
        job(
            reference,
            candidate(block=(256, 512, 1024, 2048)[i % 4], warps=(2, 4, 8)[i % 3], variant=offset + i),
            f"s{offset + i}",
        )
        for i in range(count)
    ]


async def stream_row(setup: Setup, gpus: list[Gpu | None]) -> dict[str, float | str]:
    """The stream on ``gpus`` at once: total and per-GPU rates, busy fractions."""
    n = len(gpus)
    reference = TORCH_REFERENCE.format(n=setup.elements)
    async with contextlib.AsyncExitStack() as stack:
        served = await _start(stack, setup, gpus, reference, f"n{n}")
        log(f"{n} GPU(s): spares ready, streaming {setup.per_gpu * n} candidates")
        queue: asyncio.Queue[EvalJob] = asyncio.Queue()
        for j in _stream_jobs(reference, setup.per_gpu * n, offset=1000 * n):
            queue.put_nowait(j)
        before = [s.svc.gpu.usage() for s in served]
        t0 = time.time()
        await asyncio.gather(*(_serve(s, queue, setup.concurrency) for s in served))
        t1 = time.time()
        after = [s.svc.gpu.usage() for s in served]
    wall = t1 - t0
    results = [r for s in served for r in s.results]
    usage = {u.gpu: u for u in gpu_usage(results, window=(t0, t1))}
    per_gpu = []
    for s, b, a in zip(served, before, after, strict=True):
        index = s.gpu.index if s.gpu is not None else None
        u = usage.get(index) if index is not None else next(iter(usage.values()), None)
        held = sum(a[k] - b[k] for k in ("exclusive", "candidate", "shared")) / wall
        rate, busy = (u.candidates_per_s or 0.0, u.busy_fraction or 0.0) if u is not None else (0.0, 0.0)
        per_gpu.append(f"{'cpu' if index is None else index}: {rate:.3f}/s busy {busy:.0%} (held {held:.0%})")
    ok = sum(r.status is EvalStatus.CORRECT for r in results)
    compiles = [r.stages.compile_s for r in results if r.stages.compile_s and not r.stages.compile_cache_hit]
    return {
        "gpus": n,
        "rate": len(results) / wall,
        "wall": wall,
        "ok": f"{ok}/{len(results)}",
        "per_gpu": "; ".join(per_gpu),
        "compile_s": statistics.mean(compiles) if compiles else float("nan"),
    }


async def compile_capacity(setup: Setup, gpu: Gpu | None) -> tuple[float, float]:
    """Distinct candidates compiled per second by every core of the machine (cand/s, mean s each)."""
    cores = os.cpu_count() or 1
    reference = TORCH_REFERENCE.format(n=setup.elements)
    cfg = replace(setup.config(gpu, 1, "work-compile"), compile_workers=cores, spares=1)
    m = 4 if setup.quick else 2 * cores
    async with EvaluationService(cfg) as svc:
        assert svc.compiler is not None
        gate = check_candidate(candidate(variant=0), reference)
        await svc.compiler.compile(candidate(variant=90_000), reference, gate, 600)  # warm the compiler's pool
        t0 = time.perf_counter()
        outs = await asyncio.gather(
            *(svc.compiler.compile(candidate(variant=91_000 + i), reference, gate, 600) for i in range(m))
        )
        wall = time.perf_counter() - t0
    return m / wall, statistics.mean(o.seconds for o in outs)


def _aa_summary(results: list[EvalResult]) -> str:
    bad = [r for r in results if r.status is not EvalStatus.CORRECT]
    if bad:
        return f"not correct: {bad[0].summary[:120]}"
    ratios = [r.speedup_vs_eager for r in results[1:] if r.speedup_vs_eager is not None]
    if not ratios:
        return "no ratios"
    within = all(abs(x - 1.0) <= 0.02 for x in ratios)
    return (
        f"{statistics.median(ratios):.4f} [{min(ratios):.4f}, {max(ratios):.4f}] over {len(ratios)}"
        f" ({'all' if within else 'NOT all'} within 1.00 +- 0.02)"
    )


async def aa_under_load(setup: Setup, gpus: list[Gpu]) -> tuple[str, str, float]:
    """A/A on ``gpus[0]``, quiet and then while the others evaluate a stream; the others' rate."""
    n = len(gpus)
    aa_ref = REFERENCE.format(n=setup.elements)
    stream_ref = TORCH_REFERENCE.format(n=setup.elements)
    async with contextlib.AsyncExitStack() as stack:
        (aa,) = await _start(stack, setup, [gpus[0]], aa_ref, "aa")
        others = await _start(stack, setup, list(gpus[1:]), stream_ref, "load") if n > 1 else []
        quiet = [await aa.svc.evaluate(job(aa_ref, candidate(), f"aq{i}")) for i in range(setup.n_aa + 1)]
        log(f"quiet A/A: {_aa_summary(quiet)}")
        queue: asyncio.Queue[EvalJob] = asyncio.Queue()
        for j in _stream_jobs(stream_ref, 10_000, offset=500_000):
            queue.put_nowait(j)
        t0 = time.time()
        load = [asyncio.create_task(_serve(s, queue, setup.concurrency)) for s in others]
        loaded = [await aa.svc.evaluate(job(aa_ref, candidate(), f"al{i}")) for i in range(setup.n_aa + 1)]
        while not queue.empty():  # stop the load: lanes end after what they hold
            queue.get_nowait()
        await asyncio.gather(*load)
        wall = time.time() - t0
    done = sum(len(s.results) for s in others)
    return _aa_summary(quiet), _aa_summary(loaded), done / wall


async def run(setup: Setup, sizes: list[int], gpus: list[Gpu]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    cuda = setup.device is DeviceChoice.CUDA
    pins: list[Gpu | None] = list(gpus) if cuda else [None]
    rows.append(
        (
            "setup",
            f"{len(pins)} {'GPU(s): ' + gpus[0].name if cuda else 'CPU'}; {os.cpu_count()} cores; per GPU: "
            f"{setup.spares} spares, {setup.concurrency} in flight, {setup.per_gpu} candidates",
        )
    )
    base: float | None = None
    best_rate = 0.0
    for k in sizes:
        if k > len(pins):
            log(f"skipping the {k}-GPU row: {len(pins)} visible")
            rows.append((f"stream on {k} GPUs", f"not run: only {len(pins)} visible"))
            continue
        row = await stream_row(setup, pins[:k])
        rate = float(row["rate"])
        best_rate = max(best_rate, rate)
        base = rate if k == 1 else base
        scaling = f"; scaling vs 1 GPU {rate / (k * base):.2f}" if base and k > 1 else ""
        rows.append(
            (
                f"stream on {k} GPU(s)",
                f"{rate:.3f} cand/s ({row['ok']} correct, {float(row['wall']):.1f} s){scaling}; "
                f"compile {float(row['compile_s']):.2f} s each",
            )
        )
        rows.append(("  per GPU: cand/s, busy (candidates alone), held (any)", str(row["per_gpu"])))
        log(f"{k}-GPU row done: {rate:.3f} cand/s")
    capacity, each = await compile_capacity(setup, pins[0])
    bound = "compiles bind" if best_rate >= 0.8 * capacity else "compiles do not bind"
    rows.append(
        (
            f"compile capacity, all {os.cpu_count()} cores (no GPU work)",
            f"{capacity:.2f} cand/s ({each:.2f} s each); the fastest stream reached {best_rate / capacity:.0%} of it: "
            f"{bound}",
        )
    )
    if setup.n_aa > 0:
        if len(pins) < 2 or not cuda:
            rows.append(("A/A on GPU 0 under load", "not run: needs 2 or more GPUs"))
            log("A/A under load not run: needs 2 or more GPUs")
        else:
            quiet, loaded, other_rate = await aa_under_load(setup, [g for g in pins if g is not None])
            rows.append(("A/A on GPU 0, other GPUs idle", quiet))
            rows.append((f"A/A on GPU 0, GPUs 1-{len(pins) - 1} streaming ({other_rate:.3f} cand/s)", loaded))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="1,2,4", help="GPU counts of the stream rows (default 1,2,4)")
    parser.add_argument("--per-gpu", type=int, default=None, help="stream candidates per GPU (default 24, 2 quick)")
    parser.add_argument("--concurrency", type=int, default=2, help="candidates in flight per GPU (default 2)")
    parser.add_argument("--spares", type=int, default=2, help="spares per GPU (default 2, as kfoundry run)")
    parser.add_argument("--aa", type=int, default=None, help="A/A evaluations each (default 6, 2 quick; 0: none)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    device = DeviceChoice(args.device)
    gpus = list_gpus() if device is DeviceChoice.CUDA else []
    if device is DeviceChoice.CUDA and not gpus:
        print("multigpu_bench: no GPU visible here (nvidia-smi lists none); nothing to measure")
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if device is DeviceChoice.CUDA and len(gpus) < max(sizes):
        print(
            f"multigpu_bench: {len(gpus)} GPU(s) visible, rows for {max(sizes)} need more: measuring "
            f"{', '.join(str(k) for k in sizes if k <= len(gpus))} GPU(s) only"
        )
    setup = Setup(
        device=device,
        per_gpu=args.per_gpu or (2 if args.quick else 24),
        concurrency=args.concurrency,
        spares=args.spares,
        n_aa=args.aa if args.aa is not None else (2 if args.quick else 6),
        tmp=Path(tempfile.mkdtemp(prefix="kf-multigpu-")),
        quick=args.quick,
    )
    started = time.perf_counter()
    rows = asyncio.run(run(setup, sizes if device is DeviceChoice.CUDA else [1], gpus))
    width = max(len(k) for k, _ in rows)
    print(
        f"\nmulti-GPU benchmark ({args.device}{', quick' if args.quick else ''}, {time.perf_counter() - started:.0f} s)"
    )
    for key, value in rows:
        print(f"  {key.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
