"""Benchmark of gpu_runner: A/A, spread, warm vs cold overhead, compile and evaluator throughput.

    python bench/gpu_runner_bench.py                     # on the GPU machine (about 9 minutes)
    python bench/gpu_runner_bench.py --stream-only       # the throughput stream alone (about 3)
    python bench/gpu_runner_bench.py --device cpu --quick

Prints progress lines, then the table last. Definitions:

* A/A: a reference whose forward is one Triton kernel, against a candidate launching an identical
  kernel; the ratio is eager median / candidate median (1.00 is perfect).
* spread: coefficient of variation of the candidate's median across repeated evaluations.
* overhead on the critical path: ``total_s - compile_s - measure_s`` of one evaluation (gate,
  staging, import, construction, transfers, comparison, process teardown), with a pre-warmed
  prepared worker and with a cold one (``spares=0``: process start and reference on the path);
  "quiet" waits for every spare first (no queueing for the GPU); "small problem" is the fixed
  part (4K elements: transfers and comparisons do not count), with the GPU time held beyond the
  measurement.
* compile throughput: distinct Triton candidates compiled at once by ``compile_workers``
  sandboxed CPU-only processes (ahead-of-time for the GPU's target).
* evaluator throughput: a stream of 32 distinct Triton candidates (against a plain PyTorch
  reference, as KernelBench tasks are, in a service of its own) evaluated concurrently, against
  two bounds: A ``min(compile_workers / mean compile_s, 1 / mean measure_s)`` (the GPU needed
  for nothing but the trial forwards and the timing) and B, the same with the time the GPU was
  held for each candidate alone (``gpu_s``: its import, trials, timing, profile and kill, which
  nothing else may overlap). B is what the pipeline around the GPU (process starts, reference
  preparation, compiles, transfers, comparisons) must keep up with; the gap between A and B is
  the cost of running each candidate in a fresh process with the GPU to itself. Also the rate from the first verdict
  on (the pipeline full), and how the GPU's time split between candidates, spares and idleness.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
import torch

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.gate import check_candidate
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalResult, EvalStatus, KernelLanguage

KERNEL = """
@triton.jit
def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask){variant}
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)
"""
HEAD = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"
REFERENCE = (
    HEAD
    + KERNEL.format(variant="")
    + """

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_relu_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out


N = {n}


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""
)


TORCH_REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x + y)


N = {n}


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""
"""The stream's task: a plain PyTorch reference, as KernelBench's are (the A/A one launches Triton)."""


