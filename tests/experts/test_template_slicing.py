"""The slicing family (``families/slicing.py``: ``x[:, -1, :]``, ``x[t]``, ``x[..., 1:4]``, ``x[:, 0::2]``,
``x[:, None]``) against PyTorch, on the CPU under the Triton interpreter, in the variants of
``template_interp`` (default, stress, mutant, 64-bit indexing); how it fuses; and its declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.lowering import registered
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of

pytestmark = pytest.mark.timeout(300)

SLICING_CASES: tuple[Case, ...] = (
    Case(
        "last_step_after_a_linear_then_tanh",
        _model(
            "",
            "self.fc = nn.Linear(6, $H)",
            "x",
            "return torch.tanh(self.fc(x)[:, -1, :]) * 2.0",
            "torch.randn(3, $T, 6)",
            "",
        ),
        ({"T": 4, "H": 5}, {"T": 1, "H": 3}),
    ),
    Case(
        "prefix_of_the_last_dim_then_softmax",
        _model("", "", "x", "return torch.softmax(x[:, :$K], dim=-1)", "torch.randn(3, 9)", ""),
        ({"K": 5}, {"K": 1}),
    ),
    Case(
        "prefix_after_an_ellipsis_then_relu",
        _model("", "", "x", "return torch.relu(x[..., :$K]) - 0.5", "torch.randn(2, 3, 7)", ""),
        ({"K": 3}, {"K": 6}),
    ),
    Case(
        "integer_index_on_dim_zero",
        _model("", "", "x, y", "return x[$I] * 2.0 + y", "torch.randn(3, 4, 5), torch.randn(4, 5)", ""),
        ({"I": 1}, {"I": -1}),
    ),
    Case(
        "middle_of_the_last_dim_after_an_ellipsis",
        _model("", "", "x", "return x[..., 1:4] + 1.0", "torch.randn(2, $C, 7)", ""),
        ({"C": 3}, {"C": 1}),
    ),
    Case(
        "a_new_axis_and_a_slice",
        _model("", "", "x, y", "return x[:, None, 1:4] * y", "torch.randn($B, 5), torch.randn($B, 1, 3)", ""),
        ({"B": 3}, {"B": 2}),
    ),
    Case(
        "negative_bounds_on_two_dims_then_sigmoid",
        _model("", "", "x", "return torch.sigmoid(x[:, -$N:-1, 2:])", "torch.randn(2, 7, 5)", ""),
        ({"N": 5}, {"N": 2}),
    ),
    Case(
        "a_bound_computed_in_forward_and_a_single_element",
        _model("", "", "x", "return x[:, : x.size(1) // 2] * 3.0 + x[-1, -1]", "torch.randn($B, 9)", ""),
        ({"B": 3}, {"B": 1}),
    ),
    Case(
        "a_causal_mask_buffer_cut_to_the_sequence",
        _model(
            "",
            'self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 8, 8))',
            "x",
            "att = x.masked_fill(self.bias[:, :$T, :$T] == 0, float('-inf'))\nreturn torch.softmax(att, dim=-1)",
            "torch.randn(2, $T, $T)",
            "",
        ),
        ({"T": 5}, {"T": 3}),
    ),
    Case(
        "a_slice_of_a_slice_read_as_one",
        _model("", "", "x", "return torch.exp(x[:, 1:][:, -$K:-1])", "torch.randn(3, 9)", ""),
        ({"K": 4}, {"K": 8}),
    ),
    Case(
        "a_bool_mask_input_sliced",
        _model(
            "",
            "",
            "x, m",
            "return x.masked_fill(m[:, 1:$K], -2.0)",
            "torch.randn(3, $K - 1), torch.rand(3, 7) > 0.5",
            "",
        ),
        ({"K": 5}, {"K": 7}),
    ),
    Case(
        "a_swin_patch_merge_by_steps_of_two",
        _model(
            "",
            "",
            "x",
            "x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]\n"
            "x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]\n"
            "return torch.cat([x0, x1, x2, x3], -1) * 2.0",
            "torch.randn(2, $H, 6, 3)",
            "",
        ),
        ({"H": 4}, {"H": 6}),
    ),
    Case(
        "steps_with_bounds_and_a_stepped_slice_of_a_slice",
        _model(
            "",
            "",
            "x",
            "return x[:, 1:][:, ::3] * 2.0 + x[:, 1:-1:2][:, :2].sum(-1, keepdim=True)",
            "torch.randn(3, $N)",
            "",
        ),
        ({"N": 10}, {"N": 12}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(SLICING_CASES, _STRESS, tmp_path_factory.mktemp("interp-slicing"))


@pytest.mark.parametrize("case", [c.name for c in SLICING_CASES])
def test_slicing_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_family_is_one_module_registered_for_its_op() -> None:
    assert registered()["slice"] == "actors.experts.template.families.slicing"


def test_the_elementwise_ops_after_a_slice_fuse_into_its_kernel() -> None:
    plan = plan_of(
        HEAD
        + _model(
            "", "self.fc = nn.Linear(6, 5)", "x", "return torch.relu(self.fc(x)[:, -1, :]) * 2.0 + 1.0",
            "torch.randn(3, 4, 6)", "",
        )
    )  # fmt: skip
    slices = [n for n in plan.nodes if n.op == "slice"]
    assert len(slices) == 1
    assert slices[0].shape == (3, 5)
    # starts, then counts, per source dim: -1 for a dim taken whole (the same at every size)
    assert slices[0].attrs == (0.0, 3.0, 0.0, -1.0, 1.0, -1.0)
    assert plan.template == "mm+pw"  # the product, then one kernel: the slice and relu, mul, add


def test_a_slice_of_a_slice_is_one_slice_of_the_first_ones_source() -> None:
    plan = plan_of(HEAD + _model("", "", "x", "return x[:, 1:][:, 2:5] * 2.0", "torch.randn(3, 9)", ""))
    live = [plan.nodes[n] for n in sorted(plan.live()) if plan.nodes[n].op == "slice"]
    assert [(n.shape, n.attrs) for n in live] == [((3, 3), (0.0, 3.0, -1.0, 3.0))]  # dim 0 whole
    assert plan.template == "pw"


def test_a_stepped_slice_of_a_slice_is_one_slice_with_the_steps_multiplied() -> None:
    plan = plan_of(HEAD + _model("", "", "x", "return x[:, 1:][:, 2::3] * 2.0", "torch.randn(3, 12)", ""))
    live = [plan.nodes[n] for n in sorted(plan.live()) if plan.nodes[n].op == "slice"]
    # starts, counts (dim 0 whole), then steps: columns 3, 6, 9 of the source
    assert [(n.shape, n.attrs) for n in live] == [((3, 3), (0.0, 3.0, -1.0, 3.0, 1.0, 3.0))]
    assert plan.template == "pw"


@pytest.mark.parametrize("index", ["[:, None]", "[...]", "[0]"])
def test_a_selection_of_the_whole_tensor_is_a_view_without_a_kernel(index: str) -> None:
    plan = plan_of(HEAD + _model("", "", "x", f"return x{index} * 2.0", "torch.randn(1, 4)", ""))
    assert not [n for n in plan.nodes if n.op == "slice"]
    assert plan.template == "pw"


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return x[:, 5:2] * 2.0", "selects no element"),
        ("return x[:, x.argmax(1)] * 2.0", "indexing by a tensor is covered only as x[idx]"),
    ],
)
def test_what_the_family_does_not_cover_is_declined_with_the_reason(forward: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(4, 6)", ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail


@pytest.mark.parametrize(
    "forward",
    [
        "x = x * 1.0\ny = x[:, 1:3]\ny.mul_(2.0)\nreturn x + 0.0",  # the write shows through the base
        "x = x * 1.0\ny = x[:, 1:3]\nx.mul_(2.0)\nreturn y + 0.0",  # and through the slice
    ],
)
def test_an_in_place_write_through_a_slice_is_declined(forward: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(3, 9)", ""))
    assert isinstance(plan, Unsupported), plan
    assert "in-place" in (plan.detail or ""), plan.detail
