"""The run's PyTorch-ops policy: ``forbid`` keeps every torch compute op out of a candidate's forward;
``reference`` admits exactly the reference's own operations (static names and aten ops), nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.aten_policy import ReferenceTraceError, reference_aten_ops
from gpu_runner.gate import check_candidate, forward_torch_ops
from gpu_runner.service import EvaluationService
from schemas import CheatRule, DeviceChoice, EvalStatus, Role, Severity, TorchOpsPolicy
from tests.gpu_runner.conftest import candidate, fast_config, job, reference

P = TorchOpsPolicy


def _rejects(source: str, ref: str, policy: TorchOpsPolicy) -> list[str]:
    report = check_candidate(source, reference(ref), policy)
    return [f.message for f in report.findings if f.severity is Severity.REJECT and f.rule is CheatRule.TORCH_COMPUTE]


def test_reference_forward_ops_are_named_by_function_module_class_and_method() -> None:
    assert forward_torch_ops(reference("linear_relu")) == {"torch.nn.Linear", "torch.relu"}
    src = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return (a @ b).sum(1)\n"
    assert forward_torch_ops(src) == {"@", ".sum"}


def test_reference_aten_ops_come_from_a_meta_forward() -> None:
    ops = reference_aten_ops(reference("linear_relu"))
    assert "relu" in ops
    assert ops & {"addmm", "mm", "linear"}
    assert "view" not in ops  # views and allocation are always allowed, not part of the policy


def test_reference_aten_ops_fail_closed_on_a_reference_that_cannot_run_on_meta() -> None:
    src = (
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x[x.nonzero()[0]]\n"
        "def get_inputs():\n    return [torch.randn(7)]\ndef get_init_inputs():\n    return []\n"
    )
    with pytest.raises(ReferenceTraceError, match=r"nonzero|meta|data"):
        reference_aten_ops(src)


def test_kept_reference_module_is_rejected_under_forbid() -> None:
    assert _rejects(candidate("kept_linear_relu"), "linear_relu", P.FORBID)


def test_kept_reference_module_passes_the_gate_under_reference_and_is_named() -> None:
    report = check_candidate(candidate("kept_linear_relu"), reference("linear_relu"), P.REFERENCE)
    assert not report.rejected, [f.message for f in report.findings]
    assert report.torch_ops_kept == ("torch.nn.Linear",)
    assert "relu" in report.admitted_aten_ops


def test_op_the_reference_never_calls_is_rejected_under_reference() -> None:
    found = _rejects(candidate("substituted_linear_relu"), "linear_relu", P.REFERENCE)
    assert any("torch.addmm" in m for m in found), found
    # nn.Linear is not an op of an add-relu reference: the same candidate keeps nothing there.
    assert _rejects(candidate("kept_linear_relu"), "add_relu", P.REFERENCE)


def test_keeping_every_reference_op_is_rejected_under_reference() -> None:
    found = _rejects(candidate("kept_everything_linear_relu"), "linear_relu", P.REFERENCE)
    assert any("keeps every operation" in m for m in found), found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_service(gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = EvaluationService(fast_config(DeviceChoice.CPU, gpu_runner_tmp / "torch-ops", spares=1))
    await service.start()
    yield service
    await service.aclose()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.timeout(300)
async def test_kept_op_candidate_is_correct_under_reference_and_the_result_names_the_kept_ops(
    cpu_service: EvaluationService,
) -> None:
    result = await cpu_service.evaluate(job("linear_relu", "kept_linear_relu", torch_ops=P.REFERENCE))
    assert result.status is EvalStatus.CORRECT, result.summary
    assert "torch.nn.Linear" in result.torch_ops
    assert any(op.startswith("aten.") for op in result.torch_ops), result.torch_ops
    forbidden = await cpu_service.evaluate(job("linear_relu", "kept_linear_relu"))
    assert forbidden.status is EvalStatus.REJECTED, forbidden.summary
    assert forbidden.torch_ops == ()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.timeout(300)
async def test_aten_op_outside_the_reference_is_rejected_at_run_time_under_reference(
    cpu_service: EvaluationService,
) -> None:
    # It slips past the static gate (x + y, clamp_min): the reference adds (admitted) but never clamps.
    result = await cpu_service.evaluate(job("add_relu", "decoy_evading_gate", torch_ops=P.REFERENCE))
    assert result.status is EvalStatus.REJECTED, result.summary
    assert "clamp_min" in result.summary


def test_trial_that_keeps_every_admitted_op_is_rejected_and_a_partial_one_is_not() -> None:
    from gpu_runner.verdict import runtime_findings

    admitted = frozenset({"addmm", "relu"})
    everything = runtime_findings(
        [{"trial": 0, "own_launches": 1, "foreign_ops": {"addmm": 1, "relu": 1}}], set(), admitted
    )
    assert [f.rule for f in everything if f.severity is Severity.REJECT] == [CheatRule.TORCH_COMPUTE]
    partial = runtime_findings([{"trial": 0, "own_launches": 1, "foreign_ops": {"addmm": 1}}], set(), admitted)
    assert partial == []
    forbidden = runtime_findings([{"trial": 0, "own_launches": 1, "foreign_ops": {"addmm": 1}}], set())
    assert [f.rule for f in forbidden] == [CheatRule.TORCH_COMPUTE]


def test_torch_ops_option_lands_in_the_run_spec_and_defaults_to_forbid() -> None:
    from actors.commands.cli import build_parser
    from actors.commands.run import build_spec

    task = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    for argv, want in (([], P.FORBID), (["--torch-ops", "reference"], P.REFERENCE)):
        args = build_parser().parse_args(["run", str(task), *argv])
        assert build_spec(args, task.read_text(), DeviceChoice.CPU).torch_ops is want


def test_run_policy_reaches_the_experts_request() -> None:
    from actors.evolution.plans import ParentSource, RequestPlan
    from schemas import RunSpec, Task

    task = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    spec = RunSpec(task=Task.from_source("q", task.read_text()), torch_ops=P.REFERENCE)
    plan = RequestPlan("p", "i0", "template", Role.TEMPLATE, "start", ParentSource.FRESH, None, None, None, "", 0, 1)
    assert plan.request(spec).torch_ops is P.REFERENCE
    assert plan.request(spec.model_copy(update={"torch_ops": P.FORBID})).torch_ops is P.FORBID
