"""The GEMM family's Hopper-class variants: split-K (partials summed in a fixed order, chosen by
the GPU model for long-K products whose tiles cannot fill the machine), persistent programs and
tensor-descriptor (TMA) loads, each correct under Triton's interpreter with fused epilogues, and
a split-K first candidate for a KernelBench L1-6-like product that passes the precision check."""

from __future__ import annotations

import ast
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.experts.template import any_batch, any_sizes, default_params, mutate, render
from actors.experts.template import emit_mm as emit_mm_module
from actors.experts.template.emit_mm import effective_split
from actors.experts.template.hardware import CPU_FALLBACK, TABLE, GpuModel
from actors.experts.template.interp_check import check_in_subprocess
from bench import gemm_variants
from gpu_runner.config import DEFAULT_PRECISION_FLOORS, RunnerConfig
from gpu_runner.gate import check_candidate
from tests.experts.template_interp import plan_of

H100, H200, A100 = TABLE["H100"], TABLE["H200"], TABLE["A100"]

LONG_K = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


M = {m}
N = {n}
K = {k}


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []
"""

EPILOGUE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn({n}))

    def forward(self, x, w):
        return torch.relu({product} + self.bias) * 0.5


def get_inputs():
    return [torch.randn({x_shape}), torch.randn({w_shape})]


def get_init_inputs():
    return []
"""

# KernelBench level 1 problem 6 is 256 x 256 with K = 524288: K / (M * N) = 8. So is 64 x 64 x 32768.
L1_6_SCALED = LONG_K.format(m=64, n=64, k=32768)


def _precision_bar(ref_err: float) -> float:
    """The evaluator's bar on the relative L2 error against float64 (``compare.decide``)."""
    return max(RunnerConfig().precision_factor * ref_err, DEFAULT_PRECISION_FLOORS["float32"])


@pytest.mark.parametrize("hw", [H100, H200], ids=["H100", "H200"])
def test_long_k_products_with_few_tiles_start_split_k_with_an_fp32_accurate_dot(hw: GpuModel) -> None:
    for m, n, k in ((256, 256, 524288), (64, 64, 32768), (128, 512, 65536)):
        params = default_params(plan_of(LONG_K.format(m=m, n=n, k=k)), hw)
        assert params.mm_split_k > 1, (m, n, k)
        assert params.mm_precision in ("ieee", "tf32x3")
        tiles = math.ceil(m / params.mm_block_m) * math.ceil(n / params.mm_block_n)
        assert tiles * params.mm_split_k >= 2 * H100.sm_count or params.mm_split_k == 128
        steps = math.ceil(k / params.mm_block_k) / params.mm_split_k
        assert steps <= 512, (m, n, k, params.mm_split_k)  # no long sequential fp32 sum is left


def test_products_that_fill_the_machine_or_have_short_k_are_not_split() -> None:
    for m, n, k in ((4096, 4096, 4096), (256, 256, 4096), (1024, 8192, 8192)):
        assert default_params(plan_of(LONG_K.format(m=m, n=n, k=k)), H100).mm_split_k == 1
    assert default_params(plan_of(L1_6_SCALED), CPU_FALLBACK).mm_split_k == 1  # no GPU: shapes alone
    assert A100.split_k(256, 256, 524288, (64, 64, 32)) > 1


def test_a_split_is_clamped_to_slices_of_several_k_steps_and_a_bounded_buffer() -> None:
    assert effective_split(128, 64, 64, 32768, 32) == 128
    assert effective_split(128, 64, 64, 1024, 32) == 8  # 32 K steps: 4 per slice at most 8 slices
    assert effective_split(64, 8192, 8192, 8192, 32) == 1  # 64 x 8192^2 fp32 partials would be 16 GB


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps every variant (split-K too) under the interpreter
@pytest.mark.timeout(200)
def test_split_k_first_candidate_is_more_accurate_than_one_long_sum_and_clears_the_bar(tmp_path: Path) -> None:
    plan = plan_of(L1_6_SCALED)
    first = default_params(plan, H100)
    assert first.mm_split_k == 128
    plain = first.with_changes(mm_split_k=1)
    jobs = [
        {"reference": L1_6_SCALED, "candidate": render(plan, p), "seeds": [1, 2], "atol": 1e-4, "rtol": 1e-4}
        for p in (first, plain)
    ]
    split_v, plain_v = check_in_subprocess(jobs, tmp_path, timeout=180)
    assert split_v.ok, split_v
    assert plain_v.ok, plain_v
    assert split_v.err_vs_fp64 is not None
    assert plain_v.err_vs_fp64 is not None
    assert split_v.ref_err_vs_fp64 is not None
    assert split_v.err_vs_fp64 <= _precision_bar(split_v.ref_err_vs_fp64)
    # 64 K steps per slice then a tree of 128 partials, against 1024 sequential steps.
    assert split_v.err_vs_fp64 < 0.6 * plain_v.err_vs_fp64, (split_v, plain_v)


