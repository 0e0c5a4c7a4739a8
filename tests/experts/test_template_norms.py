"""Batch norm, instance norm, vector norms and a whole conv block, under the Triton interpreter.

Every reference of ``template_norm_cases`` at each of its sizes, in the variants of
``template_interp`` (default, stress with multi-pass rows and no fusion, mutant, 64-bit).
"""

from __future__ import annotations

import pytest

from actors.experts.template.interp_check import Verdict
from tests.experts.template_interp import assert_all_correct, interp_verdicts
from tests.experts.template_norm_cases import GRAPH_CASES, NORM_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_one_pass": False, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts((*NORM_CASES, *GRAPH_CASES), _STRESS, tmp_path_factory.mktemp("interp-norm"))


@pytest.mark.parametrize("case", [c.name for c in (*NORM_CASES, *GRAPH_CASES)])
def test_norm_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])
