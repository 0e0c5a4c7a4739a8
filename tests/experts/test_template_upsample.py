"""Resampling (``families/upsample.py``): ``F.interpolate`` and ``nn.Upsample`` in the nearest and
linear modes, by factors and to sizes, with and without aligned corners, against PyTorch on the CPU
under the Triton interpreter, in the variants of ``template_interp``; and their declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

CASES: tuple[Case, ...] = (
    Case(
        "bilinear_by_two_then_joined_to_a_skip",
        _model(
            "",
            "",
            "x, skip",
            "up = F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False)\n"
            "return torch.cat([up, skip], dim=1) * 0.5",
            "torch.randn(2, 3, $H, 4), torch.randn(2, 2, 2 * $H, 8)",
            "",
        ),
        ({"H": 3}, {"H": 5}),
    ),
    Case(
        "bilinear_to_a_size_with_aligned_corners_module",
        _model(
            "",
            "self.up = nn.Upsample(size=($H, 11), mode='bilinear', align_corners=True)",
            "x",
            "return torch.relu(self.up(x))",
            "torch.randn(2, 3, 4, 5)",
            "",
        ),
        ({"H": 7},),
    ),
    Case(
        "nearest_by_a_factor_and_to_an_odd_size",
        _model(
            "",
            "self.up = nn.Upsample(scale_factor=3)",
            "x",
            "return self.up(x) + F.interpolate(x, size=(3 * $H, 15), mode='nearest')",
            "torch.randn(2, 2, $H, 5)",
            "",
        ),
        ({"H": 4},),
    ),
    Case(
        "nearest_exact_down_and_linear_of_a_sequence",
        _model(
            "",
            "",
            "x, s",
            "a = F.interpolate(x, size=(3, $W - 3), mode='nearest-exact')\n"
            "b = F.interpolate(s, scale_factor=1.5, mode='linear')\n"
            "return a.sum() + b",
            "torch.randn(2, 3, 7, $W), torch.randn(2, 4, 6)",
            "",
        ),
        ({"W": 10},),
    ),
    Case(
        "trilinear_of_a_volume",
        _model(
            "",
            "",
            "x",
            "return F.interpolate(x, scale_factor=(2, 2, 1), mode='trilinear') * 2.0",
            "torch.randn(2, 2, 3, $H, 4)",
            "",
        ),
        ({"H": 3},),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64, "mm_block_m": 16, "mm_block_n": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CASES, _STRESS, tmp_path_factory.mktemp("interp-upsample"))


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_resampling_matches_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return F.interpolate(x, scale_factor=2, mode='bicubic')", "mode 'bicubic' is not covered"),
        ("return F.interpolate(x, scale_factor=0.5, mode='bilinear', antialias=True)", "antialias"),
        ("return F.interpolate(x, size=(2, 2), mode='area')", "mode 'area' is not covered"),
    ],
)
def test_what_resampling_does_not_cover_is_declined_with_the_reason(forward: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(2, 3, 4, 4)", ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