def _variant_jobs(source: str, base: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    plan = plan_of(source)
    first = default_params(plan).with_changes(**base)
    jobs: list[dict[str, Any]] = []
    labels: list[str] = []
    for split, persistent, tma in itertools.product((1, 4), (False, True), (False, True)):
        params = first.with_changes(mm_split_k=split, mm_persistent=persistent, mm_tma=tma)
        jobs.append({"reference": source, "candidate": render(plan, params), "seeds": [4], "atol": 1e-4, "rtol": 1e-4})
        labels.append(f"split={split} persistent={persistent} tma={tma}")
    return jobs, labels


@pytest.mark.timeout(300)
def test_every_gemm_variant_with_a_fused_epilogue_is_correct_in_the_interpreter(tmp_path: Path) -> None:
    small = {"mm_block_m": 16, "mm_block_n": 16, "mm_block_k": 16, "mm_warps": 1, "mm_group_m": 2}
    cases = [
        # Ragged edges: M, N not multiples of the tiles; K not a multiple of BLOCK_K * split.
        EPILOGUE.format(n=40, product="x @ w", x_shape="36, 200", w_shape="200, 40"),
        # A batched A times a shared B is one flattened product; the variants apply to it.
        EPILOGUE.format(n=24, product="torch.matmul(x, w)", x_shape="3, 10, 96", w_shape="96, 24"),
        # B transposed (nn.Linear layout): no TMA descriptor for it, plain loads instead.
        EPILOGUE.format(n=24, product="x @ w.t()", x_shape="20, 64", w_shape="24, 64"),
    ]
    jobs: list[dict[str, Any]] = []
    labels: list[str] = []
    for i, source in enumerate(cases):
        more, names = _variant_jobs(source, small)
        jobs += more
        labels += [f"case{i} {name}" for name in names]
    half = len(jobs) // 2
    verdicts = check_in_subprocess(jobs[:half], tmp_path, timeout=280) + check_in_subprocess(
        jobs[half:], tmp_path, timeout=280
    )
    bad = [(label, v.detail) for label, v in zip(labels, verdicts, strict=True) if not v.ok]
    assert not bad, bad


def _kernels(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {
        node.name: ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name not in ("_kf_stream", "_kf_refuse")  # helpers
        and not node.name.endswith(any_batch.SUFFIX)  # the copies that take any batch (any_batch.py)
        and not node.name.endswith(any_sizes.SUFFIX)  # and any sizes (any_sizes.py)
    }


def test_variants_render_what_they_name_and_tma_needs_descriptors_and_aligned_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = plan_of(LONG_K.format(m=64, n=64, k=4096))
    base = default_params(plan)
    split = render(plan, base.with_changes(mm_split_k=8))
    kernels = _kernels(split)
    assert len(kernels) == 2
    assert sum(name.endswith("_part") for name in kernels) == 1
    assert any("tl.sum(parts, axis=0)" in body for body in kernels.values())
    assert "tl.atomic" not in split  # a fixed summation order: deterministic
    persistent = render(plan, base.with_changes(mm_persistent=True))
    assert "tl.num_programs(0)" in persistent
    assert "multi_processor_count" in persistent
    tma = render(plan, base.with_changes(mm_tma=True))
    assert "TensorDescriptor(" in tma
    assert "get_device_capability" in tma  # below compute capability 9, plain loads
    assert ".load([pid_m * BLOCK_M, k0])" in tma
    # Rows of 4 * 4094 bytes are not 16-byte aligned: no descriptors.
    odd = plan_of(LONG_K.format(m=64, n=64, k=4094))
    assert "TensorDescriptor" not in render(odd, default_params(odd).with_changes(mm_tma=True))
    # A Triton without tensor descriptors gets plain loads.
    monkeypatch.setattr(emit_mm_module, "tma_available", lambda: False)
    assert "TensorDescriptor" not in render(plan, base.with_changes(mm_tma=True))


def test_mutation_reaches_the_hopper_variants_of_a_single_product() -> None:
    plan = plan_of(LONG_K.format(m=64, n=64, k=4096))
    rng = np.random.default_rng(7)
    params = default_params(plan)
    seen: set[str] = set()
    for _ in range(300):
        child = mutate(plan, params, rng, diagnosis=None)
        for name in ("mm_split_k", "mm_persistent", "mm_tma"):
            if getattr(child, name) != getattr(params, name):
                seen.add(name)
    assert seen == {"mm_split_k", "mm_persistent", "mm_tma"}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_split_k_first_candidate_passes_the_evaluators_precision_check(tmp_path: Path) -> None:
    plan = plan_of(L1_6_SCALED)
    reference, candidate = tmp_path / "ref.py", tmp_path / "cand.py"
    reference.write_text(L1_6_SCALED)
    candidate.write_text(render(plan, default_params(plan, H100)))
    done = subprocess.run(
        [sys.executable, "-m", "gpu_runner", str(reference), str(candidate), "--device", "cpu", "--json"],
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "correct", result.get("correctness")
    corr = result["correctness"]
    assert corr["err_vs_fp64"] <= _precision_bar(corr["ref_err_vs_fp64"])


def test_the_variants_bench_writes_candidates_the_static_gate_accepts(tmp_path: Path) -> None:
    reference = tmp_path / "ref.py"
    reference.write_text(L1_6_SCALED)
    assert gemm_variants.main([str(reference), str(tmp_path / "out"), "--gpu", "H100"]) == 0
    written = sorted(p.stem for p in (tmp_path / "out").glob("*.py"))
    assert written == ["first", "ieee", "no_split", "persistent", "persistent_tma", "tma"]
    for name in written:
        report = check_candidate((tmp_path / "out" / f"{name}.py").read_text(), L1_6_SCALED)
        assert report.syntax_error is None
        assert not report.findings, (name, report.findings)
    assert "_part" in (tmp_path / "out" / "first.py").read_text()  # split-K on the H100 model
    assert "_part" not in (tmp_path / "out" / "no_split.py").read_text()


@pytest.mark.timeout(300)
def test_padded_operands_of_an_unaligned_product_are_correct_and_first_on_a_gpu(tmp_path: Path) -> None:
    """KernelBench L1-8's rows (K = 2949, N = 5921) are not 16-byte aligned: the first candidate on
    a GPU model reads zero-padded copies (no K mask), correct in the interpreter with split-K,
    persistent programs and a fused epilogue, and accepted by the static gate."""
    odd = LONG_K.format(m=37, n=29, k=141)
    plan = plan_of(odd)
    assert default_params(plan, H100).mm_pad
    assert not default_params(plan_of(LONG_K.format(m=64, n=64, k=4096)), H100).mm_pad  # aligned rows
    small = {"mm_block_m": 16, "mm_block_n": 16, "mm_block_k": 16, "mm_warps": 1, "mm_group_m": 2, "mm_pad": True}
    first = default_params(plan).with_changes(**small)
    padded = render(plan, first)
    assert "_pa0 = torch.zeros((37, 144)" in padded
    assert "_pb0 = torch.zeros((144, 32)" in padded
    assert "b = tl.load(b_ptrs)" in padded  # B padded in both dims: no mask at all
    gate = check_candidate(padded, odd)
    assert not gate.rejected, gate.findings
    epilogue = EPILOGUE.format(n=29, product="x @ w", x_shape="37, 141", w_shape="141, 29")
    eplan = plan_of(epilogue)
    jobs: list[dict[str, Any]] = []
    labels: list[str] = []
    for source, p in ((odd, plan), (epilogue, eplan)):
        base = default_params(p).with_changes(**small)
        for split, persistent in ((1, False), (2, False), (1, True)):
            params = base.with_changes(mm_split_k=split, mm_persistent=persistent)
            label = f"{'epilogue' if source is epilogue else 'plain'} split={split} persistent={persistent}"
            text = render(p, params)
            assert "pa + rm[:, None]" in text, label
            assert (split > 1) == ("_part" in text), label
            jobs.append({"reference": source, "candidate": text, "seeds": [3], "atol": 1e-4, "rtol": 1e-4})
            labels.append(label)
    verdicts = check_in_subprocess(jobs, tmp_path, timeout=280)
    bad = [(label, v.detail) for label, v in zip(labels, verdicts, strict=True) if not v.ok]
    assert not bad, bad
