"""``einops`` calls traced as tensor ops (``einops_trace.py``), ``torch.einsum`` of any number of
operands as pairwise contractions (``families/einsum.py``) and Mamba2's bool masks
(``families/masks.py``), against PyTorch on the CPU under the Triton interpreter in the variants
of ``template_interp``; the ops they record; and their declines."""

from __future__ import annotations

import pytest
import torch

from actors.experts.template import Unsupported, analyse, default_params, render
from actors.experts.template.interp_check import Verdict
from actors.experts.template.ir import KeepTorch, NodeKind
from actors.experts.template.lowering import registered
from actors.experts.template.trace import trace_reference
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of

pytestmark = pytest.mark.timeout(300)

EINOPS = "from einops import rearrange\n"

_SEGSUM = (
    "T = a.size(-1)\n"
    "s = torch.cumsum(a, dim=-1)\n"
    "s = s[..., :, None] - s[..., None, :]\n"
    "mask = torch.tril(torch.ones(T, T, device=a.device, dtype=bool), diagonal=0)\n"
    "L = torch.exp(s.masked_fill(~mask, -torch.inf))\n"
)

EINSUM_CASES: tuple[Case, ...] = (
    Case(
        "einops_split_transpose_and_merge_around_elementwise_math",
        EINOPS
        + _model(
            "",
            "",
            "x",
            'y = rearrange(x, "b (c l) h -> b c l h", l=$L)\n'
            'y = torch.exp(rearrange(y, "b c l h -> b h c l")) * 2.0\n'
            'return rearrange(y, "b h c l -> b (c l) h") + 1.0',
            "torch.randn(2, 3 * $L, 5)",
            "",
        ),
        ({"L": 4},),
    ),
    Case(
        "three_operands_a_batch_index_a_summed_away_index_and_a_permuted_output",
        _model(
            "",
            "",
            "x, y, z",
            'return torch.einsum("bijx,bjk,bkl->bli", x, y, z)',
            "torch.randn(2, 3, 4, $X), torch.randn(2, 4, 5), torch.randn(2, 5, 6)",
            "",
        ),
        ({"X": 7},),
    ),
    Case(
        "mamba2_diagonal_blocks_four_operands_after_a_segment_sum_mask",
        EINOPS
        + _model(
            "",
            "",
            "x, a, b, c",
            'x, b, c = (rearrange(t, "b (c l) ... -> b c l ...", l=$L) for t in (x, b, c))\n'
            'a = rearrange(rearrange(a, "b (c l) h -> b c l h", l=$L), "b c l h -> b h c l")\n'
            + _SEGSUM
            + 'y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, L, x)\n'
            'return rearrange(y, "b c l h p -> b (c l) h p")',
            "torch.randn(2, 2 * $L, 3, 6), torch.randn(2, 2 * $L, 3) * 0.1, torch.randn(2, 2 * $L, 3, 5), "
            "torch.randn(2, 2 * $L, 3, 5)",
            "",
        ),
        ({"L": 4},),
    ),
    Case(
        "a_three_operand_einsum_sliced_returns_the_references_strided_layout",
        _model(
            "",
            "",
            "b, d, x",
            'return torch.einsum("bclhn,bhcl,bclhp->bchpn", b, d, x)[:, -1]',
            "torch.randn(2, 3, 4, 2, 5), torch.randn(2, 2, 3, 4), torch.randn(2, 3, 4, 2, 6)",
            "",
        ),
        ({},),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64, "mm_block_m": 16, "mm_block_n": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    workdir = tmp_path_factory.mktemp("interp-einsum")
    return interp_verdicts(EINSUM_CASES, _STRESS, workdir, keep_torch=KeepTorch.LAYOUT)  # as under ``forbid``


@pytest.mark.slow
@pytest.mark.parametrize("case", [c.name for c in EINSUM_CASES])
def test_einsum_and_einops_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_einsum_and_mask_families_are_modules_registered_for_their_ops() -> None:
    found = registered()
    assert found["einsum"] == "actors.experts.template.families.einsum"
    assert found["logical_not"] == "actors.experts.template.families.masks"
    assert found["ones"] == found["zeros_like"] == "actors.experts.template.families.fill"


def test_rearrange_records_a_reshape_and_a_permute_of_the_traced_tensor() -> None:
    source = (
        HEAD
        + EINOPS
        + _model("", "", "x", 'return rearrange(x, "b (c l) h -> b h c l", l=2)', "torch.randn(2, 6, 5)", "")
    )
    traced = trace_reference(source)
    calls = [(n.target, n.args[1:]) for n in traced.graph_module.graph.nodes if n.op == "call_method"]
    assert calls == [("reshape", (2, 3, 2, 5)), ("permute", (0, 3, 1, 2))]


def test_a_three_operand_einsum_is_two_products_with_the_summed_index_reduced_first() -> None:
    plan = plan_of(EINSUM_CASES[1].sources()[0])
    kinds = [n.kind for n in plan.nodes]
    assert kinds.count(NodeKind.MM) == 2
    sums = [n for n in plan.nodes if n.kind is NodeKind.RED]
    assert [(n.op, n.shape) for n in sums] == [("sum", (2, 3, 4))]  # x's own index, summed before any product


def test_a_result_the_reference_returns_strided_is_copied_into_its_layout() -> None:
    plan = plan_of(EINSUM_CASES[3].sources()[0], KeepTorch.LAYOUT)
    with torch.device("meta"):
        b, d, x = torch.empty(2, 3, 4, 2, 5), torch.empty(2, 2, 3, 4), torch.empty(2, 3, 4, 2, 6)
        wanted = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, d, x)[:, -1].stride()
    assert plan.output_strides == (tuple(wanted),)
    assert f"torch.empty_strided((2, 2, 6, 5), {tuple(wanted)!r}" in render(plan, default_params(plan))


def test_an_einsum_with_nothing_to_contract_is_an_elementwise_product() -> None:
    plan = plan_of(
        HEAD
        + _model("", "", "x, y", 'return torch.einsum("ij,ij->ij", x, y)', "torch.randn(3, 4), torch.randn(3, 4)", "")
    )
    assert not [n for n in plan.nodes if n.kind is NodeKind.MM]
    assert [n.op for n in plan.nodes if n.kind is NodeKind.EW] == ["mul"]


@pytest.mark.parametrize(
    ("forward", "inputs", "reason"),
    [
        (
            'return torch.einsum("ii,i->i", x, y)',
            "torch.randn(3, 3), torch.randn(3)",
            "an index repeated within one operand (a diagonal) is not covered",
        ),
        (
            'return torch.einsum("...ij,jk->...ik", x, y)',
            "torch.randn(2, 3, 4), torch.randn(4, 5)",
            "an ellipsis is not covered",
        ),
        (
            "return x * torch.ones(3, 4, device=x.device, dtype=torch.int64) + y",
            "torch.randn(3, 4), torch.randn(3, 4)",
            "torch.ones of torch.int64 is not covered (float32 or bool)",
        ),
    ],
)
def test_what_the_families_do_not_cover_is_declined_with_the_reason(forward: str, inputs: str, reason: str) -> None:
    plan = analyse(HEAD + _model("", "", "x, y", forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
