"""Calibration of the parent-clock cross-check of timing reports (issue: trusted evaluation).

    python bench/crosscheck_probe.py            # on the GPU machine (about a minute)

A timed batch is ``n`` calls, each on fresh inputs drawn on the device from a new seed, after an
L2 flush and a lead spin, bracketed by CUDA events; the batch ends with a synchronisation. The
host clock around the whole batch (``W``) bounds what the events may claim: the time outside the
event windows per call, ``o = (W - sum(samples)) / n``, is the harness's own cost (input draw,
flush, lead spin) and should be the same for every workload and every process that runs the same
harness. This prints, per workload and harness variant, the median per-call sample and ``o``
(median and p10..p90 over batches), so the cross-check's slack can be set from measurements:

* ``honest``: the harness as the evaluator runs it;
* ``halved``: the same calls with every sample reported at half its value (a forged report);
* ``no_flush``: the flush and the lead spin left out (a tampered harness that warms L2);
* ``hidden``: an extra untimed torch op per call between the draw and the start event.

Then the canary: a one-block kernel's host-clock latency with the GPU idle and while another
process keeps a kernel running (what a candidate's leftover work looks like from outside).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

L2_FLUSH_BYTES = 2 * 60 * (1 << 20)


def draw(seed: int, shapes: list[tuple[int, ...]], device: torch.device) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    with torch.device(device):
        return [torch.randn(s) for s in shapes]


def triton_relu() -> Callable[[torch.Tensor], torch.Tensor]:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 4096),)](x, out, n, BLOCK=4096)
        return out

    return run


def many_launches(x: torch.Tensor) -> torch.Tensor:
    y = x
    for _ in range(48):
        y = y + 1.0
    return y


WORKLOADS: dict[str, tuple[list[tuple[int, ...]], Callable[..., Any] | None]] = {
    "relu 8K eager": ([(8192,)], torch.relu),
    "relu 8K triton": ([(8192,)], None),
    "relu 64M eager": ([(16 << 20,)], torch.relu),
    "relu 64M triton": ([(16 << 20,)], None),
    "relu 4G eager": ([(1 << 30,)], torch.relu),
    "48 adds 8K (host-bound)": ([(8192,)], many_launches),
    "mm 2048 fp32": ([(2048, 2048), (2048, 2048)], torch.mm),
}


def batch(
    fn: Callable[..., Any], shapes: list[tuple[int, ...]], n: int, seed: int, variant: str, device: torch.device
) -> tuple[float, list[float]]:
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    torch.cuda.synchronize()
    samples: list[float] = []
    events = []
    t0 = time.perf_counter()
    for k in range(n):
        inputs = draw(seed + k, shapes, device)
        if variant != "no_flush":
            flush.zero_()
            torch.cuda._sleep(200_000)  # type: ignore[no-untyped-call]  # ~100 us at 2 GHz
        if variant == "hidden":
            fn(*inputs)  # the answer computed outside the window
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn(*inputs)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    for start, end in events:
        samples.append(start.elapsed_time(end) * (0.5 if variant == "halved" else 1.0))
    return wall, samples


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: this probe needs one")
        return 0
    device = torch.device("cuda:0")
    relu_t = triton_relu()
    rows = []
    for name, (shapes, fn) in WORKLOADS.items():
        call = fn if fn is not None else relu_t
        for variant in ("honest", "halved", "no_flush", "hidden"):
            _, warm = batch(call, shapes, 3, 1, variant, device)
            per_call = statistics.median(warm)
            n = max(1, min(32, int(10.0 / max(per_call + 0.3, 1e-3))))
            overheads, meds = [], []
            for b in range(args.batches):
                wall, samples = batch(call, shapes, n, 1000 * b + 7, variant, device)
                overheads.append((wall - sum(samples)) / n * 1e3)
                meds.append(statistics.median(samples) * 1e3)
            rows.append(
                (
                    name,
                    variant,
                    n,
                    statistics.median(meds),
                    statistics.median(overheads),
                    q(overheads, 0.1),
                    q(overheads, 0.9),
                )
            )
            print(
                f"{name:26s} {variant:9s} n={n:3d} sample {rows[-1][3]:10.1f} us  o {rows[-1][4]:8.1f} us "
                f"[{rows[-1][5]:.1f}, {rows[-1][6]:.1f}]",
                flush=True,
            )
        torch.cuda.empty_cache()
    # the canary: idle, then beside another process's running kernel
    tiny = torch.zeros(1, device=device)

    def canary() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tiny.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6

    idle = [canary() for _ in range(50)]
    busy_src = (
        "import torch,sys\ntorch.cuda.init(); torch.empty(1,device='cuda').zero_(); torch.cuda.synchronize()\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "for _ in range(40): torch.cuda._sleep(100_000_000)\n"
        "torch.cuda.synchronize()\n"
    )
    other = subprocess.Popen([sys.executable, "-c", busy_src], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None
    assert other.stdin is not None
    other.stdout.readline()
    other.stdin.write("go\n")
    other.stdin.flush()
    time.sleep(0.5)
    busy = [canary() for _ in range(20)]
    other.kill()
    other.wait()
    print()
    print("| workload | harness | calls/batch | median sample us | o median us | o p10..p90 us |")
    print("|---|---|---:|---:|---:|---|")
    for name, variant, n, med, o, lo, hi in rows:
        print(f"| {name} | {variant} | {n} | {med:.1f} | {o:.1f} | {lo:.1f}..{hi:.1f} |")
    print()
    print(f"canary host latency, GPU idle: median {statistics.median(idle):.1f} us, max {max(idle):.1f} us")
    print(
        f"canary host latency, another process's kernel running: median {statistics.median(busy):.1f} us, "
        f"min {min(busy):.1f} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
