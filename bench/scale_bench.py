"""Benchmark of the evaluator at KernelBench's sizes: one elementwise op and one row reduction.

    python bench/scale_bench.py                        # on the GPU machine: 64 MB, 1, 4 and 8 GB inputs
    python bench/scale_bench.py --sizes 64M,1G --evals 3
    python bench/scale_bench.py --sizes 8G --evals 3 --stream 8   # and a concurrent stream per size

For each task and input size it starts an evaluation service (the memory plan decides trials,
spares and where outputs are compared), evaluates ``--evals`` distinct honest Triton candidates one
after another and prints, per size: the plan, the verdicts, the first (cold) and the warm
evaluation time (median of the others, from ``evaluate()`` to its result), the share of the warm
evaluations' wall time the GPU was held for a candidate (``gpu_s``), and the peaks of GPU memory
(every process, ``nvidia-smi``, sampled every 0.2 s) and of host memory (the evaluator's process
tree plus its tmpfs files). With ``--stream N``, N more distinct candidates are then submitted at
once to the same service, and their throughput is set against the stream bench's bounds
(``bench/gpu_runner_bench.py``: B is ``min(compile_workers / compile_s, 1 / GPU held)``).
A size the plan refuses prints the refusal. Prints the table last.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib
import os

import psutil

from bench.gpu_runner_bench import gpu_rows, stream_means, stream_rows, watch_idle
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.errors import RunnerError
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalResult, KernelLanguage

HEAD = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"
TASKS = {
    "relu": (
        "torch.relu(x)",
        """
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0){salt}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, {block}),)](x, out, n, BLOCK={block})
        return out
""",
    ),
    "rowsum": (
        "x.sum(dim=1)",
        """
@triton.jit
def rowsum_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0){salt})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        rows, cols = x.shape
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        rowsum_kernel[(rows,)](x, out, cols, BLOCK={block})
        return out
""",
    ),
}
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64M``, ``6G``, ``1.5G``: bytes per input tensor (K, M, G are powers of 1024)."""
    unit = text[-1:].upper()
    try:
        value = float(text[:-1]) if unit in _UNITS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected a number with K, M or G, e.g. 64M or 6G") from None
    nbytes = int(value * _UNITS.get(unit, 1))
    if nbytes < 4096:
        raise argparse.ArgumentTypeError(f"size {text!r}: at least 4K")
    return nbytes


def reference(expr: str, rows: int, cols: int) -> str:
    return (
        HEAD
        + f"""

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
"""
    )


def candidate(body: str, i: int) -> str:
    # distinct sources (compiled and judged each on their own), the same arithmetic
    return HEAD + body.format(salt=f" + 0.0 * {i}" if i else "", block=1024 + 0 * i)


