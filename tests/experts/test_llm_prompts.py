"""Role prompts and message assembly (pure; the expert tests check what reaches the server)."""

from __future__ import annotations

import pytest

from actors.llm.prompts import CONTRACT, MAX_EXPERIENCES, ROLES, SOURCE_LIMIT, build_messages, system_prompt
from schemas import (
    Candidate,
    EvalResult,
    EvalStatus,
    Experience,
    ExperienceHit,
    ExpertConfig,
    ExpertKind,
    GenerateRequest,
    KernelLanguage,
    Proposal,
    Role,
    Task,
    TaskSignature,
    TensorSpec,
)
from tests.experts.llm_server import GOOD_MODELNEW, REFERENCE_SOURCE

pytestmark = pytest.mark.timeout(10)

CONFIG = ExpertConfig(name="llm", kind=ExpertKind.LLM, base_url="http://127.0.0.1:9/v1", model="m", role="tiling")


def request(**overrides: object) -> GenerateRequest:
    fields: dict[str, object] = {"run_id": "r", "island": "i", "task": Task.from_source("t", REFERENCE_SOURCE)}
    return GenerateRequest.model_validate({**fields, **overrides})


def test_every_role_has_a_distinct_system_prompt_with_the_contract() -> None:
    assert set(ROLES) == {"memory", "fusion", "tiling", "algorithm", "repair", "general"}
    prompts = {system_prompt(role, KernelLanguage.TRITON) for role in ROLES}
    assert len(prompts) == len(ROLES)
    for prompt in prompts:
        assert CONTRACT in prompt
        assert "torch.compile" in prompt  # what the static gate rejects is spelled out


def test_fresh_request_asks_for_a_first_version_in_the_role_of_the_config() -> None:
    signature = TaskSignature(
        ops=("gelu", "mul"),
        inputs=(TensorSpec(shape=(16, 16383), dtype="float32"),),
        outputs=(TensorSpec(shape=(16, 16383), dtype="float32"),),
        flops=2_000_000,
        bytes_moved=2_097_024,
    )
    task = Task.from_source("gelu_scale", REFERENCE_SOURCE, signature)
    system, user = build_messages(request(task=task), CONFIG)
    assert "tiling and parallelism" in system["content"]
    assert "Write a first Triton version" in user["content"]
    assert "ops: gelu -> mul; inputs: float32[16, 16383]" in user["content"]
    assert "2,000,000 FLOPs" in user["content"]
    assert "Current candidate" not in user["content"]


def test_slow_parent_asks_for_speed_and_shows_the_numbers() -> None:
    parent = Candidate(
        run_id="r",
        island="i",
        task_id="t",
        expert="template",
        proposal=Proposal(source=GOOD_MODELNEW, language=KernelLanguage.TRITON),
    )
    result = EvalResult(
        run_id="r",
        candidate_id=parent.candidate_id,
        task_id="t",
        status=EvalStatus.CORRECT,
        summary="correct, 1.31x eager",
        speedup_vs_eager=1.31,
        speedup_vs_compiled=0.87,
    )
    _, user = build_messages(request(parent=parent, parent_result=result), CONFIG, Role.MEMORY)
    text = user["content"]
    assert "Make the current candidate faster" in text
    assert "speedup vs eager PyTorch: 1.310x" in text
    assert "speedup vs torch.compile: 0.870x" in text
    assert GOOD_MODELNEW.strip() in text


def test_long_sources_are_shortened_and_experiences_capped() -> None:
    huge = REFERENCE_SOURCE + "#" * (SOURCE_LIMIT * 2)
    exp = Experience(
        run_id="r",
        task_id="t",
        signature=TaskSignature(),
        candidate_id="c",
        expert="e",
        status=EvalStatus.CORRECT,
        description="tried something",
    )
    hits = tuple(ExperienceHit(experience=exp, score=0.5, utility=0.5) for _ in range(MAX_EXPERIENCES + 4))
    _, user = build_messages(request(task=Task.from_source("t", huge), experiences=hits), CONFIG)
    assert len(user["content"]) < SOURCE_LIMIT + 5_000
    assert "[truncated]" in user["content"]
    assert user["content"].count("tried something") == MAX_EXPERIENCES


def test_the_prompt_says_what_precision_the_run_admits() -> None:
    """Under precision parity a convolution may take cuDNN's TF32, rounded as cuDNN rounds it; a
    matmul may not, nor anything at --precision exact."""
    conv = Task.from_source("conv", "import torch.nn as nn\n\n\nclass Model(nn.Module):\n    pass  # nn.Conv2d\n")
    _, user = build_messages(request(task=conv), CONFIG)
    assert "may use one TF32 tensor-core pass" in user["content"]
    assert "0x1000) & -0x2000" in user["content"]
    _, user = build_messages(request(task=conv, precision="exact"), CONFIG)
    assert "Judged at exact precision" in user["content"]
    assert "TF32 tensor-core pass" not in user["content"]
    _, user = build_messages(request(), CONFIG)  # no convolution
    assert "must be IEEE-accurate" in user["content"]
    assert "TF32 tensor-core pass" not in user["content"]


def test_unknown_role_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown role 'poetry'"):
        build_messages(request(), CONFIG, "poetry")  # type: ignore[arg-type]
