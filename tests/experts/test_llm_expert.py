"""The LLM expert against a real OpenAI-compatible server on loopback: proposals, prompts, budgets,
concurrency and live reconfiguration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from actors.evolution.metaprompt import MetaPromptEvolver, parse_strategy
from actors.experts.base import Expert
from actors.experts.llm import LLMExpert
from actors.experts.llm.expert import MIN_COMPLETION_TOKENS
from actors.llm.errors import MissingApiKey, UnknownRole
from actors.runtime.errors import ConfigError
from schemas import (
    Candidate,
    DeclineReason,
    Diagnosis,
    DiagnosisCategory,
    EvalResult,
    EvalStatus,
    Experience,
    ExperienceHit,
    KernelLanguage,
    Proposal,
    Role,
    TaskSignature,
)
from tests.experts.llm_server import (
    BROKEN_MODELNEW,
    FAST_RETRY,
    GOOD_MODELNEW,
    Chat,
    ScriptedLLMServer,
    answer,
    expert_config,
    generate_request,
)

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedLLMServer]:
    async with ScriptedLLMServer() as srv:
        yield srv


async def test_good_reply_becomes_a_proposal_with_role_and_section(server: ScriptedLLMServer) -> None:
    evolver = MetaPromptEvolver(Role.FUSION, seed=1)
    section = evolver.choose()
    server.push(Chat((answer(GOOD_MODELNEW),), prompt_tokens=900, completion_tokens=300))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY, instance_id="inst-1")
    assert isinstance(expert, Expert)
    reply = await expert.generate(generate_request(meta_prompt=section.text))
    await expert.aclose()
    assert reply.decline is None
    (proposal,) = reply.proposals
    assert proposal.source == GOOD_MODELNEW
    assert proposal.language is KernelLanguage.TRITON
    assert proposal.description == "Fused GELU and scaling into one masked kernel."
    assert parse_strategy(proposal.strategy) == ("fusion", section.section_id)
    assert proposal.params == {"model": "scripted-model", "config_revision": 0}
    assert (reply.expert, reply.expert_instance) == ("llm-fusion", "inst-1")
    assert (reply.tokens.prompt, reply.tokens.completion) == (900, 300)
    assert expert.tokens_used == 1200
    body = server.completions[0].body
    assert (body["model"], body["n"], body["seed"]) == ("scripted-model", 1, 7)
    assert body["max_tokens"] == 4096


async def test_proposal_outcome_credits_the_meta_prompt_section(server: ScriptedLLMServer) -> None:
    evolver = MetaPromptEvolver(Role.FUSION, seed=3)
    section = evolver.choose()
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request(meta_prompt=section.text))
    await expert.aclose()
    _, section_id = parse_strategy(reply.proposals[0].strategy)
    assert section_id is not None
    evolver.record(section_id, delta=0.4)
    credited = {s.section_id: s for s in evolver.sections}[section.section_id]
    assert credited.uses == 1
    assert credited.mean > 0.5


async def test_proposal_strategy_carries_the_section_id_the_request_names(server: ScriptedLLMServer) -> None:
    first, second = MetaPromptEvolver(Role.FUSION, seed=3).sections[:2]
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    request = generate_request(meta_prompt=first.text, meta_prompt_section=second.section_id)
    reply = await expert.generate(request)
    await expert.aclose()
    assert parse_strategy(reply.proposals[0].strategy) == ("fusion", second.section_id)


async def test_prompt_carries_task_parent_diagnosis_experiences_and_meta_prompt(server: ScriptedLLMServer) -> None:
    parent = Candidate(
        run_id="run1",
        island="i0",
        task_id="t",
        expert="template",
        proposal=Proposal(source=BROKEN_MODELNEW, language=KernelLanguage.TRITON, strategy="elementwise"),
    )
    result = EvalResult(
        run_id="run1",
        candidate_id=parent.candidate_id,
        task_id="t",
        status=EvalStatus.COMPILE_ERROR,
        summary="compile error in gelu_scale_kernel",
        compile_log="ValueError: arange's arguments must be of type tl.constexpr",
    )
    diagnosis = Diagnosis(
        candidate_id=parent.candidate_id,
        category=DiagnosisCategory.COMPILE_TYPE,
        summary="tl.arange got a runtime bound",
        evidence=("arange's arguments must be of type tl.constexpr (line 9)",),
        hints=("Declare BLOCK as tl.constexpr in the kernel signature.",),
        suggested_expert="repair",
    )
    experience = Experience(
        run_id="old",
        task_id="t2",
        signature=TaskSignature(ops=("gelu", "mul")),
        candidate_id="c9",
        expert="llm-repair",
        strategy="repair",
        status=EvalStatus.CORRECT,
        parent_fitness=None,
        child_fitness=1.7,
        description="made the block size a constexpr and masked the tail",
        source_excerpt="BLOCK: tl.constexpr",
    )
    meta = MetaPromptEvolver(Role.REPAIR, seed=0).choose().text
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server, role="repair"), retry=FAST_RETRY)
    reply = await expert.generate(
        generate_request(
            parent=parent,
            parent_result=result,
            diagnosis=diagnosis,
            experiences=(ExperienceHit(experience=experience, score=0.83, utility=0.6),),
            meta_prompt=meta,
            instructions="Keep the kernel count at one.",
        )
    )
    await expert.aclose()
    assert reply.proposals
    request = server.completions[0]
    system, user = request.messages
    assert system["role"] == "system"
    assert "repairing broken kernels" in system["content"]
    assert "@triton.jit" in system["content"]
    assert "class ModelNew" in system["content"]
    prompt = user["content"]
    for expected in (
        "def get_init_inputs",  # the reference
        "def gelu_scale_kernel(x_ptr, out_ptr, n, scale, BLOCK)",  # the parent
        "compile.type",
        "arange's arguments must be of type tl.constexpr (line 9)",
        "Declare BLOCK as tl.constexpr in the kernel signature.",
        "made the block size a constexpr and masked the tail",
        "fitness change +1.700",
        meta,
        "Keep the kernel count at one.",
        "Fix that failure first",
    ):
        assert expected in prompt, expected


async def test_cuda_request_asks_for_load_inline(server: ScriptedLLMServer) -> None:
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request(language=KernelLanguage.CUDA))
    await expert.aclose()
    assert "load_inline" in server.completions[0].messages[0]["content"]
    assert reply.proposals[0].language is KernelLanguage.CUDA


async def test_code_that_does_not_compile_is_returned_for_the_evaluator(server: ScriptedLLMServer) -> None:
    server.push(Chat((answer(BROKEN_MODELNEW),)))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert [p.source for p in reply.proposals] == [BROKEN_MODELNEW]


async def test_several_choices_give_several_proposals(server: ScriptedLLMServer) -> None:
    other = GOOD_MODELNEW.replace("BLOCK = 1024", "BLOCK = 4096")
    server.push(Chat((answer(GOOD_MODELNEW), answer(other), answer(GOOD_MODELNEW))))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request(n=3))
    await expert.aclose()
    assert [p.source for p in reply.proposals] == [GOOD_MODELNEW, other]
    assert server.completions[0].body["n"] == 3
    assert len(server.completions) == 1


async def test_endpoint_that_ignores_n_gets_one_call_per_missing_candidate(server: ScriptedLLMServer) -> None:
    sources = [GOOD_MODELNEW.replace("BLOCK = 1024", f"BLOCK = {b}") for b in (256, 512, 1024)]
    server.push(*(Chat((answer(s),)) for s in sources))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request(n=3))
    await expert.aclose()
    assert sorted(p.source for p in reply.proposals) == sorted(sources)
    assert sorted(r.body["seed"] for r in server.completions) == [7, 8, 9]
    assert reply.tokens.total == 3 * 200


async def test_expert_budget_exhausted_declines_before_calling(server: ScriptedLLMServer) -> None:
    server.push(Chat((answer(GOOD_MODELNEW),), prompt_tokens=1000, completion_tokens=3900))
    expert = LLMExpert(expert_config(server, token_budget=5000), retry=FAST_RETRY)
    first = await expert.generate(generate_request())
    second = await expert.generate(generate_request())
    await expert.aclose()
    assert first.proposals
    sent_max = server.completions[0].body["max_tokens"]
    assert MIN_COMPLETION_TOKENS <= sent_max < 5000  # capped so the budget cannot be overrun
    assert expert.tokens_used == 4900
    assert second.decline is not None
    assert second.decline.reason is DeclineReason.BUDGET_EXHAUSTED
    assert "expert token budget: 100 tokens left" in second.decline.detail
    assert len(server.completions) == 1


async def test_request_budget_too_small_declines_without_a_call(server: ScriptedLLMServer) -> None:
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request(token_budget=50))
    await expert.aclose()
    assert reply.decline is not None
    assert reply.decline.reason is DeclineReason.BUDGET_EXHAUSTED
    assert "request token budget" in reply.decline.detail
    assert server.completions == []


async def test_concurrency_limit_is_shared_per_endpoint(server: ScriptedLLMServer) -> None:
    server.responder = lambda _req: Chat((answer(GOOD_MODELNEW),), delay_s=0.15)
    first = LLMExpert(expert_config(server, concurrency=2), retry=FAST_RETRY)
    second = LLMExpert(expert_config(server, name="llm-other", concurrency=2), retry=FAST_RETRY)
    replies = await asyncio.gather(*(e.generate(generate_request()) for e in (first, second) for _ in range(4)))
    await first.aclose()
    await second.aclose()
    assert all(r.proposals for r in replies)
    assert len(server.completions) == 8
    assert server.max_in_flight == 2


async def test_reconfigure_lets_in_flight_calls_finish_on_the_old_config(server: ScriptedLLMServer) -> None:
    server.responder = lambda req: Chat((answer(GOOD_MODELNEW),), delay_s=0.3 if req.body["model"] == "a" else 0)
    expert = LLMExpert(expert_config(server, model="a"), retry=FAST_RETRY)
    old_client = expert.client
    in_flight = asyncio.create_task(expert.generate(generate_request()))
    async with asyncio.timeout(5):
        await server.wait_for_completions(1)
    expert.reconfigure(expert_config(server, model="b", revision=1, temperature=0.1))
    assert expert.config.model == "b"
    assert expert.client is not old_client
    closed = [old_client.closed]
    new_reply = await expert.generate(generate_request())
    old_reply = await in_flight
    closed.append(old_client.closed)
    assert closed == [False, True]  # open while its call was in flight, closed after
    await expert.aclose()
    assert old_reply.proposals[0].params == {"model": "a", "config_revision": 0}
    assert new_reply.proposals[0].params == {"model": "b", "config_revision": 1}
    assert [r.body["model"] for r in server.completions] == ["a", "b"]
    assert server.completions[1].body["temperature"] == 0.1


async def test_reconfigure_refuses_bad_configs_and_keeps_the_old_one(server: ScriptedLLMServer) -> None:
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    with pytest.raises(MissingApiKey, match="environment variable KF_MISSING_TEST_KEY"):
        expert.reconfigure(expert_config(server, api_key=None, api_key_env="KF_MISSING_TEST_KEY", revision=2))
    with pytest.raises(UnknownRole, match="unknown LLM role 'poetry'"):
        expert.reconfigure(expert_config(server, role="poetry"))
    with pytest.raises(ConfigError, match="cannot be reconfigured as 'renamed'"):
        expert.reconfigure(expert_config(server, name="renamed"))
    await expert.aclose()
    assert expert.config.revision == 0