class Sampler:
    """Peak GPU memory of every process on the evaluator's GPU (nvidia-smi) and host memory of this
    process tree plus tmpfs. The GPU is the first of ``CUDA_VISIBLE_DEVICES`` (nvidia-smi numbers
    every GPU of the host and ignores that variable: on a 4-GPU host the peak was GPU 0's, where
    other work ran)."""

    def __init__(self) -> None:
        self.gpu_peak = 0
        self.host_peak = 0
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi")
        self.gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _shm_bytes(self) -> int:
        try:
            usage = shutil.disk_usage("/dev/shm")
            return usage.used
        except OSError:
            return 0

    def _run(self) -> None:
        me = psutil.Process()
        while not self.stop.is_set():
            rss = 0
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss += p.memory_info().rss
            self.host_peak = max(self.host_peak, rss + self._shm_bytes())
            if self.smi:
                out = subprocess.run(
                    [self.smi, "-i", self.gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                with contextlib.suppress(ValueError, IndexError):
                    self.gpu_peak = max(self.gpu_peak, int(out.stdout.split()[0]) << 20)
            self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


async def one_size(
    task: str, size: str, device: str, evals: int, stream: int = 0, spares: int = 2
) -> dict[str, object]:
    expr, body = TASKS[task]
    nbytes = parse_size(size)
    cols = 4096 if task == "rowsum" else (131072 if nbytes >= (1 << 30) else 16384)
    rows = nbytes // 4 // cols
    ref = reference(expr, rows, cols)
    row: dict[str, object] = {"task": task, "size": size, "shape": f"{rows}x{cols}", "spares": spares}
    sampler = Sampler()
    cfg = RunnerConfig(device=DeviceChoice(device), spares=spares, compile_workers=4)
    service = EvaluationService(cfg)
    t0 = time.perf_counter()
    try:
        await service.start()
        await service.prepare(ref)
        row["prepare_s"] = round(time.perf_counter() - t0, 1)
        assert service.runs is not None
        plan = service.runs.plan
        row["plan"] = plan.summary() if plan is not None else "-"
        times, gpu, statuses = [], [], []

        def job(i: int) -> EvalJob:
            return EvalJob(
                reference_source=ref,
                candidate_source=candidate(body, i),
                language=KernelLanguage.TRITON,
                timeout_s=180.0,
                task_id=service.task_id(ref),
                candidate_id=f"{task}-{size}-{i}",
            )

        for i in range(evals):
            t = time.perf_counter()
            result: EvalResult = await service.evaluate(job(i))
            times.append(time.perf_counter() - t)
            gpu.append(result.stages.gpu_s or 0.0)
            statuses.append(result.status.value)
            if result.status.value != "correct":
                compile_detail = next((c.detail for c in result.checks if c.name == "compile"), None)
                print(f"  compile check: {compile_detail}\n  runtime log: {(result.runtime_log or '')[-1500:]}")
            print(
                f"  {task} {size} #{i}: {result.status.value} in {times[-1]:.2f} s (GPU held {gpu[-1]:.2f} s; "
                f"{_stages(result)}); {result.summary[:140]}",
                flush=True,
            )
        row["statuses"] = ",".join(sorted(set(statuses)))
        row["first_s"] = round(times[0], 2)
        warm = times[1:] or times
        row["warm_s"] = round(statistics.median(warm), 2)
        row["gpu_busy"] = round(sum(gpu[1:] or gpu) / sum(warm), 2)
        if stream:
            row.update(await _stream(service, [job(evals + i) for i in range(stream)], cfg.compile_workers))
    except RunnerError as exc:
        row["statuses"] = f"refused: {exc}"[:200]
    finally:
        await service.aclose()
        sampler.close()
    row["gpu_peak_gib"] = round(sampler.gpu_peak / (1 << 30), 1)
    row["host_peak_gib"] = round(sampler.host_peak / (1 << 30), 1)
    return row


async def _stream(service: EvaluationService, jobs: list[EvalJob], workers: int) -> dict[str, object]:
    """Submit every job at once; the stream bench's throughput rows, and the rate against bound B."""
    before = service.gpu.usage()
    done_at: list[float] = []

    async def timed(j: EvalJob) -> EvalResult:
        r = await service.evaluate(j)
        done_at.append(time.perf_counter())
        return r

    idle: dict[str, float] = {}
    watcher = asyncio.create_task(watch_idle(service, idle, []))
    t0 = time.perf_counter()
    results = await asyncio.gather(*(timed(j) for j in jobs))
    wall = time.perf_counter() - t0
    watcher.cancel()
    after = service.gpu.usage()
    use = {k: after[k] - before[k] for k in before}
    rows = stream_rows(results, done_at, t0, wall, workers, use["shared"]) + gpu_rows(use, idle)
    for name, value in rows:
        print(f"  stream: {name.strip()}: {value}", flush=True)
    _, compile_rate, _, mean_held = stream_means(results, workers)
    bound = min(compile_rate, 1 / mean_held)  # bound B, as stream_rows prints it
    rate = len(results) / wall
    return {
        "stream": f"{len(results)}: {rate:.3f}/s",
        "vs_bound_b": round(rate / bound, 2),
        "stream_statuses": ",".join(sorted({r.status.value for r in results})),
    }


def _stages(result: EvalResult) -> str:
    """The stage times of one evaluation, for finding where a warm evaluation's seconds go."""
    st = result.stages
    parts = [("compile", st.compile_s), ("run", st.run_s), ("measure", st.measure_s), ("total", st.total_s)]
    return " ".join(f"{name} {value:.2f}" for name, value in parts if value is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="relu,rowsum")
    parser.add_argument("--sizes", default="64M,1G,4G,8G")
    parser.add_argument("--evals", type=int, default=4)
    parser.add_argument("--stream", type=int, default=0, help="then N candidates at once (throughput vs bound B)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--spares", default="2", help="spares the service may keep (the plan cuts them to fit); a list compares them"
    )
    args = parser.parse_args()
    try:
        spare_counts = [int(n) for n in args.spares.split(",")]
    except ValueError:
        parser.error(f"--spares {args.spares}: integers, comma-separated")
    for size in args.sizes.split(","):
        try:
            parse_size(size)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    unknown = sorted(set(args.tasks.split(",")) - set(TASKS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(sorted(TASKS))}")
    if args.device == "cuda" and shutil.which("nvidia-smi") is None:
        print(
            "scale_bench: no GPU here (nvidia-smi not found); run it on a GPU machine or with --device cpu --sizes 64M"
        )
        return 2
    rows = []
    for task in args.tasks.split(","):
        for size in args.sizes.split(","):
            for spares in spare_counts:
                print(f"{task} {size}, {spares} spare(s): starting", flush=True)
                rows.append(asyncio.run(one_size(task, size, args.device, args.evals, args.stream, spares)))
    cols = [
        "task",
        "size",
        "shape",
        "spares",
        "statuses",
        "prepare_s",
        "first_s",
        "warm_s",
        "gpu_busy",
        "gpu_peak_gib",
        "host_peak_gib",
        *(["stream", "vs_bound_b", "stream_statuses"] if args.stream else []),
    ]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    for r in rows:
        print(f"plan {r['task']} {r['size']}: {r.get('plan', '-')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