def candidate(block: int = 1024, warps: int = 4, variant: int = -1) -> str:
    """A Triton candidate; ``variant >= 0`` makes its kernel source (and so its compile) distinct."""
    extra = "" if variant < 0 else f"\n    y = y + 0.0 * {variant}"
    return (
        HEAD
        + KERNEL.format(variant=extra)
        + f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_relu_kernel[(triton.cdiv(n, {block}),)](x, y, out, n, BLOCK={block}, num_warps={warps})
        return out
"""
    )


def job(reference: str, source: str, name: str) -> EvalJob:
    return EvalJob(
        reference_source=reference,
        candidate_source=source,
        language=KernelLanguage.TRITON,
        timeout_s=300.0,
        candidate_id=name,
    )


def overhead(r: EvalResult) -> float | None:
    s = r.stages
    if s.total_s is None or s.measure_s is None:
        return None
    return s.total_s - (s.compile_s or 0.0) - s.measure_s


def process_cost(code: str) -> float:
    """Median seconds of a fresh interpreter running ``code`` (three runs)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stream_means(results: list[EvalResult], workers: int) -> tuple[float, float, float, float]:
    """A stream's mean compile (cache misses), the compile bound ``workers / compile_s``, and the
    mean measured time and GPU-held time per candidate."""
    compiles = [r.stages.compile_s for r in results if r.stages.compile_s and not r.stages.compile_cache_hit]
    measures = [r.stages.measure_s for r in results if r.stages.measure_s]
    held = [r.stages.gpu_s for r in results if r.stages.gpu_s]
    mean_compile = statistics.mean(compiles) if compiles else 0.0
    compile_rate = workers / mean_compile if mean_compile else float("inf")
    mean_measure = statistics.mean(measures) if measures else float("nan")
    mean_held = statistics.mean(held) if held else float("nan")
    return mean_compile, compile_rate, mean_measure, mean_held


def stream_rows(
    results: list[EvalResult], done_at: list[float], t0: float, wall: float, workers: int, spares_only_s: float
) -> list[tuple[str, str]]:
    """Throughput of a stream against the compile bound and three GPU bounds: the measured work,
    the GPU a candidate holds, and that plus the spares' GPU time no candidate overlapped."""
    n = len(results)
    ok = sum(r.status is EvalStatus.CORRECT for r in results)
    mean_compile, compile_rate, mean_measure, mean_held = stream_means(results, workers)
    rate = n / wall
    done_at = sorted(done_at)
    # Once the first verdict is out (the pipeline is full: a compile and a spare were needed first).
    steady = (n - 1) / (done_at[-1] - done_at[0]) if n > 1 and done_at[-1] > done_at[0] else float("nan")
    strict = min(compile_rate, 1.0 / mean_measure)
    gpu = min(compile_rate, 1.0 / mean_held)
    every = min(compile_rate, 1.0 / (mean_held + spares_only_s / n))
    return [
        (
            f"evaluator throughput, stream of {n} distinct Triton candidates",
            f"{rate:.3f} cand/s ({ok}/{n} correct, {wall:.1f} s)",
        ),
        ("  first verdict after / rate from then on", f"{done_at[0] - t0:.1f} s / {steady:.3f} cand/s"),
        (
            "  per candidate: compile / GPU held / of which measured",
            f"{mean_compile:.2f} s / {mean_held:.3f} s / {mean_measure:.3f} s (trial forwards + timing)",
        ),
        (
            "  bound A: min(workers / compile_s, 1 / measured)",
            f"{strict:.3f} cand/s; throughput / A {rate / strict:.2f} (after the first verdict {steady / strict:.2f})",
        ),
        (
            "  bound B: min(workers / compile_s, 1 / GPU held)",
            f"{gpu:.3f} cand/s; throughput / B {rate / gpu:.2f} (after the first verdict {steady / gpu:.2f})",
        ),
        (
            "  bound C: min(workers / compile_s, 1 / (GPU held + spares-only GPU time per candidate))",
            f"{every:.3f} cand/s; throughput / C {rate / every:.2f} (after the first verdict {steady / every:.2f})",
        ),
    ]


def gpu_rows(use: dict[str, float], idle: dict[str, float]) -> list[tuple[str, str]]:
    """Two rows of a stream: how the GPU's time split (``GpuGate.usage`` differences) and what an
    idle GPU waited for (``watch_idle``)."""
    return [
        (
            "  GPU in the stream: timings alone / candidates' trials / spares only / idle",
            f"{use['exclusive']:.1f} / {use['candidate']:.1f} / {use['shared']:.1f} / {use['idle']:.1f} s",
        ),
        (
            "  GPU idle, by what the nearest evaluation waited for",
            ", ".join(f"{k} {v:.1f} s" for k, v in sorted(idle.items(), key=lambda kv: -kv[1])) or "none",
        ),
    ]


async def watch_idle(svc: EvaluationService, into: dict[str, float], lags: list[float], period: float = 0.005) -> None:
    """Attribute the time the GPU is held by nobody to what the next evaluation waits for (sampled),
    and record how late each wake-up of this task was (the event loop's lag)."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(period)
        now = time.perf_counter()
        dt, last = now - last, now
        lags.append(dt - period)
        if svc.gpu.state() != "idle":
            continue
        n = svc.in_flight
        why = next(
            (label for phase, label in IDLE_CAUSES if n.get(phase)),
            "nothing in flight",
        )
        into[why] = into.get(why, 0.0) + dt


IDLE_CAUSES = (
    ("gpu_wait", "lease hand-over"),
    ("arm", "staging/arming"),
    ("spare", "waiting for a spare"),
    ("compile", "compiling"),
    ("gate", "gate"),
    ("verdict", "comparisons only"),
)
"""What an idle GPU waits for, the phase nearest the GPU first (see ``EvaluationService.in_flight``)."""


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


async def stream_section(cfg: RunnerConfig, quick: bool) -> list[tuple[str, str]]:
    """A stream of distinct Triton candidates against a PyTorch reference, in a service of its own."""
    cuda = cfg.device is DeviceChoice.CUDA
    reference = TORCH_REFERENCE.format(n=(1 << 24) if cuda else (1 << 12))
    rows: list[tuple[str, str]] = []
    async with EvaluationService(cfg) as svc:
        await svc.prepare(reference)
        await svc.wait_spares(timeout_s=600)
        n_stream = 3 if quick else 64
        stream = [
            job(reference, candidate(block=(256, 512, 1024, 2048)[i % 4], warps=(2, 4, 8)[i % 3], variant=i), f"s{i}")
            for i in range(n_stream)
        ]
        before = svc.gpu.usage()
        spares_before = svc.runs.prepared if svc.runs is not None else 0
        done_at: list[float] = []
        cpu_before, own_before = psutil.cpu_times(), os.times()

        async def timed_eval(j: EvalJob) -> EvalResult:
            r = await svc.evaluate(j)
            done_at.append(time.perf_counter())
            return r

        idle: dict[str, float] = {}
        lags: list[float] = []
        watcher = asyncio.create_task(watch_idle(svc, idle, lags))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(timed_eval(j) for j in stream))
        wall = time.perf_counter() - t0
        watcher.cancel()
        after = svc.gpu.usage()
        cpu_after, own_after = psutil.cpu_times(), os.times()
        use = {k: after[k] - before[k] for k in before}
        rows.extend(stream_rows(results, done_at, t0, wall, cfg.compile_workers, use["shared"]))
        n_spares = svc.runs.prepared - spares_before if svc.runs is not None else 0
        split, idle_row = gpu_rows(use, idle)
        rows.append((split[0], f"{split[1]} ({n_spares} spares prepared; spares may work beside a candidate's trials)"))
        busy = sum(getattr(cpu_after, k) - getattr(cpu_before, k) for k in ("user", "nice", "system", "irq", "softirq"))
        own = (own_after.user - own_before.user) + (own_after.system - own_before.system)
        cores = os.cpu_count() or 1
        rows.append(
            (
                "  host CPU during the stream: busy / of which this process",
                f"{busy / (wall * cores):.0%} of {cores} cores / {own:.1f} core-s ({own / wall:.2f} cores)",
            )
        )
        rows.append(idle_row)
        if lags:
            lags.sort()
            mid, p99, top = (lags[len(lags) // 2], lags[int(len(lags) * 0.99)], lags[-1])
            rows.append(
                (
                    "  event loop lag (5 ms sleeps): median / p99 / max",
                    f"{mid * 1e3:.1f} / {p99 * 1e3:.1f} / {top * 1e3:.0f} ms",
                )
            )
    log("stream done")
    return rows


async def run(
    device: DeviceChoice, quick: bool, n_aa: int | None = None, stream_only: bool = False, no_stream: bool = False
) -> list[tuple[str, str]]:
    cuda = device is DeviceChoice.CUDA
    rows: list[tuple[str, str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="kf-bench-"))
    rows.append(("python: import torch", f"{process_cost('import torch'):.2f} s"))
    if cuda:
        cost = process_cost("import torch; torch.cuda.init(); torch.zeros(1, device='cuda'); torch.cuda.synchronize()")
        rows.append(("cold process: import torch + CUDA ready", f"{cost:.2f} s"))
    reference = REFERENCE.format(n=(1 << 24) if cuda else (1 << 12))
    cpus = os.cpu_count() or 1
    cfg = RunnerConfig(
        device=device,
        spares=16 if cuda else 2,
        compile_workers=cpus,
        cache_dir=tmp / "cache",
        work_dir=tmp / "work",
        timing_budget_s=2.0 if cuda else 0.5,
        timing_min_reps=30 if cuda else 5,
    )
    if stream_only:
        return rows + await stream_section(cfg, quick)
    async with EvaluationService(cfg) as svc:
        await svc.prepare(reference)
        await svc.wait_spares(timeout_s=600)
        log("spares ready")
        aa = [await svc.evaluate(job(reference, candidate(), f"aa{i}")) for i in range(n_aa or (2 if quick else 6))]
        for r in aa:
            if r.status is not EvalStatus.CORRECT:
                raise SystemExit(f"A/A candidate was not correct: {r.summary}")
        ratios = [r.speedup_vs_eager for r in aa[1:] if r.speedup_vs_eager is not None]
        medians = [r.timing.median_ms for r in aa[1:] if r.timing is not None]
        rows.append(
            (
                "A/A ratio (eager / identical kernel), median [min, max]",
                f"{statistics.median(ratios):.4f} [{min(ratios):.4f}, {max(ratios):.4f}] over {len(ratios)}",
            )
        )
        cv = statistics.pstdev(medians) / statistics.mean(medians) if len(medians) > 1 else 0.0
        rel = statistics.median(r.timing.median_rel_stderr or 0.0 for r in aa[1:] if r.timing is not None)
        rows.append(
            (
                "spread of repeated evaluations (CV of medians)",
                f"{cv:.2%} (median within-run rel. stderr of the median {rel:.2%}, {medians[0]:.4f} ms)",
            )
        )
        warm = [o for o in (overhead(r) for r in aa[1:]) if o is not None]
        rows.append(
            (
                "critical-path overhead, warm prepared worker",
                f"{statistics.median(warm):.3f} s (median; includes waiting for spares' GPU windows)",
            )
        )
        log(f"A/A done: {ratios}")
        quiet, quiet_overhead = [], []
        for i in range(2 if quick else 4):
            await svc.wait_spares(timeout_s=600)  # nothing starting or preparing while this one is timed
            r = await svc.evaluate(job(reference, candidate(), f"aq{i}"))
            if r.speedup_vs_eager is not None:
                quiet.append(r.speedup_vs_eager)
            if (o := overhead(r)) is not None:
                quiet_overhead.append(o)
        rows.append(
            (
                "A/A ratio, quiet (no spare starting), median [min, max]",
                f"{statistics.median(quiet):.4f} [{min(quiet):.4f}, {max(quiet):.4f}] over {len(quiet)}",
            )
        )
        rows.append(
            (
                "critical-path overhead, warm worker, quiet (no wait for the GPU)",
                f"{statistics.median(quiet_overhead):.3f} s (median of {len(quiet_overhead)})",
            )
        )
        log(f"quiet A/A done: {quiet}")
        if cuda and not quick:
            gate = check_candidate(candidate(variant=0), reference)
            assert svc.compiler is not None
            t0 = time.perf_counter()
            single = await svc.compiler.compile(candidate(variant=10_000), reference, gate, 600)
            one = time.perf_counter() - t0
            m = 2 * cpus
            t0 = time.perf_counter()
            outs = await asyncio.gather(
                *(svc.compiler.compile(candidate(variant=20_000 + i), reference, gate, 600) for i in range(m))
            )
            wall = time.perf_counter() - t0
            rows.append(("compile, one candidate (sandboxed, AOT sm target)", f"{one:.2f} s ({single.aot[:40]})"))
            rows.append(
                (
                    f"compile throughput, {m} distinct at once, {cpus} workers",
                    f"{m / wall:.2f} cand/s (mean {statistics.mean(o.seconds for o in outs):.2f} s each, "
                    f"{sum(o.ok for o in outs)}/{m} ok)",
                )
            )
            log("compile throughput done")
    if not no_stream:
        rows += await stream_section(dataclasses.replace(cfg, work_dir=tmp / "work-stream"), quick)
    # The fixed part of the overhead: a problem too small for transfers and comparisons to count.
    small_cfg = dataclasses.replace(cfg, spares=2, work_dir=tmp / "work-small")
    small = REFERENCE.format(n=1 << 12)
    async with EvaluationService(small_cfg) as svc:
        await svc.prepare(small)
        fixed, window = [], []
        for i in range(2 if quick else 4):
            await svc.wait_spares(timeout_s=600)
            r = await svc.evaluate(job(small, candidate(), f"small{i}"))
            if r.status is not EvalStatus.CORRECT:
                raise SystemExit(f"small-problem candidate was not correct: {r.summary}")
            if i and (o := overhead(r)) is not None:  # the first one compiles the Triton launcher's cache
                fixed.append(o)
                if r.stages.gpu_s is not None and r.stages.measure_s is not None:
                    window.append(r.stages.gpu_s - r.stages.measure_s)
        rows.append(
            (
                "critical-path overhead, warm worker, small problem (4K elements)",
                f"{statistics.median(fixed):.3f} s (median of {len(fixed)}; GPU held beyond the measurement "
                f"{statistics.median(window):.3f} s)",
            )
        )
    cold_cfg = RunnerConfig(
        device=device,
        spares=0,
        compile_workers=2,
        cache_dir=tmp / "cache",
        work_dir=tmp / "work-cold",
        timing_budget_s=cfg.timing_budget_s,
        timing_min_reps=cfg.timing_min_reps,
    )
    async with EvaluationService(cold_cfg) as svc:
        colds = []
        for i in range(1 if quick else 2):
            r = await svc.evaluate(job(reference, candidate(), f"cold{i}"))
            colds.append(overhead(r))
        cold = [c for c in colds if c is not None]
        rows.append(
            (
                "critical-path overhead, cold worker (spawn + prepare)",
                f"{statistics.median(cold):.3f} s (median of {len(cold)})",
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--aa", type=int, default=None, help="A/A evaluations (default 6, 2 with --quick)")
    parser.add_argument("--stream-only", action="store_true", help="only the evaluator-throughput stream")
    parser.add_argument("--no-stream", action="store_true", help="everything but the stream (it has its own run)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_runner_bench: no CUDA GPU here (torch.cuda.is_available() is False); "
            "for a CPU smoke run: python bench/gpu_runner_bench.py --device cpu --quick"
        )
    started = time.perf_counter()
    rows = asyncio.run(run(DeviceChoice(args.device), args.quick, args.aa, args.stream_only, args.no_stream))
    width = max(len(k) for k, _ in rows)
    print(
        f"\ngpu_runner benchmark ({args.device}{', quick' if args.quick else ''}, "
        f"{time.perf_counter() - started:.0f} s)"
    )
    for key, value in rows:
        print(f"  {key.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
