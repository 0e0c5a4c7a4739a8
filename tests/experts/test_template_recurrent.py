"""The recurrent family (``families/recurrent.py``: ``nn.RNN``, ``nn.LSTM``, ``nn.GRU``; its kernel in
``families/_recurrent_kernel.py``) against PyTorch, on the CPU under the Triton interpreter, in the
variants of ``template_interp`` (default, stress, mutant, 64-bit indexing); and its declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Plan, Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from actors.experts.template.ir import NodeKind, plan_from_dict, plan_to_dict
from actors.experts.template.lowering import registered
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

RECURRENT_CASES: tuple[Case, ...] = (
    Case(
        "rnn_one_layer_tanh_with_h0",
        _model(
            "",
            "self.rnn = nn.RNN(3, 5)",
            "x, h0",
            "out, h = self.rnn(x, h0)\nreturn out, h",
            "torch.randn($T, $B, 3), torch.randn(1, $B, 5)",
            "",
        ),
        ({"T": 4, "B": 2}, {"T": 3, "B": 3}),
    ),
    Case(
        "rnn_relu_without_bias_batch_first",
        _model(
            "",
            "self.rnn = nn.RNN(4, 6, nonlinearity='relu', bias=False, batch_first=True)",
            "x",
            "out, h = self.rnn(x)\nreturn out",
            "torch.randn($B, $T, 4)",
            "",
        ),
        ({"T": 5, "B": 2},),
    ),
    Case(
        "lstm_two_layers_returning_output_h_n_c_n",
        _model(
            "",
            "self.lstm = nn.LSTM(4, 6, 2)",
            "x, h0, c0",
            "out, (h, c) = self.lstm(x, (h0, c0))\nreturn out, h, c",
            "torch.randn($T, $B, 4), torch.randn(2, $B, 6), torch.randn(2, $B, 6)",
            "",
        ),
        ({"T": 3, "B": 2}, {"T": 5, "B": 3}),
    ),
    Case(
        "gru_bidirectional_batch_first_returning_h_n",
        _model(
            "",
            "self.gru = nn.GRU(5, 4, 2, batch_first=True, bidirectional=True)",
            "x, h0",
            "out, h = self.gru(x, h0)\nreturn h",
            "torch.randn($B, $T, 5), torch.randn(4, $B, 4)",
            "",
        ),
        ({"T": 5, "B": 3}, {"T": 3, "B": 2}),
    ),
    Case(
        "gru_without_initial_state_then_elementwise",
        _model(
            "",
            "self.gru = nn.GRU(3, 7)",
            "x",
            "out, h = self.gru(x)\nreturn out * 2.0, h",
            "torch.randn($T, $B, 3)",
            "",
        ),
        ({"T": 4, "B": 2},),
    ),
    Case(
        "lstm_bidirectional_over_two_batch_blocks_and_hidden_chunks",
        _model(
            "",
            "self.lstm = nn.LSTM(3, 20, batch_first=True, bidirectional=True)",
            "x",
            "out, state = self.lstm(x)\nreturn out, state[1]",
            "torch.randn($B, 3, 3)",
            "",
        ),
        ({"B": 17},),
    ),
)

_STRESS = {"mm_block_m": 16, "mm_block_n": 16, "mm_block_k": 16, "mm_warps": 1, "pw_warps": 1, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(RECURRENT_CASES, _STRESS, tmp_path_factory.mktemp("interp-recurrent"))


@pytest.mark.parametrize("case", [c.name for c in RECURRENT_CASES])
def test_recurrent_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_the_family_is_registered_for_its_modules() -> None:
    for canon in ("rnn", "lstm", "gru"):
        assert registered()[canon] == "actors.experts.template.families.recurrent"


def test_each_layer_is_a_projection_and_one_recurrent_node_that_survives_serialisation() -> None:
    plan = analyse(RECURRENT_CASES[3].sources()[0])
    assert isinstance(plan, Plan), plan
    recs = [n for n in plan.nodes if n.kind is NodeKind.REC]
    assert [n.op for n in recs] == ["gru", "gru"]  # two layers, both directions in each node
    assert plan.template.count("mm") == 4  # an input projection per layer and direction
    assert plan_from_dict(plan_to_dict(plan)) == plan


@pytest.mark.parametrize(
    ("init", "forward", "inputs", "reason"),
    [
        ("self.m = nn.LSTM(4, 6, proj_size=3)", "return self.m(x)[0]", "torch.randn(3, 2, 4)", "proj_size=3"),
        ("self.m = nn.GRU(4, 6, 2, dropout=0.5)", "return self.m(x)[0]", "torch.randn(3, 2, 4)", "training mode"),
        ("self.m = nn.RNN(4, 6)", "return self.m(x)[0]", "torch.randn(3, 4)", "unbatched"),
        ("self.m = nn.LSTM(4, 6)", "return self.m(x.half())[0]", "torch.randn(3, 2, 4)", "float16"),
    ],
)
def test_what_the_family_does_not_cover_is_declined_with_the_reason(
    init: str, forward: str, inputs: str, reason: str
) -> None:
    plan = analyse(HEAD + _model("", init, "x", forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
