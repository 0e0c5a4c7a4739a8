"""The index family (``families/index.py``: ``nn.Embedding``, ``F.embedding``, ``index_select``
along dim 0, ``x[idx]``) against PyTorch, on the CPU under the Triton interpreter, in the variants of
``template_interp`` (default, stress, mutant, 64-bit indexing); and its declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.lowering import index_inputs, registered
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

INDEX_CASES: tuple[Case, ...] = (
    Case(
        "embedding_plus_positions",
        _model(
            "",
            "self.emb = nn.Embedding(50, 24, padding_idx=0)",
            "tokens, pos",
            "return self.emb(tokens) + pos",
            "torch.randint(0, 50, ($B, 7)), torch.randn($B, 7, 24)",
            "",
        ),
        ({"B": 3}, {"B": 1}),
    ),
    Case(
        "functional_embedding_gelu",
        _model(
            "",
            "self.table = nn.Parameter(torch.randn(33, 17))",
            "ids",
            "return F.gelu(F.embedding(ids, self.table)) * 1.5",
            "torch.randint(0, 33, ($N,))",
            "",
        ),
        ({"N": 40}, {"N": 5}),
    ),
    Case(
        "index_select_rows_of_3d_tanh",
        _model(
            "",
            "",
            "x, idx",
            "return torch.tanh(torch.index_select(x, 0, idx) - 0.25)",
            "torch.randn(19, 6, $W), torch.randint(0, 19, (11,))",
            "",
        ),
        ({"W": 5}, {"W": 8}),
    ),
    Case(
        "method_index_select_then_softmax",
        _model(
            "",
            "",
            "x, idx",
            "return torch.softmax(x.index_select(0, idx), dim=-1)",
            "torch.randn(30, $D), torch.randint(0, 30, (9,))",
            "",
        ),
        ({"D": 20}, {"D": 3}),
    ),
    Case(
        "getitem_rows_then_scale",
        _model(
            "",
            "",
            "x, idx",
            "return x[idx] * 3.0 + 1.0",
            "torch.randn(25, $D, 2), torch.randint(0, 25, (13,))",
            "",
        ),
        ({"D": 3}, {"D": 1}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(INDEX_CASES, _STRESS, tmp_path_factory.mktemp("interp-index"))


@pytest.mark.parametrize("case", [c.name for c in INDEX_CASES])
def test_index_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_family_is_one_module_registered_for_its_ops() -> None:
    owners = registered()
    assert owners["embedding"] == owners["index_select"] == "actors.experts.template.families.index"
    assert index_inputs()["embedding"] == "input"
    assert index_inputs()["index_select"] == "index"
    assert index_inputs()["cross_entropy"] == "target"  # the loss family's, declared the same way


@pytest.mark.parametrize(
    ("forward", "inputs", "init", "reason"),
    [
        ("return self.emb(t)", "torch.randint(0, 9, (4,))", "self.emb = nn.Embedding(9, 4, max_norm=1.0)", "max_norm"),
        ("return torch.index_select(x, 1, t)", "torch.randn(5, 6), torch.randint(0, 6, (3,))", "", "dim 1"),
        ("return torch.index_select(x, 0, t)", "torch.randn(5, 6), torch.randint(0, 5, (3,)).int()", "", "int32"),
        ("return x[t] * 2.0", "torch.randn(5, 6), torch.randint(0, 5, (3, 2))", "", "indexing"),
    ],
)
def test_what_the_family_does_not_cover_is_declined_with_the_reason(
    forward: str, inputs: str, init: str, reason: str
) -> None:
    args = "t" if "self.emb" in init else "x, t"
    plan = analyse(HEAD + _model("", init, args, forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail


def test_an_int64_input_read_elsewhere_than_as_indices_is_still_declined() -> None:
    # compared or converted to float it is covered (``test_template_model_ops``); an int64 result is not
    forward = "return self.emb(t) + (t * 2).float().unsqueeze(-1)"
    plan = analyse(HEAD + _model("", "self.emb = nn.Embedding(9, 4)", "t", forward, "torch.randint(0, 9, (4,))", ""))
    assert isinstance(plan, Unsupported)
    assert "input t is torch.int64 and function _operator.mul reads it" in plan.detail
