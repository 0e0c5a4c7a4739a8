"""Split (two-stage) reductions over few, huge rows, against PyTorch under the interpreter.

The split thresholds are lowered for these tests (rows of 1024+ elements, 16 partial rows), so
small references take the same path that KernelBench's 4M-element rows and 1G-element losses
take: partial reductions over ``(outer, S, R / S)`` in parallel, then over ``S``. Sums, maxima,
minima; means, softmax, layer/RMS/group/batch/instance norm (statistics merged over the parts)
and a loss to a scalar, at sizes where ``S`` must
shrink to divide the row, and a row that no power of two divides (not split).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from actors.experts.template import lower
from actors.experts.template.interp_check import Verdict
from actors.experts.template.ir import NodeKind
from tests.experts.template_cases import Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of

pytestmark = pytest.mark.timeout(300)

_STRESS = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_one_pass": False, "pw_ept": 1}

SPLIT_CASES: tuple[Case, ...] = (
    Case(
        "mse_to_scalar",
        _model("", "", "p, t", "return torch.mean((p - t) ** 2)", "torch.rand(48, 50), torch.rand(48, 50)", ""),
        ({},),
    ),
    Case(
        "layer_norm_huge_rows",
        _model("", "self.ln = nn.LayerNorm((64, 40))", "x", "return self.ln(x)", "torch.randn($B, 64, 40)", ""),
        ({"B": 3}, {"B": 1}),
    ),
    Case(
        "softmax_and_rms_huge_rows",
        _model(
            "",
            "",
            "x",
            "y = torch.softmax(x, dim=-1)\nreturn y + F.rms_norm(x, (x.shape[-1],))",
            "torch.randn(2, 3000)",
            "",
        ),
        ({},),
    ),
    Case(
        "max_min_sum_over_trailing_dims",
        _model(
            "",
            "",
            "x",
            "return torch.amax(x, dim=(1, 2)) - torch.amin(x, dim=(1, 2)) + x.sum(dim=(1, 2)) * 0.01",
            "torch.randn(3, 36, 40)",
            "",
        ),
        ({},),
    ),
    Case(
        "group_norm_huge_groups",
        _model("", "self.gn = nn.GroupNorm(2, 4)", "x", "return self.gn(x)", "torch.randn(2, 4, 32, 40)", ""),
        ({},),
    ),
    Case(
        "batch_and_instance_norm_huge_planes",
        _model(
            "",
            "self.bn = nn.BatchNorm2d(3)\nself.inorm = nn.InstanceNorm2d(3)",
            "x",
            "x = x * 0.5 + 40.0\nreturn self.bn(x) + self.inorm(x)",
            "torch.randn($B, 3, 32, 40)",
            "",
        ),
        ({"B": 2}, {"B": 1}),
    ),
    Case("odd_row_not_split", _model("", "", "x", "return x.sum(dim=1)", "torch.randn(2, 2049)", ""), ({},)),
)


@pytest.fixture(scope="module")
def _small_split() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lower, "SPLIT_MIN_ROW", 1024)
        mp.setattr(lower, "SPLIT_ROWS", 16)
        yield


@pytest.fixture(scope="module")
def verdicts(_small_split: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts(SPLIT_CASES, _STRESS, tmp_path_factory.mktemp("interp-split"))


@pytest.mark.parametrize("case", [c.name for c in SPLIT_CASES])
def test_split_reductions_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def _reduced_extents(source: str) -> list[int]:
    plan = plan_of(source)
    extents = []
    for node in plan.nodes:
        if node.kind is NodeKind.RED:
            shape = plan.nodes[node.tensor_args()[0]].shape
            extents.append(math.prod(shape[node.dims[0] : node.dims[1]]))
    return extents


@pytest.mark.usefixtures("_small_split")
def test_huge_rows_are_reduced_in_two_stages_and_odd_rows_whole() -> None:
    by_name = {c.name: c for c in SPLIT_CASES}
    mse = _reduced_extents(by_name["mse_to_scalar"].sources()[0])
    assert sorted(mse) == [16, 150]
    assert _reduced_extents(by_name["odd_row_not_split"].sources()[0]) == [2049]
