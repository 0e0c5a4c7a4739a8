"""The pad family (``families/pad.py``: ``F.pad(x, pad, mode, value)`` in its four modes, the pad
modules and ``torch.constant_pad_nd``) against PyTorch, on the CPU under the Triton interpreter, in the
variants of ``template_interp`` (default, stress, mutant, 64-bit indexing); how it fuses; and
its declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.lowering import registered
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of

pytestmark = pytest.mark.timeout(300)

PAD_CASES: tuple[Case, ...] = (
    Case(
        "convolutions_padded_in_their_padding_mode",
        _model(
            "",
            "self.a = nn.Conv2d(3, 4, 3, padding=1, padding_mode='reflect')\n"
            "self.b = nn.Conv1d(3, 2, 3, padding=2, dilation=2, padding_mode='circular')\n"
            "self.c = nn.Conv2d(4, 2, (3, 1), padding=(2, 0), padding_mode='replicate')",
            "x, y",
            "return self.c(torch.relu(self.a(x))), self.b(y)",
            "torch.randn(2, 3, 6, $W), torch.randn(2, 3, 9)",
            "",
        ),
        ({"W": 5},),
    ),
    Case(
        "reflect_replicate_and_circular_modes_and_their_modules",
        _model(
            "",
            "self.r = nn.ReflectionPad2d((1, 2, $P, 0))\nself.e = nn.ReplicationPad1d(3)\n"
            "self.c = nn.CircularPad2d(1)\nself.z = nn.ZeroPad2d(1)\nself.k = nn.ConstantPad1d((2, 0), 0.5)",
            "x, y",
            "a = self.r(x) * 2.0 + 1.0\n"
            "b = self.e(y) - F.pad(y, (0, 2), mode='reflect').sum(-1, keepdim=True)\n"
            "c = self.c(x) + self.z(x) + F.pad(x, (2, 0, 1, 1), mode='replicate')\n"
            "return a, b, c, self.k(y), F.pad(x.unsqueeze(1), (1, 1, 1, 0, 1, 1), mode='reflect')",
            "torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6)",
            "",
        ),
        ({"P": 2}, {"P": 0}),
    ),
    Case(
        "both_dims_of_a_matrix_with_a_nonzero_value",
        _model("", "", "x", "return F.pad(x, [1, 2, $T, 0], value=1.5)", "torch.randn(3, 5)", ""),
        ({"T": 3}, {"T": 0}),
    ),
    Case(
        "height_and_width_of_a_channels_last_image_then_elementwise",
        _model(
            "",
            "",
            "x",
            'return torch.relu(F.pad(x, [0, 0, 2, 1, $P, 2], "constant", 0)) * 2.0 + 1.0',
            "torch.randn(2, 4, 5, 3)",
            "",
        ),
        ({"P": 1}, {"P": 3}),
    ),
    Case(
        "every_dim_of_a_4d_tensor_after_a_linear",
        _model(
            "",
            "self.fc = nn.Linear(6, $H)",
            "x",
            "return torch.tanh(F.pad(self.fc(x), [1, 1, 0, 2, 1, 0, 0, 1], value=-0.25))",
            "torch.randn(2, 3, 4, 6)",
            "",
        ),
        ({"H": 5}, {"H": 1}),
    ),
    Case(
        "negative_pads_crop_and_constant_pad_nd",
        _model(
            "",
            "",
            "x, y",
            "return torch.constant_pad_nd(x, [-1, 2, 1, -$K], 3.0) - F.pad(y, [0, 1], value=-1.0)",
            "torch.randn(2, 7, 5), torch.randn(2, 8 - $K, 5)",
            "",
        ),
        ({"K": 2}, {"K": 4}),
    ),
    Case(
        "a_pad_of_minus_infinity_then_softmax",
        _model(
            "", "", "x", "return torch.softmax(F.pad(x, [0, $N], value=float('-inf')), dim=-1)", "torch.randn(3, 6)", ""
        ),
        ({"N": 3}, {"N": 1}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(PAD_CASES, _STRESS, tmp_path_factory.mktemp("interp-pad"))


@pytest.mark.parametrize("case", [c.name for c in PAD_CASES])
def test_pad_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_family_is_one_module_registered_for_its_op() -> None:
    assert registered()["pad"] == "actors.experts.template.families.pad"


def test_the_elementwise_ops_after_a_pad_fuse_into_its_kernel() -> None:
    plan = plan_of(
        HEAD
        + _model("", "", "x", "return torch.relu(F.pad(x, [1, 2, 0, 3], value=0.5)) * 2.0", "torch.randn(3, 4)", "")
    )
    pads = [n for n in plan.nodes if n.op == "pad"]
    assert len(pads) == 1
    assert pads[0].shape == (6, 7)
    assert pads[0].attrs == (0.5, 0.0, 1.0)  # the fill, then the pad before each source dim
    assert plan.template == "pw"  # one kernel: the pad, relu and mul


def test_a_pad_of_zero_everywhere_is_a_view_without_a_kernel() -> None:
    plan = plan_of(HEAD + _model("", "", "x", "return F.pad(x, [0, 0, 0, 0]) * 2.0", "torch.randn(3, 4)", ""))
    assert not [n for n in plan.nodes if n.op == "pad"]
    assert plan.template == "pw"


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ('return F.pad(x, [-1, 1], mode="reflect") * 2.0', "F.pad mode 'reflect' with a negative pad [-1, 1]"),
        ('return F.pad(x, [2, -1], "circular") * 2.0', "F.pad mode 'circular' with a negative pad [2, -1]"),
        ("return F.pad(x, [1, 1], value=float('nan')) * 2.0", "F.pad with value nan is not covered"),
    ],
)
def test_what_the_family_does_not_cover_is_declined_with_the_reason(forward: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(4, 6)", ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
