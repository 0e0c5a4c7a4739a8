"""Which GPU activity of *other* processes disturbs a kernel timed with CUDA events?

    python bench/gpu_interference.py [--seconds-per-action 6] [--procs 4]

A timer process times one memory-bound kernel (an add over 16M float32, about 50 us on an H200)
the way ``gpu_runner.sandboxed.timing`` does: L2 flush, a device-side spin before the start event, events
around the call. Meanwhile batches of helper processes perform one action each (a CUDA context
start, CUPTI start, host<->device copies, small kernels, ``torch.compile``...), and print the
monotonic-clock window of that action. Every timed sample is assigned to the action whose window
it fell in (or to "none": no helper alive at all). The table gives, per action, the samples'
median and 99th percentile against the undisturbed ones: an action whose rows stay at 1.00 can
run beside a timing; one that moves them must hold the evaluator's GPU lease.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMER = r"""
import json, os, sys, time, torch
dev = torch.device("cuda:0")
n = 1 << 24
x = torch.randn(n, device=dev); y = torch.randn(n, device=dev); o = torch.empty_like(x)
l2 = torch.cuda.get_device_properties(dev).L2_cache_size
flush = torch.empty(2 * l2, dtype=torch.int8, device=dev)
cycles = 2_000_000
torch.cuda._sleep(cycles); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
s.record(); torch.cuda._sleep(cycles); e.record(); torch.cuda.synchronize()
lead = int(cycles / (s.elapsed_time(e) * 1e3) * 200)
stop, give_up = sys.argv[1], time.monotonic() + 3600
out = []
print("ready", flush=True)
while time.monotonic() < give_up and (len(out) % 256 or not os.path.exists(stop)):
    flush.zero_(); torch.cuda._sleep(lead)
    s.record(); torch.add(x, y, out=o); e.record(); e.synchronize()
    out.append((time.monotonic(), s.elapsed_time(e)))
json.dump(out, open(sys.argv[2], "w"))
"""

PRELUDE = r"""
import sys, time
t_start = time.monotonic()
import torch
def window(name, t0):
    print("WINDOW", name, t0, time.monotonic(), flush=True)
