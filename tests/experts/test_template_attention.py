"""The attention template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_attn_cases`` at each of its sizes, in the variants of
``template_interp``, and the declines of what attention does not cover.
"""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_attn_cases import ATTN_CASES
from tests.experts.template_cases import HEAD, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

_STRESS = {"attn_block_m": 16, "attn_block_n": 16, "attn_block_k": 16, "attn_block_d": 16, "attn_warps": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(ATTN_CASES, _STRESS, tmp_path_factory.mktemp("interp-attn"))


@pytest.mark.parametrize("case", [c.name for c in ATTN_CASES])
def test_attention_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("return F.scaled_dot_product_attention(q, k, v, attn_mask=m)", "attn_mask"),
        ("return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)", "dropout"),
    ],
)
def test_uncovered_attention_is_declined_with_its_reason(body: str, reason: str) -> None:
    inputs = "torch.rand(2, 4, 8), torch.rand(2, 4, 8), torch.rand(2, 4, 8), torch.rand(4, 4)"
    result = analyse(HEAD + _model("", "", "q, k, v, m", body, inputs, ""))
    assert isinstance(result, Unsupported)
    assert reason in result.detail
