"""The GEMM family's Hopper-class variants on a CUDA GPU (``pytest -m gpu``): split-K, persistent
and TMA (tensor descriptors on compute capability 9+, plain loads below) compiled by Triton for
real, and the split-K first candidate for KernelBench L1-6 at its published size (256 x 256,
K = 524288) under the evaluator's precision bar (10x eager's error against float64, or 1e-5)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from actors.experts.template import default_params, render
from actors.experts.template.emit_mm import tma_available
from actors.experts.template.hardware import detect
from tests.experts.template_interp import plan_of
from tests.experts.test_template_gemm_variants import EPILOGUE, LONG_K
from tests.experts.test_template_gpu import _assert_close, _rel_l2, _run

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def test_every_gemm_variant_matches_pytorch_on_the_gpu(tmp_path: Path) -> None:
    sources = [
        EPILOGUE.format(n=1000, product="x @ w", x_shape="300, 2048", w_shape="2048, 1000"),
        EPILOGUE.format(n=256, product="torch.matmul(x, w)", x_shape="4, 100, 512", w_shape="512, 256"),
        EPILOGUE.format(n=384, product="x @ w.t()", x_shape="200, 1024", w_shape="384, 1024"),
    ]
    for source in sources:
        plan = plan_of(source)
        first = default_params(plan)
        for split, persistent, tma, precision in itertools.product(
            (1, 8), (False, True), (False, True), ("ieee", "tf32x3")
        ):
            params = first.with_changes(mm_split_k=split, mm_persistent=persistent, mm_tma=tma, mm_precision=precision)
            _assert_close(source, render(plan, params), tmp_path)


def test_tma_variant_uses_descriptors_on_hopper(tmp_path: Path) -> None:
    if torch.cuda.get_device_capability()[0] < 9 or not tma_available():
        pytest.skip("tensor descriptors need compute capability 9 and a Triton that has them")
    source = LONG_K.format(m=1024, n=1024, k=1024)
    plan = plan_of(source)
    candidate = render(plan, default_params(plan).with_changes(mm_tma=True, mm_persistent=True))
    assert "TensorDescriptor(" in candidate
    _assert_close(source, candidate, tmp_path)


def test_kernelbench_l1_6_first_candidate_is_split_k_and_clears_the_precision_bar(tmp_path: Path) -> None:
    kb = Path.home() / "kb" / "KernelBench" / "level1"
    found = sorted(kb.glob("6_*.py"))
    source = found[0].read_text() if found else LONG_K.format(m=256, n=256, k=524288)
    plan = plan_of(source)
    hw = detect(torch.cuda.get_device_name())
    first = default_params(plan, hw)
    assert first.mm_split_k > 1
    expected, actual, exact = _run(source, render(plan, first), tmp_path)
    err, ref_err = _rel_l2(actual, exact), _rel_l2(expected, exact)
    assert err <= max(10 * ref_err, 1e-5), (err, ref_err, first.mm_precision)
    ieee = first.with_changes(mm_precision="ieee")
    expected, actual, exact = _run(source, render(plan, ieee), tmp_path)
    assert _rel_l2(actual, exact) <= max(10 * _rel_l2(expected, exact), 1e-5)
