"""Whole graphs split between kernels and the reference's own PyTorch calls.

Data movement the templates do not cover (``unfold``'s overlapping windows; ``split``, head
transposes, slicing and ``movedim`` were such until ``families/split.py`` and
``families/strided.py``) stays a PyTorch call under every run policy (the evaluator admits views
and copies); compute they do not cover (a recurrent layer on an unbatched sequence, ``nn.GRU``)
only under ``--torch-ops reference``. Checked on a GPT-style block written for these tests
(``tests/data/gpt_block.py``, with a smoothing over ``unfold``'s windows) and a recurrent block:
what the gate says under each policy, correctness under the Triton interpreter, and the expert's
answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, Unsupported, analyse, default_params, render
from actors.experts.template.expert import AnalysisMode, TemplateExpert
from actors.experts.template.interp_check import check_in_subprocess
from actors.experts.template.ir import KeepTorch
from gpu_runner.gate import check_candidate
from schemas import GenerateRequest, Severity, Task, TorchOpsPolicy
from tests.experts.template_cases import HEAD, _model

GPT_BLOCK = (Path(__file__).parents[1] / "data" / "gpt_block.py").read_text()
GPT_UNFOLD = GPT_BLOCK.replace(
    "return self.c_proj(y)", "return self.c_proj(y + F.pad(y, (0, 0, 1, 1)).unfold(1, 3, 1).mean(-1))"
)
"""The block with each token's attention output smoothed over its neighbours by ``unfold``'s
overlapping windows (step 1, size 3), data movement the templates do not cover."""
GPT_MOVEDIM = GPT_BLOCK.replace(".transpose(1, 2)", ".movedim(2, 1)").replace(".transpose(-2, -1)", ".swapaxes(-2, -1)")
"""The block with its heads moved by ``movedim`` and its keys transposed by ``swapaxes``: covered."""
RNN_BLOCK = HEAD + _model(
    ", e",
    "self.rnn = nn.GRU(e, e)\nself.norm = nn.LayerNorm(e)",
    "x",
    "a, _ = self.rnn(x)\nreturn torch.relu(self.norm(a + x))",
    "torch.rand(5, 12)",
    "12",
)
RESHAPED_TRANSPOSE = HEAD + _model(
    "", "", "x", "return torch.relu(x).transpose(-1, -2).contiguous().view(2, -1) * 2.0", "torch.rand(2, 3, 5)", ""
)
UNFOLDED_PATCHES = HEAD + _model(
    "",
    "",
    "x",
    "return torch.relu(x.unfold(2, 4, 4).unfold(3, 4, 2).reshape(x.shape[0], -1, 48)) * 2.0",
    "torch.rand(2, 3, 8, 10)",
    "",
)
P = TorchOpsPolicy


def _plan(source: str, keep: KeepTorch) -> Plan:
    plan = analyse(source, keep)
    assert isinstance(plan, Plan), plan
    return plan


def _rejected(source: str, reference: str, policy: TorchOpsPolicy) -> list[str]:
    report = check_candidate(source, reference, policy)
    return [f.message for f in report.findings if f.severity is Severity.REJECT]


def test_block_whose_uncovered_ops_move_data_is_split_under_any_policy() -> None:
    assert isinstance(analyse(GPT_BLOCK), Plan)  # its split and head transposes are kernels now
    assert isinstance(analyse(GPT_MOVEDIM), Plan)  # and written with movedim and swapaxes
    whole = analyse(GPT_UNFOLD)
    assert isinstance(whole, Unsupported)
    assert "unfold" in whole.detail
    plan = _plan(GPT_UNFOLD, KeepTorch.LAYOUT)
    kinds = plan.template.split("+")
    assert "torch" in kinds
    assert "attn" in kinds  # the explicit causal softmax attention is one flash-style kernel
    assert kinds.count("mm") >= 3  # qkv, output projection and the MLP stay kernels
    source = render(plan, default_params(plan))
    assert "self.c_attn(" not in source
    assert ".as_strided(" in source
    assert ".masked_fill(" not in source
    assert _rejected(source, GPT_UNFOLD, P.FORBID) == []


def test_block_with_uncovered_compute_is_split_only_under_reference() -> None:
    declined = analyse(RNN_BLOCK, KeepTorch.LAYOUT)
    assert isinstance(declined, Unsupported)
    assert "GRU" in declined.detail
    plan = _plan(RNN_BLOCK, KeepTorch.ALL)
    source = render(plan, default_params(plan))
    assert "(self.rnn(_b0))[0]" in source
    report = check_candidate(source, RNN_BLOCK, P.REFERENCE)
    assert not report.rejected, [f.message for f in report.findings]
    assert report.torch_ops_kept == ("torch.nn.GRU",)
    assert _rejected(source, RNN_BLOCK, P.FORBID)


def test_reshape_of_a_transpose_is_a_copy_in_order_between_kernels() -> None:
    # A PyTorch view between kernels before (``families/strided.py`` copies the transpose now).
    plan = _plan(RESHAPED_TRANSPOSE, KeepTorch.NONE)
    assert "torch" not in plan.template.split("+")
    assert [n.op for n in plan.nodes if n.op == "strided"] == ["strided"]
    assert ".transpose(" not in render(plan, default_params(plan))


def test_unfold_windows_are_an_as_strided_view_under_forbid() -> None:
    plan = _plan(UNFOLDED_PATCHES, KeepTorch.LAYOUT)
    source = render(plan, default_params(plan))
    assert ".unfold(" not in source
    # The first unfold (windows side by side) is a copy kernel now; the second (windows that
    # overlap) an as_strided view of that copy.
    assert plan.template == "pw+torch+pw"
    assert ".as_strided((2, 3, 2, 4, 4, 4), (240, 80, 40, 8, 1, 4))" in source
    assert _rejected(source, UNFOLDED_PATCHES, P.FORBID) == []


@pytest.mark.timeout(300)
def test_split_blocks_match_pytorch_under_the_interpreter(tmp_path: Path) -> None:
    jobs: list[dict[str, object]] = []
    cases = (
        (GPT_UNFOLD, KeepTorch.LAYOUT),
        (GPT_MOVEDIM, KeepTorch.NONE),
        (RNN_BLOCK, KeepTorch.ALL),
        (RESHAPED_TRANSPOSE, KeepTorch.LAYOUT),
        (UNFOLDED_PATCHES, KeepTorch.LAYOUT),
    )
    for reference, keep in cases:
        plan = _plan(reference, keep)
        candidate = render(plan, default_params(plan))
        jobs.append({"reference": reference, "candidate": candidate, "seeds": [3, 4], "atol": 1e-4, "rtol": 1e-4})
    verdicts = check_in_subprocess(jobs, tmp_path, timeout=280)
    assert all(v.ok for v in verdicts), [v.detail for v in verdicts]


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_expert_keeps_compute_in_pytorch_only_when_the_run_allows_it() -> None:
    expert = TemplateExpert(analysis=AnalysisMode.THREAD)
    gpt = await expert.generate(GenerateRequest(run_id="r", island="i0", task=Task.from_source("gpt", GPT_UNFOLD)))
    assert gpt.decline is None
    assert all("torch" in p.strategy for p in gpt.proposals)
    rnn = Task.from_source("rnn", RNN_BLOCK)
    declined = await expert.generate(GenerateRequest(run_id="r", island="i0", task=rnn))
    assert declined.decline is not None
    assert "GRU" in declined.decline.detail
    reply = await expert.generate(GenerateRequest(run_id="r", island="i0", task=rnn, torch_ops=P.REFERENCE, n=2))
    assert reply.decline is None
    assert len(reply.proposals) == 2
