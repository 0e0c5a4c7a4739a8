"""Models that walk their own steps and number their own positions: ``nn.RNNCell``,
``nn.LSTMCell`` and ``nn.GRUCell`` called in an unrolled loop (``families/cells.py``), and
``torch.arange`` in forward (``families/fill.py``: a GPT's position ids read by an embedding, and
float positions), against PyTorch on the CPU under the Triton interpreter, in the variants of
``template_interp``; and their declines."""

from __future__ import annotations

import pytest

from actors.experts.template import Plan, Unsupported, analyse
from actors.experts.template.interp_check import Verdict
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

CASES: tuple[Case, ...] = (
    Case(
        "lstm_cell_walked_from_zero_states",
        _model(
            "",
            "self.cell = nn.LSTMCell(6, $H)\nself.fc = nn.Linear($H, 3)",
            "x",
            "h = torch.zeros(x.size(0), $H, device=x.device, dtype=x.dtype)\n"
            "c = torch.zeros(x.size(0), $H, device=x.device, dtype=x.dtype)\n"
            "for t in range(x.size(1)):\n"
            "    h, c = self.cell(x[:, t], (h, c))\n"
            "return self.fc(h) + c.sum(-1, keepdim=True)",
            "torch.randn(3, 4, 6)",
            "",
        ),
        ({"H": 10},),
    ),
    Case(
        "gru_cell_from_a_given_state_and_relu_rnn_cell_from_none_stacked",
        _model(
            "",
            "self.gru = nn.GRUCell(5, $H)\nself.rnn = nn.RNNCell($H, 7, nonlinearity='relu', bias=False)",
            "x, h0",
            "h, g = h0, None\n"
            "outs = []\n"
            "for t in range(3):\n"
            "    h = self.gru(x[:, t], h)\n"
            "    g = self.rnn(h, g)\n"
            "    outs.append(g)\n"
            "return torch.stack(outs, dim=1)",
            "torch.randn(2, 3, 5), torch.randn(2, $H)",
            "",
        ),
        ({"H": 9},),
    ),
    Case(
        "gpt_positions_by_arange_and_float_positions",
        _model(
            "",
            "self.tok = nn.Embedding(20, 8)\nself.pos = nn.Embedding(16, 8)",
            "idx",
            "t = idx.size(1)\n"
            "pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)\n"
            "x = self.tok(idx) + self.pos(pos)\n"
            "scale = torch.arange(1, 2 * t + 1, 2, device=idx.device, dtype=torch.float32)\n"
            "return x * scale[None, :, None] * 0.1",
            "torch.randint(0, 20, (2, $T))",
            "",
        ),
        ({"T": 7}, {"T": 16}),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "mm_block_m": 16, "mm_block_n": 16, "mm_block_k": 16}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(CASES, _STRESS, tmp_path_factory.mktemp("interp-cells"))


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_cells_and_positions_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_an_input_read_only_for_its_sizes_may_be_int64_indices() -> None:
    # ``idx.size(1)`` and ``idx.device`` read no element: the embedding is still idx's only reader.
    plan = analyse(HEAD + CASES[2].sources()[0])
    assert isinstance(plan, Plan), plan
    assert [n.op for n in plan.nodes if n.op == "arange"] == ["arange", "arange"]


@pytest.mark.parametrize(
    ("init", "forward", "inputs", "reason"),
    [
        ("self.cell = nn.LSTMCell(4, 3)", "return self.cell(x)[0]", "torch.randn(4)", "unbatched"),
        (
            "",
            "return x * torch.arange(4, dtype=torch.int32, device=x.device)",
            "torch.randn(2, 4)",
            "torch.arange of torch.int32",
        ),
    ],
)
def test_what_cells_and_arange_do_not_cover_is_declined_with_the_reason(
    init: str, forward: str, inputs: str, reason: str
) -> None:
    plan = analyse(HEAD + _model("", init, "x", forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
