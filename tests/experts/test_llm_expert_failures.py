"""The LLM expert facing endpoint trouble: malformed replies, refusals, slow replies, 429 and 5xx,
an unreachable endpoint. Every one ends in a proposal after retrying or a typed decline."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from actors.experts.llm import LLMExpert
from schemas import DeclineReason, ExpertConfig, ExpertKind
from tests.experts.llm_server import (
    BROKEN_MODELNEW,
    FAST_RETRY,
    GOOD_MODELNEW,
    Chat,
    Raw,
    ScriptedLLMServer,
    Status,
    answer,
    expert_config,
    generate_request,
)

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedLLMServer]:
    async with ScriptedLLMServer() as srv:
        yield srv


@pytest.mark.parametrize(
    ("reply", "reason", "detail"),
    [
        (Raw("{not json"), DeclineReason.ENDPOINT_ERROR, "not a chat completion"),
        (Raw('{"id": "x", "choices": []}'), DeclineReason.NO_CODE, "no choices"),
        (Raw('{"id": "x"}'), DeclineReason.ENDPOINT_ERROR, "choices"),
        (Chat(("Just fuse the ops and use larger blocks.",)), DeclineReason.NO_CODE, "holds no code"),
        (Chat((answer("def helper():\n    return 1\n"),)), DeclineReason.NO_CODE, "none defines class ModelNew"),
        (Chat(("I'm sorry, but I can't help with that.",)), DeclineReason.REFUSED, "sorry"),
        (Chat(("",), refusal="I can't assist with this request."), DeclineReason.REFUSED, "can't assist"),
        (Status(400, "bad parameter"), DeclineReason.ENDPOINT_ERROR, "HTTP 400"),
        (Status(401, "invalid key"), DeclineReason.ENDPOINT_ERROR, "HTTP 401"),
    ],
)
async def test_bad_replies_become_typed_declines(
    server: ScriptedLLMServer, reply: Chat | Raw | Status, reason: DeclineReason, detail: str
) -> None:
    server.push(reply)
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    answer_ = await expert.generate(generate_request())
    await expert.aclose()
    assert answer_.proposals == ()
    assert answer_.decline is not None
    assert answer_.decline.reason is reason
    assert detail in answer_.decline.detail
    assert len(server.completions) == 1  # none of these is retried
    assert server.unscripted == 0


async def test_slow_replies_past_the_timeout_decline_timeout(server: ScriptedLLMServer) -> None:
    server.push(Chat((answer(GOOD_MODELNEW),), delay_s=5.0), Chat((answer(GOOD_MODELNEW),), delay_s=5.0))
    expert = LLMExpert(expert_config(server, timeout_s=0.3, max_retries=1), retry=FAST_RETRY)
    started = time.monotonic()
    reply = await expert.generate(generate_request())
    elapsed = time.monotonic() - started
    await expert.aclose()
    assert reply.decline is not None
    assert reply.decline.reason is DeclineReason.TIMEOUT
    assert "no reply within 0.3 s" in reply.decline.detail
    assert len(server.completions) == 2
    assert 0.6 <= elapsed < 2.5  # far less than the 5 s the server would take
    assert expert.tokens_used == 0


async def test_slow_reply_then_fast_reply_succeeds(server: ScriptedLLMServer) -> None:
    server.push(Chat((answer(BROKEN_MODELNEW),), delay_s=5.0), Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server, timeout_s=0.3, max_retries=1), retry=FAST_RETRY)
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert [p.source for p in reply.proposals] == [GOOD_MODELNEW]
    assert len(server.completions) == 2


async def test_rate_limit_then_success_honours_retry_after(server: ScriptedLLMServer) -> None:
    server.push(Status(429, "slow down", headers=(("Retry-After", "1"),)), Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server), retry=FAST_RETRY)
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert [p.source for p in reply.proposals] == [GOOD_MODELNEW]
    first, second = server.completions
    assert second.received_at - first.received_at >= 0.95


async def test_server_errors_then_success_are_retried_with_backoff(server: ScriptedLLMServer) -> None:
    server.push(Status(500), Status(503), Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server, max_retries=2), retry=FAST_RETRY)
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert [p.source for p in reply.proposals] == [GOOD_MODELNEW]
    assert len(server.completions) == 3
    assert reply.tokens.total == 200


async def test_retries_run_out_into_an_endpoint_error_decline(server: ScriptedLLMServer) -> None:
    server.push(*(Status(502, "bad gateway") for _ in range(3)))
    expert = LLMExpert(expert_config(server, max_retries=2), retry=FAST_RETRY)
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert reply.decline is not None
    assert reply.decline.reason is DeclineReason.ENDPOINT_ERROR
    assert "HTTP 502" in reply.decline.detail
    assert "after 3 attempts" in reply.decline.detail
    assert len(server.completions) == 3


async def test_unreachable_endpoint_declines_endpoint_error() -> None:
    async with ScriptedLLMServer() as gone:
        url = gone.base_url
    config = ExpertConfig(name="llm-x", kind=ExpertKind.LLM, base_url=url, model="m", max_retries=1)
    expert = LLMExpert(config, retry=FAST_RETRY, environ={})
    reply = await expert.generate(generate_request())
    await expert.aclose()
    assert reply.decline is not None
    assert reply.decline.reason is DeclineReason.ENDPOINT_ERROR
    assert "connection failed" in reply.decline.detail
