"""Losses and reductions to a scalar against PyTorch, under the Triton interpreter.

Every reference of ``template_loss_cases`` at each of its sizes, in the variants of
``template_interp``, and the declines of what the loss lowering does not cover.
"""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts
from tests.experts.template_loss_cases import LOSS_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_one_pass": False, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(LOSS_CASES, _STRESS, tmp_path_factory.mktemp("interp-loss"))


@pytest.mark.parametrize("case", [c.name for c in LOSS_CASES])
def test_loss_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("init", "body", "reason"),
    [
        ("", "return F.mse_loss(p, t, reduction='batchmean')", "batchmean"),
        ("", "return F.triplet_margin_loss(p, t, p * 2, swap=True)", "swap"),
        ("", "return F.kl_div(p, t, size_average=False)", "size_average"),
        ("", "return F.cross_entropy(p, t.argmax(dim=1), label_smoothing=1.5)", "label_smoothing"),
        ("self.ce = nn.CrossEntropyLoss(weight=torch.ones(9))", "return self.ce(p, t.argmax(dim=1))", "weight"),
        ("", "return F.cross_entropy(p.view(4, 3, 3), t.view(4, 3, 3).argmax(dim=1))", "3-D input"),
        ("", "return F.cross_entropy(p, t.argmax(dim=1), reduction='batchmean')", "reduction"),
        ("", "return p + (t.argmax(dim=1, keepdim=True) + 1)", "int64 result"),
        ("", "return F.gaussian_nll_loss(p, t, t.abs())", "item() cannot be called on meta tensors"),
        ("", "return F.poisson_nll_loss(p, t.abs(), full=True)", "Stirling"),
    ],
)
def test_uncovered_losses_are_declined_with_their_reason(init: str, body: str, reason: str) -> None:
    result = analyse(HEAD + _model("", init, "p, t", body, "torch.randn(4, 9), torch.randn(4, 9)", ""))
    assert isinstance(result, Unsupported)
    assert reason in result.detail
