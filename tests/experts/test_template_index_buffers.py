"""Integer buffers read as gather indices (``lower.py``'s ``_index_buffer``, ``families/index.py``):
Swin's relative position bias (``table[index.view(-1)].view(N, N, -1).permute(2, 0, 1)`` added to
attention scores), ``F.embedding`` and ``index_select`` by a buffer, checked against PyTorch on
the CPU under the Triton interpreter; and an integer buffer read any other way, declined with a
reason that names it and the use."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, Unsupported, analyse, default_params, render
from actors.experts.template.interp_check import Verdict, finish_check, start_check
from actors.experts.template.ir import KeepTorch, NodeKind
from tests.experts.template_cases import HEAD, Case, _model
from tests.experts.template_interp import assert_all_correct, interp_verdicts

pytestmark = pytest.mark.timeout(300)

_SWIN_INIT = """
self.table = nn.Parameter(torch.randn((2 * $W - 1) ** 2, $H))
coords = torch.stack(torch.meshgrid([torch.arange($W), torch.arange($W)], indexing="ij")).flatten(1)
rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
rel[:, :, 0] += $W - 1
rel[:, :, 1] += $W - 1
rel[:, :, 0] *= 2 * $W - 1
self.register_buffer("relative_position_index", rel.sum(-1))
"""
_SWIN_FORWARD = """
n = $W * $W
bias = self.table[self.relative_position_index.view(-1)].view(n, n, -1)
bias = bias.permute(2, 0, 1).contiguous()
return torch.softmax(attn + 16 * torch.sigmoid(bias).unsqueeze(0), dim=-1)
"""
SWIN_BIAS = Case(
    "swin_relative_position_bias",
    _model("", _SWIN_INIT, "attn", _SWIN_FORWARD, "torch.randn($B, $H, $W * $W, $W * $W)", ""),
    ({"B": 2, "H": 3, "W": 3}, {"B": 1, "H": 2, "W": 4}),
)

BUFFER_CASES: tuple[Case, ...] = (
    Case(
        "embedding_by_an_int64_buffer_of_two_dims",
        _model(
            "",
            'self.emb = nn.Embedding(20, $D)\nself.register_buffer("ids", torch.randint(0, 20, (4, 5)))',
            "x",
            "return self.emb(self.ids) * x",
            "torch.randn(4, 5, $D)",
            "",
        ),
        ({"D": 6},),
    ),
    Case(
        "index_select_by_an_int32_buffer",
        _model(
            "",
            'self.register_buffer("rows", torch.tensor([3, 0, 0, 7, 2], dtype=torch.int32))',
            "x",
            "return torch.tanh(torch.index_select(x, 0, self.rows.flatten()))",
            "torch.randn(8, $D)",
            "",
        ),
        ({"D": 9},),
    ),
)

_STRESS = {"pw_warps": 1, "pw_ept": 1, "row_warps": 1, "row_block_r": 64}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    return interp_verdicts(BUFFER_CASES, _STRESS, tmp_path_factory.mktemp("interp-index-buffers"))


@pytest.mark.parametrize("case", [c.name for c in BUFFER_CASES])
def test_gathers_by_an_integer_buffer_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def test_swin_relative_position_bias_reads_its_index_buffer_and_matches_pytorch(tmp_path: Path) -> None:
    """The default policy's planning (layout ops such as ``permute(2, 0, 1)`` stay PyTorch's)."""
    jobs = []
    for source in SWIN_BIAS.sources():
        plan = analyse(source, KeepTorch.LAYOUT)
        assert isinstance(plan, Plan), plan
        index = [n for n in plan.nodes if n.kind is NodeKind.PARAM and n.path == "relative_position_index"]
        assert [n.dtype for n in index] == ["int64"]
        candidate = render(plan, default_params(plan))
        assert "@triton.jit" in candidate
        assert "self.relative_position_index.contiguous()" in candidate
        jobs.append({"reference": source, "candidate": candidate, "seeds": [5, 6], "atol": 1e-4, "rtol": 1e-4})
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert [v.detail for v in verdicts if not v.ok] == []
    assert len(verdicts) == 2


@pytest.mark.parametrize(
    ("init", "forward", "reason"),
    [
        (
            'self.register_buffer("idx", torch.arange(6))',
            "return x + self.idx",
            "buffer idx is torch.int64 and function _operator.add reads it",
        ),
        (
            'self.register_buffer("idx", torch.arange(6))',
            "return x[self.idx] * self.idx.view(6, 1).float()",
            "buffer idx is torch.int64 and method .float() reads it",
        ),
        (
            'self.register_buffer("idx", torch.arange(6))',
            "return F.embedding(self.idx, x) * (self.idx.view(6, 1) > 2)",
            "buffer idx is torch.int64 and function _operator.gt reads it",
        ),
        (
            'self.register_buffer("keep", torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.int16))',
            "return torch.index_select(x, 0, self.keep.view(-1)) * 2.0",
            "buffer keep is torch.int16; gather indices are covered as int64 or int32",
        ),
    ],
)
def test_an_integer_buffer_read_other_than_as_indices_is_declined_naming_it(
    init: str, forward: str, reason: str
) -> None:
    plan = analyse(HEAD + _model("", init, "x", forward, "torch.randn(6, 6)", ""), KeepTorch.LAYOUT)
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail
