"""Nsight Compute on a real GPU (``pytest -m gpu``; skipped without CUDA or ``ncu``): the opt-in
profiling step reads counters for template candidates, unconfined and in the worker's
confinement, and they tell a memory-bound elementwise kernel from a compute-heavy GEMM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors.diagnosis.counters import Bound, bound_of
from actors.experts.template import default_params, render
from gpu_runner.ncu import ncu_path, profile_counters
from tests.experts.template_interp import plan_of
from tests.experts.test_template_gemm_variants import LONG_K

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

SCALE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(64 * 1024 * 1024)]


def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda_and_ncu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if ncu_path() is None:
        pytest.skip("needs ncu (Nsight Compute) on PATH or KF_NCU")


def test_counters_tell_a_streaming_kernel_from_a_gemm() -> None:
    stream_plan = plan_of(SCALE)
    stream = profile_counters(SCALE, render(stream_plan, default_params(stream_plan)), iso=None)
    assert stream.kernels >= 1
    assert stream.dram_throughput_pct is not None
    assert stream.dram_throughput_pct > 50, stream
    assert bound_of(stream) is Bound.MEMORY
    gemm_src = LONG_K.format(m=4096, n=4096, k=4096)
    gemm_plan = plan_of(gemm_src)
    gemm = profile_counters(gemm_src, render(gemm_plan, default_params(gemm_plan)), iso=None)
    assert gemm.sm_throughput_pct is not None
    assert gemm.dram_throughput_pct is not None
    assert gemm.sm_throughput_pct > gemm.dram_throughput_pct, gemm
    assert gemm.stalls


def test_the_cli_attaches_counters_to_a_slow_correct_candidate(tmp_path: Path) -> None:
    plan = plan_of(SCALE)
    slow = default_params(plan).with_changes(pw_warps=1, pw_ept=1)
    (tmp_path / "ref.py").write_text(SCALE)
    (tmp_path / "cand.py").write_text(render(plan, slow))
    done = subprocess.run(
        [sys.executable, "-m", "gpu_runner", str(tmp_path / "ref.py"), str(tmp_path / "cand.py"),
         "--device", "cuda", "--profile-counters", "--json"],
        capture_output=True, text=True, timeout=800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    check = next(c for c in result["checks"] if c["name"] == "profile_counters")
    if check["outcome"] == "skipped":
        assert "speed-of-light" in check["detail"]  # the slow configuration was still fast enough
        return
    assert check["outcome"] == "passed", check  # confined as a worker, or the reason why not
    counters = result["profile"]["counters"]
    assert counters["kernels"] >= 1
    assert counters["dram_throughput_pct"] is not None