dev = torch.device("cuda:0")
"""

ACTIONS: dict[str, str] = {
    "import torch only (CPU)": "window('import', t_start)",
    "CUDA context start + one tiny kernel": (
        "t0 = time.monotonic(); torch.cuda.init(); torch.empty(1, device=dev).zero_(); torch.cuda.synchronize()\n"
        "window('ctx', t0)"
    ),
    "CUPTI profiler start/stop, no kernel": (
        "torch.empty(1, device=dev).zero_(); torch.cuda.synchronize(); import torch.profiler as tp\n"
        "t0 = time.monotonic()\n"
        "with tp.profile(activities=[tp.ProfilerActivity.CUDA]):\n    pass\n"
        "window('cupti', t0)"
    ),
    "CUPTI profiler with one tiny kernel": (
        "torch.empty(1, device=dev).zero_(); torch.cuda.synchronize(); import torch.profiler as tp\n"
        "t0 = time.monotonic()\n"
        "with tp.profile(activities=[tp.ProfilerActivity.CUDA]):\n"
        "    torch.empty(1024, device=dev).add_(1); torch.cuda.synchronize()\n"
        "window('cupti_k', t0)"
    ),
    "Triton driver load": (
        "torch.empty(1, device=dev).zero_(); torch.cuda.synchronize()\n"
        "t0 = time.monotonic()\nfrom triton.runtime import driver\ndriver.active.get_current_target()\n"
        "getattr(driver.active, 'utils', None)\nwindow('triton', t0)"
    ),
    "host->device 128 MB + device->host 128 MB": (
        "h = torch.randn(1 << 25); torch.empty(1, device=dev).zero_(); torch.cuda.synchronize()\n"
        "t0 = time.monotonic(); d = h.to(dev); back = d.cpu(); torch.cuda.synchronize()\nwindow('copy', t0)"
    ),
    "page-lock 640 MB of host memory + unlock (cudaHostRegister)": (
        "h = torch.empty(640 << 20, dtype=torch.uint8); h.zero_(); torch.empty(1, device=dev).zero_()\n"
        "torch.cuda.synchronize(); rt = torch.cuda.cudart()\n"
        "t0 = time.monotonic(); assert int(rt.cudaHostRegister(h.data_ptr(), h.numel(), 0)) == 0\n"
        "rt.cudaHostUnregister(h.data_ptr()); window('pin', t0)"
    ),
    "cudaMalloc 1 GB + free": (
        "torch.empty(1, device=dev).zero_(); torch.cuda.synchronize()\n"
        "t0 = time.monotonic(); a = torch.empty(1 << 28, device=dev); del a; torch.cuda.empty_cache()\n"
        "torch.cuda.synchronize(); window('malloc', t0)"
    ),
    "torch.compile warm-up (2 calls, 16M elements)": (
        "m = lambda a, b: torch.relu(a + b) * 2\n"
        "a = torch.randn(1 << 24, device=dev); b = torch.randn(1 << 24, device=dev); torch.cuda.synchronize()\n"
        "t0 = time.monotonic(); c = torch.compile(m)\nfor _ in range(2):\n    c(a, b)\n"
        "torch.cuda.synchronize(); window('compile', t0)"
    ),
    "50 small kernels (4K elements)": (
        "a = torch.ones(4096, device=dev); torch.cuda.synchronize()\n"
        "t0 = time.monotonic()\nfor _ in range(50):\n    a.mul_(1.0)\ntorch.cuda.synchronize(); window('small', t0)"
    ),
}


def run(seconds: float, procs: int, reps: int, only: str | None = None) -> list[tuple[str, str, str, str, str]]:
    parts = [p.strip().lower() for p in only.split(",")] if only else []
    actions = {k: v for k, v in ACTIONS.items() if not parts or any(p in k.lower() for p in parts)}
    tmp = Path(tempfile.mkdtemp(prefix="kf-interf-"))
    samples_path, stop = tmp / "samples.json", tmp / "stop"
    # The timer runs until told to stop, however long the actions take.
    timer = subprocess.Popen(
        [sys.executable, "-c", TIMER, str(stop), str(samples_path)], stdout=subprocess.PIPE, text=True
    )
    assert timer.stdout is not None
    timer.stdout.readline()
    windows: list[tuple[str, float, float]] = []
    alive: list[tuple[float, float]] = []  # any helper process alive (start, end)
    time.sleep(2.0)
    for _ in range(reps):
        for name, body in actions.items():
            t0 = time.monotonic()
            helpers = [
                subprocess.Popen([sys.executable, "-c", PRELUDE + body], stdout=subprocess.PIPE, text=True)
                for _ in range(procs)
            ]
            for h in helpers:
                out, _ = h.communicate(timeout=120)
                for line in out.splitlines():
                    if line.startswith("WINDOW"):
                        _, _tag, a, b = line.split()
                        windows.append((name, float(a), float(b)))
            alive.append((t0, time.monotonic()))
            time.sleep(max(0.5, seconds - (time.monotonic() - t0)))
    time.sleep(2.0)
    stop.touch()
    timer.wait(timeout=120)
    samples = [(float(t), float(ms)) for t, ms in json.loads(samples_path.read_text())]
    quiet = [ms for t, ms in samples if not any(a - 0.2 <= t <= b + 0.2 for a, b in alive)]
    base = statistics.median(quiet)

    def p99(values: list[float]) -> float:
        return sorted(values)[int(0.99 * (len(values) - 1))]

    rows = [("none (no helper alive)", str(len(quiet)), f"{base:.4f} ms", "1.000", f"{p99(quiet) / base:.3f}")]
    for name in actions:
        spans = [(a, b + 0.002) for n, a, b in windows if n == name]
        inside = [ms for t, ms in samples if any(a <= t - ms / 1e3 and t - ms / 1e3 <= b for a, b in spans)]
        if not inside:
            rows.append((name, "0", "-", "-", "-"))
            continue
        med = statistics.median(inside)
        rows.append((name, str(len(inside)), f"{med:.4f} ms", f"{med / base:.3f}", f"{p99(inside) / base:.3f}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds-per-action", type=float, default=6.0)
    parser.add_argument("--procs", type=int, default=4, help="helper processes doing the action at once")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--only", default=None, help="only actions whose names contain one of these (comma-separated)")
    args = parser.parse_args()
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        raise SystemExit("gpu_interference needs a CUDA GPU (torch.cuda.is_available() is not True here)")
    rows = run(args.seconds_per_action, args.procs, args.reps, args.only)
    head = ("action in other processes", "samples", "median", "median / quiet", "p99 / quiet")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    print(f"\nGPU interference ({args.procs} helper processes at once, {args.reps} rounds)")
    for r in [head, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
