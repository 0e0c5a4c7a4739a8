"""The LLM diagnoser against a real loopback server: refinement within bounds, safe fallback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from actors.diagnosis.llm_diagnoser import LLMDiagnoser, parse_verdict
from actors.llm.client import RetryPolicy
from schemas import (
    Candidate,
    CheatRule,
    Correctness,
    Diagnosis,
    DiagnosisCategory,
    EvalResult,
    EvalStatus,
    ExpertConfig,
    ExpertKind,
    Finding,
    KernelLanguage,
    Proposal,
    Severity,
)
from tests.experts.llm_server import GOOD_MODELNEW, Chat, ScriptedLLMServer, Status

pytestmark = pytest.mark.timeout(20)

KEY = "sk-diag-7c1e5d0a9b3f"
FAST = RetryPolicy(base_s=0.01, max_s=0.02)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedLLMServer]:
    async with ScriptedLLMServer() as srv:
        yield srv


def diagnoser(server: ScriptedLLMServer, **overrides: Any) -> LLMDiagnoser:
    fields: dict[str, Any] = {
        "name": "diag",
        "kind": ExpertKind.LLM,
        "base_url": server.base_url,
        "model": "scripted-model",
        "api_key": SecretStr(KEY),
        "max_retries": 1,
        "revision": 3,
        **overrides,
    }
    return LLMDiagnoser(ExpertConfig.model_validate(fields), retry=FAST)


CANDIDATE = Candidate(
    run_id="r",
    island="i",
    task_id="t",
    expert="llm-fusion",
    proposal=Proposal(source=GOOD_MODELNEW.replace("mask=mask", "mask=None"), language=KernelLanguage.TRITON),
)

INCORRECT = EvalResult(
    run_id="r",
    candidate_id=CANDIDATE.candidate_id,
    task_id="t",
    status=EvalStatus.INCORRECT,
    summary="outputs differ from the reference in 1 of 3 trials",
    correctness=Correctness(
        trials=3, passed_trials=2, atol=1e-4, rtol=1e-4, max_abs_err=3.2, first_bad_index=(15, 16381)
    ),
)

BASELINE = Diagnosis(
    candidate_id=CANDIDATE.candidate_id,
    category=DiagnosisCategory.INCORRECT_OTHER,
    summary="outputs differ from the reference",
    evidence=("max abs error 3.2",),
    hints=("Compare the kernel's indexing with the reference.",),
    suggested_expert="repair",
    sol_distance=None,
    confidence=0.5,
    diagnoser="rules-1",
)


def verdict(**fields: Any) -> str:
    return "```json\n" + json.dumps(fields) + "\n```"


async def test_refines_the_category_within_its_family_and_puts_model_hints_first(server: ScriptedLLMServer) -> None:
    server.push(
        Chat(
            (
                verdict(
                    category="incorrect.boundary",
                    summary="The last block reads and writes past the end: masks were removed.",
                    evidence=["first bad element at the last column (16381)"],
                    hints=["Restore mask=offs < n on the load and the store."],
                    suggested_expert="repair",
                    confidence=0.8,
                ),
            )
        )
    )
    diag = diagnoser(server)
    refined = await diag.diagnose(INCORRECT, CANDIDATE, BASELINE)
    await diag.aclose()
    assert refined.category is DiagnosisCategory.INCORRECT_BOUNDARY
    assert refined.summary.startswith("The last block reads")
    assert refined.hints == ("Restore mask=offs < n on the load and the store.", *BASELINE.hints)
    assert refined.evidence[: len(BASELINE.evidence)] == BASELINE.evidence
    assert "llm: refined incorrect.other to incorrect.boundary" in refined.evidence
    assert refined.confidence == 0.8
    assert refined.sol_distance is None
    assert refined.candidate_id == BASELINE.candidate_id
    assert refined.diagnoser == "rules-1+llm:diag@r3"
    assert diag.tokens_used == 200
    prompt = server.completions[0].prompt
    assert "incorrect.boundary" in prompt  # the allowed categories of the family are offered
    assert "compile.syntax" not in prompt
    assert "mask=None" in prompt  # the candidate's source
    assert "first bad element at index [15, 16381]" in prompt
    assert "Compare the kernel's indexing with the reference." in prompt


async def test_a_category_from_another_family_is_not_taken(server: ScriptedLLMServer) -> None:
    server.push(Chat((verdict(category="slow.memory_bound", hints=["Use wider loads."]),)))
    diag = diagnoser(server)
    refined = await diag.diagnose(INCORRECT, CANDIDATE, BASELINE)
    await diag.aclose()
    assert refined.category is DiagnosisCategory.INCORRECT_OTHER
    assert "llm: proposed slow.memory_bound, kept incorrect.other" in refined.evidence
    assert refined.confidence == BASELINE.confidence
    assert refined.hints[0] == "Use wider loads."


async def test_anti_cheat_rejections_never_change_category(server: ScriptedLLMServer) -> None:
    rejected = INCORRECT.model_copy(
        update={
            "status": EvalStatus.REJECTED,
            "findings": (
                Finding(rule=CheatRule.TORCH_FALLBACK, severity=Severity.REJECT, message="try/except", line=3),
            ),
        }
    )
    baseline = BASELINE.model_copy(update={"category": DiagnosisCategory.REJECTED_TORCH_FALLBACK})
    server.push(Chat((verdict(category="rejected.threads", suggested_expert="wizard"),)))
    diag = diagnoser(server)
    refined = await diag.diagnose(rejected, CANDIDATE, baseline)
    await diag.aclose()
    assert refined.category is DiagnosisCategory.REJECTED_TORCH_FALLBACK
    assert refined.suggested_expert == "repair"  # 'wizard' is not a role
    assert "must stay rejected.torch_fallback" in server.completions[0].messages[0]["content"]


@pytest.mark.parametrize(
    "replies",
    [
        (Status(500, "down", echo_authorization=True), Status(503, "down", echo_authorization=True)),
        (Chat(("The kernel looks wrong near the edges.",)),),
        (Chat(('{"hints": "not a list"}',)),),
        (Chat((), prompt_tokens=10),),
    ],
)
async def test_trouble_returns_the_baseline_with_a_note(
    server: ScriptedLLMServer, replies: tuple[Chat | Status, ...]
) -> None:
    server.push(*replies)
    diag = diagnoser(server)
    cause = "endpoint" if isinstance(replies[0], Status) else "reply"
    fallbacks = {"expert": "diag", "cause": cause}
    before = REGISTRY.get_sample_value("kfoundry_llm_diagnoser_fallbacks_total", fallbacks) or 0.0
    result = await diag.diagnose(INCORRECT, None, BASELINE)
    await diag.aclose()
    assert REGISTRY.get_sample_value("kfoundry_llm_diagnoser_fallbacks_total", fallbacks) == before + 1
    assert result.model_dump(exclude={"evidence"}) == BASELINE.model_dump(exclude={"evidence"})
    assert result.evidence[:-1] == BASELINE.evidence
    assert result.evidence[-1].startswith("llm diagnoser diag not applied: ")
    assert KEY not in result.model_dump_json()


async def test_exhausted_budget_skips_the_call(server: ScriptedLLMServer) -> None:
    diag = diagnoser(server, token_budget=100)
    budget = {"expert": "diag", "cause": "budget"}
    before = REGISTRY.get_sample_value("kfoundry_llm_diagnoser_fallbacks_total", budget) or 0.0
    result = await diag.diagnose(INCORRECT, CANDIDATE, BASELINE)
    await diag.aclose()
    assert REGISTRY.get_sample_value("kfoundry_llm_diagnoser_fallbacks_total", budget) == before + 1
    assert "token budget exhausted" in result.evidence[-1]
    assert server.completions == []


def test_verdict_parsing_accepts_bare_fenced_and_embedded_json() -> None:
    body = {"category": "compile.type", "hints": ["x"]}
    for text in (json.dumps(body), verdict(**body), "Here you go: " + json.dumps(body) + " Hope it helps."):
        parsed = parse_verdict(text)
        assert parsed is not None
        assert (parsed.category, parsed.hints) == ("compile.type", ["x"])
    assert parse_verdict("no json here") is None
    assert parse_verdict("[1, 2]") is None
