"""Copies that move elements and parts of tensors (``families/strided.py``, ``families/split.py``):
permutations of any dims, channel and pixel shuffles, ``repeat_interleave``, ``expand``, the
transposed operand of a convolution, a reshape or a ``cat`` copied in order, ``movedim`` /
``swapaxes`` / ``unflatten``, ``unfold``'s windows side by side, and ``split`` / ``chunk`` /
``unbind`` / ``narrow`` / ``glu`` as slices; against PyTorch on the CPU under the Triton
interpreter, in the variants of ``template_interp``; and their declines."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, Unsupported, analyse, any_sizes, default_params, render
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts
from tests.experts.test_template_any_sizes import _check_in_child as check_sizes_in_child
from tests.experts.test_template_any_sizes import _job as size_job

pytestmark = pytest.mark.timeout(300)

CASES: tuple[Case, ...] = (
    Case(
        "permute_to_channels_last_then_scale",
        _model("", "", "x", "return x.permute(0, 2, 3, 1) * 2.0 + 1.0", "torch.randn(2, $C, 5, 6)", ""),
        ({"C": 3}, {"C": 7}),
    ),
    Case(
        "heads_merged_by_a_transpose_and_reshape_then_linear",
        _model(
            "",
            "self.proj = nn.Linear(3 * $D, 5)",
            "x",
            "b, h, s, d = x.shape\nreturn self.proj(x.transpose(1, 2).reshape(b, s, h * d))",
            "torch.randn(2, 3, 7, $D)",
            "",
        ),
        ({"D": 4},),
    ),
    Case(
        "channel_shuffle_by_views_then_a_grouped_conv",
        _model(
            "",
            "self.conv = nn.Conv2d(6, 6, 1, groups=3, bias=False)",
            "x",
            "b, c, h, w = x.size()\n"
            "x = x.view(b, 3, c // 3, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)\n"
            "return torch.relu(self.conv(x))",
            "torch.randn(2, 6, $H, 5)",
            "",
        ),
        ({"H": 4},),
    ),
    Case(
        "pixel_shuffle_module_and_unshuffle_function",
        _model(
            "",
            "self.up = nn.PixelShuffle(2)",
            "x",
            "y = torch.sigmoid(self.up(x))\nreturn F.pixel_unshuffle(y, 2) - x",
            "torch.randn(2, 8, $H, 3)",
            "",
        ),
        ({"H": 5},),
    ),
    Case(
        "channel_shuffle_function_and_repeat_interleave_of_heads",
        _model(
            "",
            "",
            "x, k",
            "return F.channel_shuffle(x, 2) + k.repeat_interleave(2, dim=1)",
            "torch.randn(2, 4, 3, $S), torch.randn(2, 2, 3, $S)",
            "",
        ),
        ({"S": 5},),
    ),
    Case(
        "conv1d_of_a_transposed_sequence",
        _model(
            "",
            "self.conv = nn.Conv1d($D, 4, 3)",
            "x",
            "return F.relu(self.conv(x.transpose(1, 2))).max(dim=2).values",
            "torch.randn(3, 9, $D)",
            "",
        ),
        ({"D": 5},),
    ),
    Case(
        "class_token_expanded_and_joined_to_transposed_patches",
        _model(
            "",
            "self.cls = nn.Parameter(torch.randn(1, 1, $D))\nself.pos = nn.Parameter(torch.randn(1, 7, $D))",
            "x",
            "x = x.flatten(2).transpose(1, 2)\n"
            "return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos",
            "torch.randn(2, $D, 2, 3)",
            "",
        ),
        ({"D": 5},),
    ),
    Case(
        "pad_slice_and_roll_of_transposes",
        _model(
            "",
            "",
            "x",
            "return F.pad(x.t(), [1, 1]) * 2.0 + torch.roll(x.t(), 1, 0)[:, 1:-1].sum() + x.t()[1:3].mean()",
            "torch.randn($N, 6)",
            "",
        ),
        ({"N": 4},),
    ),
    Case(
        "rotate_half_by_chunk_and_qkv_by_split",
        _model(
            "",
            "",
            "x",
            "q, k, v = x.split($D, dim=-1)\na, b = q.chunk(2, dim=-1)\nreturn torch.cat((-b, a), dim=-1) * k + v",
            "torch.randn(2, 5, 3 * $D)",
            "",
        ),
        ({"D": 6},),
    ),
    Case(
        "unbind_narrow_and_uneven_split",
        _model(
            "",
            "",
            "x",
            "first, second, third = x.unbind(1)\n"
            "head, tail = torch.split(second, [2, $N - 2], dim=-1)\n"
            "return first.narrow(-1, 1, 2) * head + third[:, :2] * x.select(1, -1)[:, 1:3] + tail.sum(-1, True)",
            "torch.randn(4, 3, $N)",
            "",
        ),
        ({"N": 7},),
    ),
    Case(
        "movedim_moveaxis_swapaxes_unflatten_and_glu",
        _model(
            "",
            "self.glu = nn.GLU(dim=1)",
            "x",
            "b, c, h, w = x.shape\n"
            "y = F.glu(x.flatten(2).movedim(1, -1), dim=-1)\n"
            "z = self.glu(x).swapaxes(1, 3).swapdims(1, 2)\n"
            "m = torch.moveaxis(x, (1, 3), (3, 1))[..., : c // 2].transpose(1, 2)\n"
            "return y.unflatten(1, (h, w)) * 2.0 + z + m.reshape_as(z)",
            "torch.randn(2, $C, 3, 4)",
            "",
        ),
        ({"C": 6},),
    ),
    Case(
        "vit_patches_by_unfold_then_linear",
        _model(
            "",
            "self.proj = nn.Linear(3 * 2 * 3, 5)",
            "x",
            "b, c = x.shape[:2]\n"
            "p = x.unfold(2, 2, 2).unfold(3, 3, 3)\n"
            "p = p.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * 2 * 3)\n"
            "return self.proj(p) + x.unfold(-1, 5, 5).sum(-1).mean()",
            "torch.randn(2, 3, $H, 10)",
            "",
        ),
        ({"H": 4}, {"H": 5}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64, "mm_block_m": 16, "mm_block_n": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CASES, _STRESS, tmp_path_factory.mktemp("interp-strided"))


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_copies_shuffles_and_parts_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_a_permutation_is_one_copy_that_elementwise_work_joins_and_the_last_two_dims_stay_a_transpose() -> None:
    plan = analyse(HEAD + CASES[0].sources()[0])
    assert isinstance(plan, Plan), plan
    assert [n.op for n in plan.nodes if n.op == "strided"] == ["strided"]
    swap = analyse(
        HEAD + _model("", "", "x, y", "return x.transpose(-1, -2) @ y", "torch.randn(3, 4), torch.randn(3, 5)", "")
    )
    assert isinstance(swap, Plan), swap
    assert not [n for n in swap.nodes if n.op == "strided"]  # the product reads the transpose by its strides


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return x.repeat_interleave(2) * 1.0", "dim=None"),
        ("return (x > 0).permute(0, 2, 3, 1) * 1.0", "transpose input is bool"),
        ("return x.unfold(1, 2, 1) * 1.0", "windows that overlap or leave gaps"),
    ],
)
def test_what_the_copies_do_not_cover_is_declined_with_the_reason(forward: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x", forward, "torch.randn(4, 4, 2, 2)", ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail


SHUFFLED = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 12, 1, groups=3)
        self.up = nn.PixelShuffle(2)

    def forward(self, x):
        x = F.channel_shuffle(torch.relu(self.conv(x)), 3)
        y = self.up(x).permute(0, 2, 3, 1)
        return F.interpolate(y.permute(0, 3, 1, 2), scale_factor=2, mode="bilinear") + 1.0

batch_size = 2
height = 5
width = 4

def get_inputs():
    return [torch.randn(batch_size, 6, height, width)]

def get_init_inputs():
    return []
"""


def test_shuffles_permutations_and_resampling_take_any_size_and_are_correct_there(tmp_path: Path) -> None:
    # Their nodes hold the source's dims and the scales of factors, not strides or sizes, so the
    # plan is the same at every size and the any-size copy is kept (issue 38).
    plan = analyse(SHUFFLED)
    assert isinstance(plan, Plan), plan
    assert {n.op for n in plan.nodes} >= {"strided", "upsample"}
    rendered = render(plan, default_params(plan))
    assert f"def {any_sizes.METHOD}(self" in rendered
    points = [{"batch_size": 1, "height": 3, "width": 7}, {"batch_size": 3, "height": 6, "width": 2}]
    outcomes = check_sizes_in_child([size_job("shuffled", SHUFFLED, rendered, tmp_path, points)], tmp_path)
    assert outcomes == {"shuffled": 2}, outcomes
