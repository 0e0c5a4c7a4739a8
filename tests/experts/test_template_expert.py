"""``TemplateExpert`` answering ``GenerateRequest``s: proposals, parents, diagnoses, declines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.experts.base import Expert
from actors.experts.template import Plan, TemplateParams, analyse, default_params, params_from_source, render
from actors.experts.template.expert import AnalysisMode, TemplateExpert
from actors.experts.template.hardware import detect
from actors.experts.template.interp_check import check_in_subprocess
from schemas import (
    Candidate,
    Correctness,
    DeclineReason,
    Diagnosis,
    DiagnosisCategory,
    EvalResult,
    EvalStatus,
    Experience,
    ExperienceHit,
    GenerateRequest,
    KernelLanguage,
    Proposal,
    Task,
    TaskSignature,
)
from tests.experts.template_cases import CASES, UNSUPPORTED

_SOURCE = next(c for c in CASES if c.name == "gemm_mean_softmax").sources()[0]
_TASK = Task.from_source("gemm_mean_softmax", _SOURCE)


def _expert(max_variants: int = 8) -> TemplateExpert:
    """An expert tracing in a thread (this test process runs nothing else on torch meanwhile)."""
    return TemplateExpert(max_variants=max_variants, analysis=AnalysisMode.THREAD)


def _request(**kw: object) -> GenerateRequest:
    fields: dict[str, object] = {"run_id": "r1", "island": "i0", "task": _TASK, "n": 4, "seed": 7}
    fields.update(kw)
    return GenerateRequest.model_validate(fields)


def _plan() -> Plan:
    plan = analyse(_SOURCE)
    assert isinstance(plan, Plan)
    return plan


def _parent(params: TemplateParams, *, with_params: bool) -> Candidate:
    from actors.experts.template import render

    source = render(_plan(), params)
    proposal = Proposal(source=source, language=KernelLanguage.TRITON, params=params.as_dict() if with_params else {})
    return Candidate(run_id="r1", island="i0", task_id=_TASK.task_id, expert="template", proposal=proposal)


def test_template_expert_satisfies_the_expert_protocol() -> None:
    assert isinstance(TemplateExpert(), Expert)
    with pytest.raises(ValueError, match="max_variants"):
        TemplateExpert(max_variants=0)
    with pytest.raises(ValueError, match="expert name"):
        TemplateExpert("bad name")


async def test_fresh_request_gives_default_first_then_distinct_mutants() -> None:
    expert = _expert()
    reply = await expert.generate(_request())
    assert reply.decline is None
    assert len(reply.proposals) == 4
    params = [TemplateParams.from_dict(dict(p.params)) for p in reply.proposals]
    assert params[0] == default_params(_plan())
    assert len(set(params)) == 4
    for proposal, p in zip(reply.proposals, params, strict=True):
        assert proposal.language is KernelLanguage.TRITON
        assert proposal.strategy.startswith("template:mm+row/")
        assert params_from_source(proposal.source) == ("mm+row", p)
    assert reply.proposals[0].strategy.endswith("/default")
    await expert.aclose()


async def test_same_request_gives_the_same_proposals_and_fresh_starts_walk_one_list() -> None:
    first = await _expert().generate(_request())
    again = await _expert().generate(_request(seed=8))  # a fresh start's list does not depend on the seed
    later = await _expert().generate(_request(start=1))
    assert [p.source for p in first.proposals] == [p.source for p in again.proposals]
    assert [p.params for p in later.proposals[:3]] == [p.params for p in first.proposals[1:]]


async def test_concurrent_fresh_starts_of_several_islands_are_all_different() -> None:
    """Eight requests in flight at a run's start (two islands, four each) asked one candidate
    each and all got the default configuration: on an H200, eight evaluations of one kernel."""
    expert = _expert()
    starts = [k * 2 + island for island in (0, 1) for k in range(4)]  # what IslandBrain asks
    replies = await asyncio.gather(*(expert.generate(_request(n=1, start=s, seed=s)) for s in starts))
    sources = [r.proposals[0].source for r in replies]
    assert len(set(sources)) == 8
    assert replies[0].proposals[0].strategy.endswith("/default")
    await expert.aclose()


async def test_a_configuration_proposed_again_has_the_source_rendered_fresh() -> None:
    from actors.experts.template import render

    expert = _expert()
    first = await expert.generate(_request())
    again = await expert.generate(_request())  # the same configurations: their sources are reused
    plan = await expert.plan_for(_TASK.task_id, _TASK.source)
    assert isinstance(plan, Plan)
    fresh = [render(plan, TemplateParams.from_dict(dict(p.params)), hw=detect()) for p in first.proposals]
    assert [p.source for p in first.proposals] == fresh
    assert [p.source for p in again.proposals] == fresh
    await expert.aclose()


@pytest.mark.parametrize("with_params", [True, False])
async def test_parent_is_mutated_whether_params_or_only_the_header_carry_it(with_params: bool) -> None:
    parent_params = default_params(_plan()).with_changes(mm_block_m=32, row_warps=8)
    reply = await _expert().generate(_request(parent=_parent(parent_params, with_params=with_params)))
    assert len(reply.proposals) == 4
    for proposal in reply.proposals:
        child = TemplateParams.from_dict(dict(proposal.params))
        assert child != parent_params
        diff = {k for k, v in child.as_dict().items() if v != parent_params.as_dict()[k]}
        assert 1 <= len(diff) <= 3
        assert "mutate.random" in proposal.strategy
        assert "→" in proposal.description


async def test_diagnosis_steers_the_mutation_of_a_parent() -> None:
    parent_params = default_params(_plan()).with_changes(mm_block_m=128, mm_block_n=128, mm_warps=8)
    diagnosis = Diagnosis(
        candidate_id="c0", category=DiagnosisCategory.COMPILE_RESOURCES, summary="out of shared memory"
    )
    reply = await _expert().generate(_request(parent=_parent(parent_params, with_params=True), diagnosis=diagnosis))
    for proposal in reply.proposals:
        child = TemplateParams.from_dict(dict(proposal.params))
        assert child.mm_block_m <= 128
        assert child.mm_block_n <= 128
        assert "compile.resources" in proposal.strategy


@pytest.mark.parametrize("same_task", [False, True])
async def test_experience_params_start_second_or_first_when_measured_on_this_task(same_task: bool) -> None:
    learned = default_params(_plan()).with_changes(mm_block_n=32, row_warps=2)
    signature = TaskSignature(ops=("linear", "mean", "softmax"))
    hits = tuple(
        ExperienceHit(
            experience=Experience(
                run_id="old",
                task_id=_TASK.task_id if same_task else "another",
                signature=signature,
                candidate_id=f"c{i}",
                expert="template",
                status=EvalStatus.CORRECT,
                child_fitness=fitness,
                description="x",
                params=p.as_dict(),
            ),
            score=0.9,
            utility=1.0,
        )
        for i, (p, fitness) in enumerate(((TemplateParams(), 0.5), (learned, 2.5)))
    )
    expert = _expert()
    both = await expert.generate(_request(experiences=hits))
    order = ["experience", "default"] if same_task else ["default", "experience"]
    assert [p.strategy.rsplit("/", 1)[1] for p in both.proposals[:2]] == order
    params = [TemplateParams.from_dict(dict(p.params)) for p in both.proposals[:2]]
    assert params == ([learned, default_params(_plan())] if same_task else [default_params(_plan()), learned])
    for start in (0, 1):  # one candidate per request, as islands ask
        single = await expert.generate(_request(experiences=hits, n=1, start=start))
        assert [p.params for p in single.proposals] == [both.proposals[start].params]
    await expert.aclose()


async def test_a_retrieved_best_equal_to_the_default_still_leads_as_the_experience() -> None:
    # CI failed the slow end-to-end test once: the first run's best was its default configuration,
    # so the second run's fresh starts all said "default" although they came from what it retrieved.
    plan = _plan()
    best = default_params(plan, detect())
    worse = best.with_changes(mm_block_n=32, row_warps=2)
    hits = tuple(
        ExperienceHit(
            experience=Experience(
                run_id="old", task_id="t", signature=TaskSignature(ops=("linear",)), candidate_id=f"c{i}",
                expert="template", status=EvalStatus.CORRECT, child_fitness=fitness, description="x",
                params=p.as_dict(),
            ),
            score=0.9,
            utility=1.0,
        )
        for i, (p, fitness) in enumerate(((worse, 0.5), (best, 2.5)))
    )  # fmt: skip
    expert = _expert()
    for seed in (2, 3):
        reply = await expert.generate(_request(experiences=hits).model_copy(update={"seed": seed, "n": 1}))
        assert [p.strategy.rsplit("/", 1)[1] for p in reply.proposals] == ["experience"]
        assert TemplateParams.from_dict(dict(reply.proposals[0].params)) == best
        assert "also the default" in reply.proposals[0].description
    plain = await expert.generate(_request().model_copy(update={"seed": 3, "n": 1}))
    assert [p.strategy.rsplit("/", 1)[1] for p in plain.proposals] == ["default"]


async def test_unsupported_reference_and_cuda_requests_are_declined() -> None:
    expert = _expert()
    task = Task.from_source("conv", UNSUPPORTED["conv_reflect_padding"])
    reply = await expert.generate(_request(task=task))
    assert reply.decline is not None
    assert reply.decline.reason is DeclineReason.UNSUPPORTED
    assert "padding_mode" in reply.decline.detail
    cuda = await expert.generate(_request(language=KernelLanguage.CUDA))
    assert cuda.decline is not None
    assert cuda.decline.reason is DeclineReason.UNSUPPORTED
    assert expert.stats().declines == 2


async def test_a_decline_names_the_op_only_where_an_uncovered_op_stopped_it() -> None:
    head = "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
    tail = "\n\ndef get_inputs():\n    return [torch.randn(8, 8{})]\n\n\ndef get_init_inputs():\n    return []\n"
    expert = _expert()
    uncovered = head + "        return torch.erfinv(x)\n" + tail.format("")
    float64 = head + "        return x.relu()\n" + tail.format(", dtype=torch.float64")
    op = await expert.generate(_request(task=Task.from_source("erfinv", uncovered)))
    dtype = await expert.generate(_request(task=Task.from_source("float64", float64)))
    assert op.decline is not None
    assert op.decline.op == "function torch.erfinv"  # --torch-ops reference leaves it to PyTorch
    assert dtype.decline is not None
    assert dtype.decline.reason is DeclineReason.UNSUPPORTED
    assert dtype.decline.op is None, dtype.decline  # leaving ops to PyTorch does not help


async def test_plan_is_traced_once_per_task_even_under_concurrent_requests() -> None:
    expert = _expert(max_variants=3)
    replies = await asyncio.gather(*(expert.generate(_request(seed=s, n=10)) for s in range(4)))
    assert all(len(r.proposals) == 3 for r in replies)
    assert expert.stats().plans_traced == 1
    assert expert.stats().requests == 4


@pytest.mark.slow  # ~10 s on a 2-core host; test_template_isolate and the e2e run keep the child's analysis
async def test_default_expert_traces_in_a_child_process_and_its_proposals_are_correct(tmp_path: Path) -> None:
    expert = TemplateExpert()
    assert expert.analysis is AnalysisMode.PROCESS
    reply = await expert.generate(_request(n=5, seed=3))
    assert expert.stats().plans_traced == 1
    declined = await expert.generate(_request(task=Task.from_source("conv", UNSUPPORTED["conv_reflect_padding"])))
    assert declined.decline is not None
    assert "padding_mode" in declined.decline.detail
    jobs = [
        {"reference": _SOURCE, "candidate": p.source, "seeds": [5], "atol": 1e-4, "rtol": 1e-4} for p in reply.proposals
    ]
    verdicts = await asyncio.to_thread(check_in_subprocess, jobs, tmp_path, 120.0)
    assert [v.detail for v in verdicts] == ["ok"] * 5


async def test_requests_pass_over_the_kernels_the_island_has() -> None:
    expert = _expert()
    parent = _parent(default_params(_plan()).with_changes(mm_block_m=32), with_params=True)
    first = await expert.generate(_request(parent=parent))
    have = tuple(p.fingerprint for p in first.proposals)
    again = await expert.generate(_request(parent=parent, avoid=have))  # the same seed draws the same moves
    assert len(again.proposals) == 4
    assert not {p.fingerprint for p in again.proposals} & set(have)
    fresh = await expert.generate(_request(n=1))
    other = await expert.generate(_request(n=1, avoid=(fresh.proposals[0].fingerprint,)))
    assert fresh.proposals[0].strategy.endswith("/default")
    assert other.proposals[0].fingerprint != fresh.proposals[0].fingerprint
    await expert.aclose()


_CONV_SOURCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 64, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(2, 16, 12, 12)]


def get_init_inputs():
    return []
"""


