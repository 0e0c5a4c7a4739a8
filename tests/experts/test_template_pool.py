"""The pooling template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_pool_cases`` at each of its sizes, in the variants of
``template_interp`` (default, stress, mutant, 64-bit indexing).
"""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.ir import NodeKind, PoolSpec
from tests.experts.template_cases import HEAD, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of
from tests.experts.template_pool_cases import POOL_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"pw_warps": 1, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(POOL_CASES, _STRESS, tmp_path_factory.mktemp("interp-pool"))


@pytest.mark.parametrize("case", [c.name for c in POOL_CASES])
def test_pooling_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_pool_cases_cover_max_avg_and_every_option() -> None:
    seen: set[str] = set()
    for case in POOL_CASES:
        for node in plan_of(case.sources()[0]).nodes:
            if node.kind is NodeKind.POOL:
                spec = PoolSpec.from_attrs(node.attrs)
                seen.add(f"{node.op}{len(spec.kernel)}d")
                seen.update(
                    n
                    for n, hit in (
                        ("dilation", max(spec.dilation) > 1),
                        ("no-pad-count", not spec.count_include_pad),
                        ("override", spec.divisor_override > 0),
                    )
                    if hit
                )
    assert {"max1d", "max2d", "max3d", "avg1d", "avg2d", "avg3d", "dilation", "no-pad-count", "override"} <= seen


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("return F.max_pool2d(x, 2, return_indices=True)[0]", "with_indices"),
        ("return F.adaptive_avg_pool2d(x, (3, 4))", "uneven"),
    ],
)
def test_uncovered_pooling_is_declined_with_its_reason(body: str, reason: str) -> None:
    source = HEAD + _model("", "", "x", body, "torch.randn(2, 3, 8, 10)", "")
    result = analyse(source)
    assert isinstance(result, Unsupported)
    assert reason in result.detail
