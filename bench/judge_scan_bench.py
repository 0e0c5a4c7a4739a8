"""The judge's comparison of one output on the GPU: the PyTorch path against the fused scan.

    python bench/judge_scan_bench.py                       # 16M, 256M and 2G elements
    python bench/judge_scan_bench.py --sizes 64M,1G --reps 5

For each size, a float32 reference output, its float32 residual against float64 and a candidate
output a little off it (a few elements outside the tolerance), all on the device, are scanned by
``gpu_runner.sandboxed.judging``'s PyTorch path (``_scan_chunk`` per 64M-element chunk, as the
judge did before the fused kernel) and by the fused kernel (``_fused_scan``), side by side in one
process; the median of ``--reps`` scans after one warm-up (the fused kernel's compile), each
synchronised. The two must agree on every count and index (checked, printed). Prints the table and
writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gpu_runner.sandboxed.judging import CHUNK, _fused_scan, _scan_chunk

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``16M`` -> 16 * 2**20 elements."""
    text = text.strip().upper()
    return int(text[:-1]) * SUFFIX[text[-1]] if text[-1] in SUFFIX else int(text)


def torch_path(c: torch.Tensor, r: torch.Tensor, d: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "size": c.numel(), "nan_bad": 0, "nan_first": None, "outside": 0, "outside_first": None,
        "max_abs": 0.0, "max_rel": 0.0, "sq_err": 0.0, "sq_ref_err": 0.0, "sq_exact": 0.0,
        "truth_excess": float("-inf"), "ref_err_max": 0.0,
    }  # fmt: skip
    for lo in range(0, c.numel(), CHUNK):
        hi = min(lo + CHUNK, c.numel())
        _scan_chunk(out, lo, c[lo:hi], r[lo:hi], d[lo:hi], atol, rtol)
    return out


def timed(fn: Any, reps: int) -> tuple[float, Any]:
    """Median seconds of ``reps`` synchronised calls after one warm-up, and the last result."""
    result = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16M,256M,2G", help="output elements, comma-separated (K, M, G suffixes)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="bench/results/judge_scan.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.stderr.write("judge_scan_bench: needs a CUDA GPU (the judge's fused scan runs only there)\n")
        return 1
    dev = torch.device("cuda")
    lines = [
        f"# The judge's scan of one float32 output with its float64 residual, {torch.cuda.get_device_name()}",
        "",
        "| elements | bytes read (c, r, d) | PyTorch path | fused | speed-up | fused GB/s | same counts |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for text in args.sizes.split(","):
        n = parse_size(text)
        g = torch.Generator(device=dev).manual_seed(0)
        r = torch.randn(n, device=dev, generator=g)
        d = 1e-7 * torch.randn(n, device=dev, generator=g)
        c = r + 1e-6 * torch.randn(n, device=dev, generator=g)
        c[torch.randint(0, n, (11,), device=dev, generator=g)] += 1.0
        t_torch, a = timed(lambda c=c, r=r, d=d: torch_path(c, r, d, 1e-4, 1e-4), args.reps)
        t_fused, b = timed(lambda c=c, r=r, d=d: _fused_scan(c, r, d, dev, 1e-4, 1e-4), args.reps)
        same = b is not None and all(a[k] == b[k] for k in ("outside", "outside_first", "nan_bad", "size"))
        nbytes = 12 * n
        lines.append(
            f"| {text} | {nbytes / 1e9:.2f} GB | {t_torch * 1e3:.1f} ms | {t_fused * 1e3:.2f} ms "
            f"| {t_torch / t_fused:.0f}x | {nbytes / t_fused / 1e9:.0f} | {'yes' if same else 'NO'} |"
        )
        print(lines[-1], flush=True)
        del r, d, c
        torch.cuda.empty_cache()
    table = "\n".join(lines) + "\n"
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
