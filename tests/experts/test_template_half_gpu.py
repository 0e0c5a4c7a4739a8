"""Half-precision products and convolutions of the template expert on a CUDA GPU (``pytest -m
gpu``): float16 and bfloat16 operands go into ``tl.dot`` as they are (the interpreter's widening is
off: ``_KF_INTERPRETED`` is 0), the outputs keep the model's type, and the error against float64 is
at most a little over eager's (cuBLAS and cuDNN also sum half products in float32 and round the
result once; the candidate rounds its fused epilogue once where eager rounds after every op)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.experts.template import TemplateParams, default_params, render
from actors.experts.template.hardware import detect
from tests.experts.template_interp import plan_of
from tests.experts.test_template_gpu import _load, _rel_l2, _run
from tests.experts.test_template_half import CONV, PRODUCT

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

PRODUCTS = [
    PRODUCT.format(n=1000, product="x @ w", x_shape="300, 2048", w_shape="2048, 1000", dtype="bfloat16"),
    PRODUCT.format(n=768, product="x @ w", x_shape="1024, 4096", w_shape="4096, 768", dtype="float16"),
    PRODUCT.format(n=384, product="x @ w.transpose(-1, -2)", x_shape="4, 200, 1024", w_shape="4, 384, 1024",
                   dtype="bfloat16"),
]  # fmt: skip

CONVS = [
    CONV.format(cls="Conv2d", cin=64, cout=128, extra="padding=1", x_shape="16, 64, 56, 56", dtype="bfloat16"),
    CONV.format(cls="Conv2d", cin=3, cout=64, extra="stride=2", x_shape="8, 3, 224, 224", dtype="float16"),
    CONV.format(cls="Conv2d", cin=128, cout=128, extra="groups=128, padding=1", x_shape="8, 128, 28, 28",
                dtype="bfloat16"),
    CONV.format(cls="ConvTranspose2d", cin=64, cout=32, extra="stride=2, padding=1", x_shape="8, 64, 32, 32",
                dtype="float16"),
    CONV.format(cls="Conv3d", cin=16, cout=32, extra="", x_shape="4, 16, 12, 20, 20", dtype="bfloat16"),
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _check(source: str, params: TemplateParams, tmp_path: Path) -> None:
    plan = plan_of(source)
    candidate = render(plan, params)
    assert _load(candidate, tmp_path)._KF_INTERPRETED == 0
    expected, actual, exact = _run(source, candidate, tmp_path)
    assert actual.dtype == expected.dtype
    err, ref_err = _rel_l2(actual, exact), _rel_l2(expected, exact)
    assert err <= 1.25 * ref_err, (err, ref_err, params)


@pytest.mark.parametrize("source", PRODUCTS)
def test_half_products_match_float64_as_eager_does(source: str, tmp_path: Path) -> None:
    plan = plan_of(source)
    first = default_params(plan, detect(torch.cuda.get_device_name()))
    for params in (first, first.with_changes(mm_tma=True, mm_persistent=True), first.with_changes(mm_split_k=4)):
        _check(source, params, tmp_path)


@pytest.mark.parametrize("source", CONVS)
def test_half_convolutions_match_float64_as_eager_does(source: str, tmp_path: Path) -> None:
    plan = plan_of(source)
    first = default_params(plan, detect(torch.cuda.get_device_name()))
    for params in (first, first.with_changes(conv_layout="nhwc"), first.with_changes(conv_taps_outer=False)):
        _check(source, params, tmp_path)
