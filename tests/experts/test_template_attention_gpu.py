"""The attention template and split whole graphs on a CUDA GPU (Triton compiled for real): ``pytest -m gpu``.

Every attention case (SDPA and the explicit ``softmax(Q @ K^T * scale) @ V`` forms, causal and
not) at its odd sizes with the default parameters, the smallest tiles and two seeded mutants;
float16 and bfloat16 operands; and the GPT-style block split into kernels and kept PyTorch calls
(``--torch-ops reference``) at a transformer-like size. Compared with ``_assert_close`` of
``test_template_gpu`` (outputs near eager, error against float64 at most 8x eager's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from actors.experts.template import Plan, analyse, default_params, mutate, render
from actors.experts.template.ir import KeepTorch
from tests.experts.template_attn_cases import ATTN_CASES
from tests.experts.template_cases import Case
from tests.experts.test_template_attention import _HALF_BODIES, _half_source
from tests.experts.test_template_gpu import _assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

_SMALLEST = {"attn_block_m": 16, "attn_block_n": 16, "attn_block_k": 16, "attn_block_d": 16, "attn_warps": 1}
_GPT_BLOCK = (Path(__file__).parents[1] / "data" / "gpt_block.py").read_text()


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _plan(source: str, keep_torch: KeepTorch = KeepTorch.NONE) -> Plan:
    plan = analyse(source, keep_torch=keep_torch)
    assert isinstance(plan, Plan), plan
    return plan


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: c.name)
def test_attention_kernels_match_pytorch_on_the_gpu(case: Case, tmp_path: Path) -> None:
    for source in case.sources():
        plan = _plan(source)
        first = default_params(plan)
        rng = np.random.default_rng(11)
        for params in (
            first,
            first.with_changes(**_SMALLEST),
            *(mutate(plan, first, rng, diagnosis=None) for _ in range(2)),
        ):
            _assert_close(source, render(plan, params), tmp_path)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("body", _HALF_BODIES)
def test_half_attention_matches_pytorch_on_the_gpu(dtype: str, body: str, tmp_path: Path) -> None:
    source = _half_source(dtype, body)
    plan = _plan(source)
    _assert_close(source, render(plan, default_params(plan)), tmp_path)


@pytest.mark.parametrize(("batch", "seqlen", "embd", "heads"), [(2, 7, 12, 3), (4, 256, 384, 6)])
def test_split_gpt_block_matches_pytorch_on_the_gpu(
    batch: int, seqlen: int, embd: int, heads: int, tmp_path: Path
) -> None:
    source = (
        _GPT_BLOCK.replace("batch_size = 2", f"batch_size = {batch}")
        .replace("max_seqlen = 7", f"max_seqlen = {seqlen}")
        .replace("n_embd = 12", f"n_embd = {embd}")
        .replace("n_head = 3", f"n_head = {heads}")
    )
    plan = _plan(source, KeepTorch.ALL)
    assert "attn" in plan.template.split("+")
    first = default_params(plan)
    for params in (first, mutate(plan, first, np.random.default_rng(5), diagnosis=None)):
        _assert_close(source, render(plan, params), tmp_path)
