"""Whole graphs split between kernels and the reference's own PyTorch calls (``--torch-ops reference``).

A GPT-style block written for these tests (``tests/data/gpt_block.py``): declined whole under
``forbid``, rendered as kernels plus kept PyTorch calls under ``reference``, admitted by the gate
only under ``reference``, and correct against PyTorch under the Triton interpreter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, Unsupported, analyse, default_params, render
from actors.experts.template.expert import AnalysisMode, TemplateExpert
from actors.experts.template.interp_check import check_in_subprocess
from gpu_runner.gate import check_candidate
from schemas import GenerateRequest, Severity, Task, TorchOpsPolicy
from tests.experts.template_cases import HEAD, _model

GPT_BLOCK = (Path(__file__).parents[1] / "data" / "gpt_block.py").read_text()
P = TorchOpsPolicy


def _split_plan(source: str) -> Plan:
    plan = analyse(source, keep_torch=True)
    assert isinstance(plan, Plan), plan
    return plan


def test_block_with_uncovered_ops_is_declined_whole_and_split_under_reference() -> None:
    whole = analyse(GPT_BLOCK)
    assert isinstance(whole, Unsupported)
    assert "split" in whole.detail
    plan = _split_plan(GPT_BLOCK)
    kinds = plan.template.split("+")
    assert "torch" in kinds
    assert kinds.count("mm") >= 4  # qkv, q@k^T, att@v, out projection and the MLP stay kernels
    source = render(plan, default_params(plan))
    assert "self.c_attn(" not in source  # the projections are kernels, not the kept modules
    assert ".split(" in source
    assert ".masked_fill(" in source


def test_split_block_passes_the_gate_only_under_reference() -> None:
    plan = _split_plan(GPT_BLOCK)
    source = render(plan, default_params(plan))
    allowed = check_candidate(source, GPT_BLOCK, P.REFERENCE)
    assert not allowed.rejected, [f.message for f in allowed.findings if f.severity is Severity.REJECT]
    assert ".masked_fill" in allowed.torch_ops_kept
    assert check_candidate(source, GPT_BLOCK, P.FORBID).rejected


def test_kept_call_spells_the_reference_module_and_a_tuple_result() -> None:
    src = HEAD + _model(
        ", e, h",
        "self.attn = nn.MultiheadAttention(e, h)\nself.norm = nn.LayerNorm(e)",
        "x",
        "a, _ = self.attn(x, x, x)\nreturn torch.relu(self.norm(a + x))",
        "torch.rand(5, 2, 12)",
        "12, 3",
    )
    plan = _split_plan(src)
    source = render(plan, default_params(plan))
    assert "(self.attn(_b0, _b0, _b0))[0]" in source
    assert plan.template.startswith("torch+")


@pytest.mark.timeout(300)
def test_split_block_matches_pytorch_under_the_interpreter(tmp_path: Path) -> None:
    plan = _split_plan(GPT_BLOCK)
    jobs: list[dict[str, object]] = [
        {
            "reference": GPT_BLOCK,
            "candidate": render(plan, default_params(plan)),
            "seeds": [3, 4],
            "atol": 1e-4,
            "rtol": 1e-4,
        }
    ]
    [verdict] = check_in_subprocess(jobs, tmp_path, timeout=280)
    assert verdict.ok, verdict.detail


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_expert_splits_only_when_the_run_allows_reference_ops() -> None:
    expert = TemplateExpert(analysis=AnalysisMode.THREAD)
    task = Task.from_source("gpt_block", GPT_BLOCK)
    declined = await expert.generate(GenerateRequest(run_id="r", island="i0", task=task))
    assert declined.decline is not None
    assert "split" in declined.decline.detail
    reply = await expert.generate(GenerateRequest(run_id="r", island="i0", task=task, torch_ops=P.REFERENCE, n=2))
    assert reply.decline is None
    assert reply.proposals
    assert all("+torch" in p.strategy or "torch+" in p.strategy for p in reply.proposals)
