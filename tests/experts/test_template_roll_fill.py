"""SwinV2's other ops: ``torch.roll`` (``families/roll.py``), ``zeros_like`` / ``ones_like`` /
``full_like`` (``families/fill.py``) and unary ops folded on a ``torch.tensor`` number
(``composites``), against PyTorch on the CPU under the Triton interpreter, in the variants of
``template_interp``; and their declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

CASES: tuple[Case, ...] = (
    Case(
        "roll_two_dims_then_add",
        _model(
            "",
            "",
            "x, y",
            "return torch.roll(x, shifts=(-1, $S, 3), dims=(1, 2, -3)) + y",
            "torch.randn(2, 5, 6, $C), torch.randn(2, 5, 6, $C)",
            "",
        ),
        ({"S": -7, "C": 3},),
    ),
    Case(
        "roll_flattened_by_the_method",
        _model("", "", "x", "return x.roll($S) * 2.0", "torch.randn(3, 7)", ""),
        ({"S": 4},),
    ),
    Case(
        "zeros_like_in_a_concatenated_bias",
        _model(
            "",
            "self.w = nn.Parameter(torch.randn(3 * $D, $D))\n"
            "self.q = nn.Parameter(torch.randn($D))\nself.v = nn.Parameter(torch.randn($D))",
            "x",
            "bias = torch.cat((self.q, torch.zeros_like(self.v, requires_grad=False), self.v))\n"
            "return F.linear(x, self.w, bias)",
            "torch.randn(4, $D)",
            "",
        ),
        ({"D": 5},),
    ),
    Case(
        "ones_and_full_like_then_a_folded_clamp",
        _model(
            "",
            "self.s = nn.Parameter(torch.log(10 * torch.ones($H, 1)))",
            "x",
            "scale = torch.clamp(self.s, max=torch.log(torch.tensor(1.0 / 0.01))).exp()\n"
            "return x * scale + torch.ones_like(x) - torch.full_like(x, 0.25)",
            "torch.randn($H, 6)",
            "",
        ),
        ({"H": 3},),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64, "mm_block_m": 16, "mm_block_n": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CASES, _STRESS, tmp_path_factory.mktemp("interp-roll-fill"))


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_roll_fill_and_folded_constants_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return torch.roll(x > 0, 1, 0) * 2.0", "the input of torch.roll is bool"),
        ("return x + torch.zeros_like(x, dtype=torch.float64)", "another dtype"),
        ("return x + torch.full_like(x, float('nan'))", "not NaN"),
    ],
)
def test_what_roll_and_fill_do_not_cover_is_declined_with_the_reason(forward: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(4, 5)", ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
