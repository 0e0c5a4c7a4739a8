"""The concatenation family (``families/concat.py``: ``torch.cat`` and its spellings) against
PyTorch, on the CPU under the Triton interpreter, in the variants of ``template_interp`` (default,
stress, mutant, 64-bit indexing); and its declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.lowering import registered
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

CONCAT_CASES: tuple[Case, ...] = (
    Case(
        "two_conv_branches_on_channels_relu",
        _model(
            "",
            "self.a = nn.Conv2d(4, 6, 1)\nself.b = nn.Conv2d(4, 5, 3, padding=1)",
            "x",
            "return torch.relu(torch.cat([self.a(x), self.b(x)], 1)) * 0.5",
            "torch.randn($B, 4, 7, $W)",
            "",
        ),
        ({"B": 2, "W": 7}, {"B": 1, "W": 5}),
    ),
    Case(
        "three_inputs_on_the_last_dim_negative_zero",
        _model(
            "",
            "",
            "x, y, z",
            "return torch.concat((x, -y * 0.0, z - 1.0), dim=-1)",
            "torch.randn(3, $N, 4), torch.randn(3, $N, 1), torch.randn(3, $N, 7)",
            "",
        ),
        ({"N": 5}, {"N": 2}),
    ),
    Case(
        "rows_then_softmax",
        _model(
            "",
            "",
            "x, y",
            "return torch.softmax(torch.cat([torch.tanh(x), y], dim=0), dim=1)",
            "torch.randn($M, 9), torch.randn(4, 9)",
            "",
        ),
        ({"M": 6}, {"M": 1}),
    ),
    Case(
        "a_dense_block_of_twenty_one_parts_in_two_steps",
        _model(
            "",
            "",
            "x, y",
            "parts = [y]\nfor i in range(20):\n    parts.append(torch.tanh(x) * (i - 9.5))\n"
            "return torch.cat(parts, 1) + 1.0",
            "torch.randn(2, $C, 3), torch.randn(2, 1, 3)",
            "",
        ),
        ({"C": 2}, {"C": 1}),
    ),
    Case(
        "an_unrolled_recurrence_stacked_on_a_middle_dim",
        _model(
            "",
            "self.step = nn.Linear(6, 3)",
            "x, h",
            "outs = []\nfor t in range($T):\n    h = torch.tanh(self.step(torch.cat((x, h), dim=1)))\n"
            "    outs.append(h * 2.0)\nreturn torch.stack(outs, dim=1)",
            "torch.randn(2, 3), torch.randn(2, 3)",
            "",
        ),
        ({"T": 3}, {"T": 1}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CONCAT_CASES, _STRESS, tmp_path_factory.mktemp("interp-concat"))


@pytest.mark.parametrize("case", [c.name for c in CONCAT_CASES])
def test_concat_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_family_is_one_module_registered_for_its_op() -> None:
    assert registered()["cat"] == "actors.experts.template.families.concat"
    assert registered()["stack"] == "actors.experts.template.families.concat"


@pytest.mark.parametrize(
    ("forward", "inputs", "reason"),
    [
        ("return torch.cat([x, y], 0)", "torch.randn(2, 3), torch.randn(2, 3).half()", "dtypes"),
        (
            "return torch.stack([x, y], 0)",
            "torch.randn(2, 3), torch.randn(2, 3).half()",
            "torch.stack of parts of dtypes",
        ),
    ],
)
def test_what_the_family_does_not_cover_is_declined_with_the_reason(forward: str, inputs: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x, y", forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail


@pytest.mark.parametrize("parts", [17, 21, 300])
def test_more_than_sixteen_parts_join_in_steps_of_at_most_sixteen(parts: int) -> None:
    plan = analyse(
        HEAD
        + _model(
            "", "", "x, y", f"return torch.cat([x] * {parts - 1} + [y], 0)", "torch.randn(2, 3), torch.randn(1, 3)", ""
        )
    )
    assert not isinstance(plan, Unsupported), plan
    cats = [n for n in plan.nodes if n.op == "cat"]
    assert all(2 <= len(n.args) <= 16 for n in cats), [len(n.args) for n in cats]
    assert plan.nodes[plan.output].shape == (2 * (parts - 1) + 1, 3)
