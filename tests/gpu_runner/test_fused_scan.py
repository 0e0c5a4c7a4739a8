"""The judge's fused one-pass scan gives the PyTorch path's numbers (``gpu_runner.sandboxed.fused_scan``).

On the CPU the kernel runs under ``TRITON_INTERPRET=1`` in a child process (the interpreter is
chosen when Triton is imported); on a GPU (``-m gpu``) ``judge_output`` itself is run on a large
output both ways.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import torch
from gpu_runner.sandboxed import fused_scan
from gpu_runner.sandboxed.judging import _scan_chunk

def torch_path(c, r, d, atol, rtol, chunk):
    out = {"size": c.numel(), "nan_bad": 0, "nan_first": None, "outside": 0, "outside_first": None,
           "max_abs": 0.0, "max_rel": 0.0, "sq_err": 0.0, "sq_ref_err": 0.0, "sq_exact": 0.0,
           "truth_excess": float("-inf"), "ref_err_max": 0.0}
    for lo in range(0, c.numel(), chunk):
        hi = min(lo + chunk, c.numel())
        _scan_chunk(out, lo, c[lo:hi], r[lo:hi], None if d is None else d[lo:hi], atol, rtol)
    return out

def fused(c, r, d, atol, rtol, chunk):
    parts = []
    for lo in range(0, c.numel(), chunk):
        hi = min(lo + chunk, c.numel())
        part = torch.empty((fused_scan.programs(hi - lo), fused_scan.FIELDS), dtype=torch.float64)
        fused_scan.launch(part, c[lo:hi], r[lo:hi], None if d is None else d[lo:hi], lo, atol, rtol)
        parts.append(part)
    return fused_scan.reduce(parts, c.numel())

g = torch.Generator().manual_seed(7)
n = 3 * fused_scan.BLOCK * fused_scan.STEPS + 1234  # several programs, a ragged last one
results = {}
for name, dtype, residual, outside, poison in [
    ("fp32_truth_outside", torch.float32, True, True, None),
    ("fp32_no_truth_outside", torch.float32, False, True, None),
    ("fp32_truth_inside", torch.float32, True, False, None),
    ("fp16_truth_outside", torch.float16, True, True, None),
    ("nan_candidate", torch.float32, True, False, "c"),
    ("inf_residual", torch.float32, True, False, "d"),
    ("inf_reference", torch.float32, False, False, "r"),
]:
    r = torch.randn(n, generator=g).to(dtype)
    c = (r.double() + 1e-6 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)
    d = (1e-7 * torch.randn(n, generator=g)) if residual else None
    if outside:
        hits = torch.randint(0, n, (9,), generator=g)
        c[hits] += 0.5
    if poison == "c":
        c[n // 2] = float("nan")
    elif poison == "d":
        d[5] = float("inf")
    elif poison == "r":
        r[7] = float("inf")
        c[7] = float("inf")
    chunk = fused_scan.BLOCK * fused_scan.STEPS * 2  # two launches, the second with an offset
    results[name] = {"torch": torch_path(c, r, d, 1e-4, 1e-4, chunk), "fused": fused(c, r, d, 1e-4, 1e-4, chunk)}
json.dump(results, sys.stdout)
"""


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return out


def same_numbers(fused: dict[str, Any], ref: dict[str, Any]) -> None:
    """Counts and indexes equal; float64 sums and maxima equal to rounding (the order differs)."""
    assert fused.keys() == ref.keys()
    for key in ("size", "nan_bad", "nan_first", "outside", "outside_first"):
        assert fused[key] == ref[key], key
    for key in ("max_abs", "max_rel", "sq_err", "sq_ref_err", "sq_exact", "truth_excess", "ref_err_max"):
        a, b = fused[key], ref[key]
        same = a == b or (math.isnan(a) and math.isnan(b))  # NaN sums: a NaN output reached both
        assert same or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300), (key, a, b)


@pytest.mark.parametrize(
    "case", ["fp32_truth_outside", "fp32_no_truth_outside", "fp32_truth_inside", "fp16_truth_outside"]
)
def test_fused_scan_matches_the_torch_path_on_finite_outputs(interpreted: dict[str, Any], case: str) -> None:
    got = interpreted[case]
    assert got["fused"] is not None
    same_numbers(got["fused"], got["torch"])
    if case.endswith("outside"):
        assert got["torch"]["outside"] > 0
        assert got["torch"]["outside_first"] is not None
    else:
        assert got["torch"]["outside"] == 0
        assert got["fused"]["truth_excess"] == float("-inf")


@pytest.mark.parametrize("case", ["nan_candidate", "inf_residual", "inf_reference"])
def test_fused_scan_hands_non_finite_outputs_back(interpreted: dict[str, Any], case: str) -> None:
    """Anything NaN or infinite: the fused scan declines (the judge then locates it the PyTorch way)."""
    assert interpreted[case]["fused"] is None
    if case == "nan_candidate":
        assert interpreted[case]["torch"]["nan_bad"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("poison", [False, True])
def test_judge_output_fused_and_torch_paths_agree_on_gpu(poison: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``judge_output`` on an output large enough for the fused kernel, against the PyTorch path
    (the same function with the fused path's threshold above the output's size)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gpu_runner.sandboxed import judging

    dev = torch.device("cuda")
    n = judging.FUSED_MIN_ELEMENTS + 4321
    g = torch.Generator(device=dev).manual_seed(3)
    ref = torch.randn(n, device=dev, generator=g)
    residual = 1e-7 * torch.randn(n, device=dev, generator=g)
    cand = ref + 1e-6 * torch.randn(n, device=dev, generator=g)
    cand[torch.randint(0, n, (17,), device=dev, generator=g)] += 1.0
    if poison:
        cand[n - 3] = float("nan")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kf_fused_scan_{os.getpid()}.bin"
    cand.cpu().numpy().tofile(path)
    try:
        spec = {"dtype": "float32", "cand": str(path), "atol": 1e-4, "rtol": 1e-4}
        fused = judging.judge_output(spec, ref, residual, dev)
        monkeypatch.setattr(judging, "FUSED_MIN_ELEMENTS", n + 1)
        plain = judging.judge_output(spec, ref, residual, dev)
    finally:
        path.unlink()
    same_numbers(fused, plain)
    assert plain["outside"] >= 17
    assert plain["nan_bad"] == int(poison)
