"""The convolution, pooling, norm, scan and loss templates on a CUDA GPU: ``pytest -m gpu``.

Every case of those families at its small sizes, rendered with the default parameters, the
smallest tiles with the least fusion, the ``tf32x3`` convolution dot, the other order of the
convolution's reduction (``conv_taps_outer``), taps outside with the other input tile layout
(``conv_a_transposed``) and two seeded mutants,
compiled by Triton for real and compared with the reference on the GPU (``_assert_close`` of
``test_template_gpu``: outputs within 1e-4 or a few times eager's own error, error against
float64 at most 8x eager's; eager convolutions run in TF32 there, the template's in fp32).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, render
from tests.experts.template_cases import Case
from tests.experts.template_conv_cases import CONV_CASES
from tests.experts.template_loss_cases import LOSS_CASES
from tests.experts.template_norm_cases import NORM_CASES
from tests.experts.template_pool_cases import POOL_CASES
from tests.experts.template_scan_cases import SCAN_CASES
from tests.experts.test_template_gpu import _assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

_SMALLEST = {
    "conv_block_m": 16,
    "conv_block_n": 16,
    "conv_block_k": 16,
    "conv_warps": 1,
    "row_block_m": 2,
    "row_block_r": 64,
    "row_block_i": 8,
    "row_one_pass": False,
    "pw_ept": 1,
    "pw_warps": 1,
}


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _variants(plan: Plan) -> list[TemplateParams]:
    first = default_params(plan)
    epilogue, prologue = plan.fusions[-1]
    rng = np.random.default_rng(7)
    return [
        first,
        first.with_changes(**_SMALLEST, fuse_epilogue=epilogue, fuse_prologue=prologue),
        # a dot needs 16 output channels a tile; narrow defaults sum with fma and fewer
        first.with_changes(conv_precision="tf32x3", conv_block_n=max(16, first.conv_block_n)),
        first.with_changes(conv_taps_outer=not first.conv_taps_outer),
        first.with_changes(conv_taps_outer=True, conv_a_transposed=not first.conv_a_transposed),
        mutate(plan, first, rng, diagnosis=None),
        mutate(plan, first, rng, diagnosis=None),
    ]


_CASES = [*CONV_CASES, *POOL_CASES, *NORM_CASES, *SCAN_CASES, *LOSS_CASES]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: c.name)
def test_family_kernels_match_pytorch_on_the_gpu(case: Case, tmp_path: Path) -> None:
    for source in case.sources():
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        for params in _variants(plan):
            _assert_close(source, render(plan, params), tmp_path)