_STEM_SOURCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 7, padding=3)
        self.a = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        self.b = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(torch.relu(self.stem(x)))))


def get_inputs():
    return [torch.randn(2, 3, 32, 32)]


def get_init_inputs():
    return []
"""


def test_a_narrow_stem_does_not_make_a_whole_model_ieee() -> None:
    """A model's output carries the TF32 error of its wide convolutions: a 3-channel stem that is
    its heaviest single convolution but holds a third of the products does not make cuDNN's
    precision IEEE (ResNet-18, KernelBench L3-9: its stem is 6.5% and started in three passes at
    0.15x eager); a model of narrow convolutions alone still is."""
    from actors.experts.template.kernels.conv import cudnn_ieee_likely

    plan = analyse(_STEM_SOURCE)
    assert isinstance(plan, Plan)
    assert not cudnn_ieee_likely(plan)
    narrow = analyse(
        _STEM_SOURCE.replace(
            "nn.Conv2d(64, 64, 3, stride=2, padding=1)", "nn.Conv2d(64, 8, 3, stride=2, padding=1)"
        ).replace("nn.Conv2d(64, 64, 3, padding=1)", "nn.Conv2d(8, 8, 3, padding=1)")
    )
    assert isinstance(narrow, Plan)
    assert cudnn_ieee_likely(narrow)  # the stem and an 8-channel convolution: most products narrow


async def test_tf32_refused_or_a_verdict_at_exact_precision_ends_tf32_for_that_task() -> None:
    """Where the reference's cuDNN computes in IEEE fp32 (few input channels), the evaluator judges
    at exact precision and refuses a TF32 candidate (``incorrect.precision``): the expert then
    proposes no TF32 for that task, neither from that parent nor later. Control: before the
    refusal, mutations of the same parent propose TF32."""
    from actors.experts.template.hardware import lookup

    task = Task.from_source("conv_relu_16", _CONV_SOURCE)
    plan = analyse(_CONV_SOURCE)
    assert isinstance(plan, Plan)
    tf32_parent = default_params(plan, lookup("NVIDIA H200"), tf32=True)
    assert tf32_parent.conv_precision == "tf32"
    ieee_parent = tf32_parent.with_changes(conv_precision="ieee")

    def parent(params: TemplateParams) -> Candidate:
        proposal = Proposal(source=render(plan, params), language=KernelLanguage.TRITON, params=params.as_dict())
        return Candidate(run_id="r1", island="i0", task_id=task.task_id, expert="template", proposal=proposal)

    def request(
        p: TemplateParams, seed: int, diagnosis: Diagnosis | None = None, result: EvalResult | None = None
    ) -> GenerateRequest:
        return GenerateRequest(
            run_id="r1", island="i0", task=task, n=8, seed=seed, parent=parent(p), diagnosis=diagnosis,
            parent_result=result,
        )  # fmt: skip

    async def precisions(expert: TemplateExpert, p: TemplateParams) -> set[str]:
        seen: set[str] = set()
        for seed in range(12):
            reply = await expert.generate(request(p, seed))
            seen |= {str(pr.params["conv_precision"]) for pr in reply.proposals}
        return seen

    expert = _expert()
    assert "tf32" in await precisions(expert, ieee_parent)  # the control: TF32 is proposed
    refused = Diagnosis(candidate_id="c0", category=DiagnosisCategory.INCORRECT_PRECISION, summary="above the bar")
    reply = await expert.generate(request(tf32_parent, 99, refused))
    assert reply.proposals
    assert all(pr.params["conv_precision"] != "tf32" for pr in reply.proposals)
    assert "tf32" not in await precisions(expert, ieee_parent)

    # The verdict of any parent says so too: the reference's IEEE error measured, none other at
    # PyTorch's defaults (no precision parity granted for this task).
    expert = _expert()
    assert "tf32" in await precisions(expert, ieee_parent)
    exact = Correctness(trials=2, passed_trials=2, atol=1e-4, rtol=1e-4, err_vs_fp64=2e-7, ref_err_vs_fp64=1.6e-7)
    judged = EvalResult(
        run_id="r1", candidate_id="c1", task_id=task.task_id, status=EvalStatus.CORRECT, summary="ok", correctness=exact
    )
    await expert.generate(request(ieee_parent, 98, result=judged))
    assert "tf32" not in await precisions(expert, ieee_parent)

    # A later verdict that measured the reference at PyTorch's defaults in TF32 (an earlier measure
    # was cuDNN without room for its workspace): TF32 is proposed again.
    tf32_seen = exact.model_copy(update={"ref_default_err_vs_fp64": 3.5e-4})
    later = judged.model_copy(update={"candidate_id": "c2", "correctness": tf32_seen})
    await expert.generate(request(ieee_parent, 97, result=later))
    assert "tf32" in await precisions(expert, ieee_parent)
    # an IEEE-like measure at the defaults does not
    expert = _expert()
    await expert.generate(request(tf32_parent, 99, refused))
    ieee_like = judged.model_copy(update={"correctness": exact.model_copy(update={"ref_default_err_vs_fp64": 4.3e-7})})
    await expert.generate(request(ieee_parent, 96, result=ieee_like))
    assert "tf32" not in await precisions(expert, ieee_parent)


async def test_few_input_channels_start_without_tf32_first_and_tf32_second() -> None:
    """cuDNN computes convolutions of 2 to 15 input channels in IEEE fp32 at PyTorch's defaults
    (``cudnn_ieee_likely``), so precision parity grants them no TF32: a fresh start leads with the
    default without TF32 and offers the one-pass TF32 default second; 16 channels keep TF32 first."""
    from actors.experts.template.hardware import lookup
    from actors.experts.template.kernels.conv import cudnn_ieee_likely

    source = _CONV_SOURCE.replace("nn.Conv2d(16, 64, 3)", "nn.Conv2d(8, 64, 3)").replace(
        "(2, 16, 12, 12)", "(2, 8, 12, 12)"
    )
    plan, wide = analyse(source), analyse(_CONV_SOURCE)
    assert isinstance(plan, Plan)
    assert isinstance(wide, Plan)
    assert cudnn_ieee_likely(plan)
    assert not cudnn_ieee_likely(wide)
    h200 = lookup("NVIDIA H200")
    assert h200 is not None
    expert = TemplateExpert(max_variants=8, analysis=AnalysisMode.THREAD, gpu="NVIDIA H200")
    task = Task.from_source("conv_relu_8_fresh", source)
    reply = await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=4, seed=1))
    first = [TemplateParams.from_dict(dict(p.params)) for p in reply.proposals]
    assert first[0] == default_params(plan, h200, tf32=False)
    assert first[0].conv_precision == "tf32x3"
    assert not first[0].conv_taps_outer
    assert first[1] == default_params(plan, h200, tf32=True)
    assert first[1].conv_precision == "tf32"
    assert "one TF32 pass" in reply.proposals[1].description
    assert [p.strategy.endswith("/default") for p in reply.proposals[:2]] == [True, True]
    await expert.aclose()


async def test_a_fresh_start_holds_a_candidate_without_tf32_until_a_verdict_says_which_applies() -> None:
    """A run that admits TF32 convolutions cannot know at its start whether the reference's own
    cuDNN uses it (it computes IEEE fp32 for few input channels, and the evaluator then judges at
    exact precision): the same default without TF32 comes second, so either way a first batch
    holds a correct candidate. An exact run, or a task found exact, starts without TF32 at all."""
    from actors.experts.template.hardware import lookup

    task = Task.from_source("conv_relu_16_fresh", _CONV_SOURCE)
    plan = analyse(_CONV_SOURCE)
    assert isinstance(plan, Plan)
    h200 = lookup("NVIDIA H200")
    assert h200 is not None
    expert = TemplateExpert(max_variants=8, analysis=AnalysisMode.THREAD, gpu="NVIDIA H200")
    reply = await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=4, seed=1))
    first = [TemplateParams.from_dict(dict(p.params)) for p in reply.proposals]
    assert first[0] == default_params(plan, h200, tf32=True)
    assert first[0].conv_precision == "tf32"
    assert first[1] == default_params(plan, h200, tf32=False)
    assert first[1].conv_precision in ("ieee", "tf32x3")
    assert "without TF32" in reply.proposals[1].description
    assert reply.proposals[1].strategy.endswith("/default")

    exact = Correctness(trials=2, passed_trials=2, atol=1e-4, rtol=1e-4, err_vs_fp64=2e-7, ref_err_vs_fp64=1.6e-7)
    judged = EvalResult(
        run_id="r1", candidate_id="c1", task_id=task.task_id, status=EvalStatus.CORRECT, summary="ok", correctness=exact
    )
    parent = Candidate(
        run_id="r1", island="i0", task_id=task.task_id, expert="template",
        proposal=Proposal(source=render(plan, first[1]), language=KernelLanguage.TRITON, params=first[1].as_dict()),
    )  # fmt: skip
    await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=2, seed=2, parent=parent,
                                          parent_result=judged))  # fmt: skip
    again = await expert.generate(GenerateRequest(run_id="r1", island="i1", task=task, n=4, seed=3))
    params = [TemplateParams.from_dict(dict(p.params)) for p in again.proposals]
    assert params[0] == first[1]
    assert all(p.conv_precision != "tf32" for p in params)
    await expert.aclose()


@pytest.mark.skipif(detect().is_gpu, reason="sizes for another GPU than this machine's")
async def test_fresh_starts_are_sized_for_the_gpu_configured_else_the_one_the_verdicts_name() -> None:
    """An expert on a machine without the evaluators' GPU sizes fresh starts for the GPU its
    configuration names (``ExpertConfig.target_gpu``), else for the one the newest verdict it was
    shown names, rather than for its own machine."""
    from actors.experts.registry import build_expert
    from actors.experts.template.hardware import lookup
    from schemas import DeviceInfo, DeviceKind, ExpertConfig, ExpertKind

    plan = analyse(_CONV_SOURCE)
    assert isinstance(plan, Plan)
    h200 = lookup("NVIDIA H200")
    assert h200 is not None
    assert not detect().is_gpu
    on_h200 = default_params(plan, h200, tf32=True)
    assert on_h200 != default_params(plan, detect(), tf32=True)

    async def first(expert: TemplateExpert, task: Task) -> TemplateParams:
        reply = await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=1, seed=1))
        return TemplateParams.from_dict(dict(reply.proposals[0].params))

    configured = build_expert(ExpertConfig(name="tpl", kind=ExpertKind.TEMPLATE, target_gpu="H200"))
    assert isinstance(configured, TemplateExpert)
    configured.analysis = AnalysisMode.THREAD
    assert await first(configured, Task.from_source("conv_gpu_named", _CONV_SOURCE)) == on_h200
    await configured.aclose()

    expert = TemplateExpert(analysis=AnalysisMode.THREAD)
    task = Task.from_source("conv_gpu_seen", _CONV_SOURCE)
    local = await first(expert, task)
    assert local != on_h200
    parent = Candidate(
        run_id="r1", island="i0", task_id=task.task_id, expert="template",
        proposal=Proposal(source=render(plan, local), language=KernelLanguage.TRITON, params=local.as_dict()),
    )  # fmt: skip
    device = DeviceInfo(
        kind=DeviceKind.CUDA, name="NVIDIA H200", capability="9.0", torch="2.11.0", python="3.12", host="gpu-host"
    )
    judged = EvalResult(
        run_id="r1", candidate_id=parent.candidate_id, task_id=task.task_id, status=EvalStatus.CORRECT,
        summary="ok", device=device,
    )  # fmt: skip
    await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=1, seed=2, parent=parent,
                                          parent_result=judged))  # fmt: skip
    assert await first(expert, Task.from_source("conv_gpu_seen_2", _CONV_SOURCE)) == on_h200
    await expert.aclose()


_SE_RESNET = (Path(__file__).resolve().parents[2] / "examples" / "models" / "se_resnet.py").read_text()


async def test_a_whole_model_starts_with_its_constants_shared_and_then_without() -> None:
    # SE-ResNet (examples/models): 68 kernels, their layers of other widths one function each with
    # share_sizes (31 functions): a first verdict sooner; the same start with every size a constant
    # follows the defaults, so a fresh start holds both.
    task = Task.from_source("se_resnet", _SE_RESNET)
    reply = await _expert().generate(_request(task=task, n=4))
    assert reply.decline is None, reply.decline
    params = [TemplateParams.from_dict(dict(p.params)) for p in reply.proposals]
    assert params[0].share_sizes
    assert "kf_c0" in reply.proposals[0].source
    apart = next(i for i, p in enumerate(params) if not p.share_sizes)
    assert params[apart] == params[0].with_changes(share_sizes=False)
    assert reply.proposals[apart].strategy.endswith("/default"), reply.proposals[apart].strategy
    assert "kf_c0" not in reply.proposals[apart].source


async def test_a_parent_with_share_sizes_from_a_whole_model_loses_it_on_a_small_plan() -> None:
    # share_sizes is the tuner's only for plans of many kernels: elsewhere nothing would move it back
    parent = _parent(default_params(_plan()).with_changes(share_sizes=True), with_params=True)
    reply = await _expert().generate(_request(parent=parent, n=3))
    assert reply.proposals
    assert not any(TemplateParams.from_dict(dict(p.params)).share_sizes for p in reply.proposals)
