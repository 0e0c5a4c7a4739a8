"""The scan template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_scan_cases`` at each of its sizes, in the variants of
``template_interp`` (default, stress with the smallest chunks and no fusion, mutant, 64-bit),
and the declines of what scans do not cover.
"""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts
from tests.experts.template_scan_cases import SCAN_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_warps": 1, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(SCAN_CASES, _STRESS, tmp_path_factory.mktemp("interp-scan"))


@pytest.mark.parametrize("case", [c.name for c in SCAN_CASES])
def test_scan_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("return torch.cumsum(x, 1, dtype=torch.float64)", "dtype"),
        ("return x.flip(1) + 1.0", "FlipRef"),
        ("return torch.cumsum(x.flip(0), 1)", "flipped along another dim"),
    ],
)
def test_uncovered_scans_are_declined_with_their_reason(body: str, reason: str) -> None:
    result = analyse(HEAD + _model("", "", "x", body, "torch.randn(4, 9)", ""))
    assert isinstance(result, Unsupported)
    assert reason in result.detail
