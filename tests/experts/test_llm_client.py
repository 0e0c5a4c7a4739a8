"""The chat client against a real loopback server: retries, Retry-After, usage, limits."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from actors.llm.client import ChatClient, Endpoint, RetryPolicy
from actors.llm.errors import EndpointRejected, EndpointTimeout, MalformedReply, RateLimited
from actors.llm.limiter import EndpointLimiter, endpoint_limiter
from tests.experts.llm_server import Chat, Raw, ScriptedLLMServer, Status

pytestmark = pytest.mark.timeout(20)

MESSAGES = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "x" * 400}]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedLLMServer]:
    async with ScriptedLLMServer() as srv:
        yield srv


def endpoint(server: ScriptedLLMServer, **overrides: object) -> Endpoint:
    fields: dict[str, object] = {
        "base_url": server.base_url,
        "model": "m",
        "api_key": SecretStr("sk-client-test-key"),
        "timeout_s": 2.0,
        "max_retries": 2,
        "concurrency": 4,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 512,
        **overrides,
    }
    return Endpoint(**fields)  # type: ignore[arg-type]


FAST = RetryPolicy(base_s=0.01, max_s=0.02, jitter=0.0)


async def test_sampling_parameters_reach_the_endpoint(server: ScriptedLLMServer) -> None:
    server.push(Chat(("hi", "ho")))
    client = ChatClient(endpoint(server), retry=FAST)
    result = await client.complete(MESSAGES, n=2, seed=11, max_tokens=300)
    await client.aclose()
    body = server.completions[0].body
    assert {k: body[k] for k in ("model", "n", "seed", "temperature", "top_p", "max_tokens")} == {
        "model": "m",
        "n": 2,
        "seed": 11,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 300,
    }
    assert body["messages"] == MESSAGES
    assert [c.text for c in result.choices] == ["hi", "ho"]
    assert (result.usage.prompt, result.usage.completion, result.usage_reported) == (120, 80, True)
    assert result.attempts == 1


async def test_missing_usage_is_estimated_and_flagged(server: ScriptedLLMServer) -> None:
    server.push(Chat(("y" * 400,), prompt_tokens=None))
    client = ChatClient(endpoint(server), retry=FAST)
    result = await client.complete(MESSAGES)
    await client.aclose()
    assert result.usage_reported is False
    assert result.usage.prompt == 5 + 100  # 4 characters a token
    assert result.usage.completion == 100


async def test_content_given_as_parts_is_joined(server: ScriptedLLMServer) -> None:
    body = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
                "finish_reason": "stop",
            }
        ],
    }
    server.push(Raw(json.dumps(body)))
    client = ChatClient(endpoint(server), retry=FAST)
    result = await client.complete(MESSAGES)
    await client.aclose()
    assert result.choices[0].text == "ab"


async def test_retry_after_ms_is_honoured(server: ScriptedLLMServer) -> None:
    server.push(Status(429, headers=(("retry-after-ms", "300"),)), Chat(("ok",)))
    client = ChatClient(endpoint(server), retry=FAST)
    result = await client.complete(MESSAGES)
    await client.aclose()
    first, second = server.completions
    assert second.received_at - first.received_at >= 0.28
    assert result.attempts == 2


async def test_retry_after_as_http_date_is_honoured(server: ScriptedLLMServer) -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)  # second resolution: 1-2 s from now
    server.push(Status(503, headers=(("Retry-After", when),)), Chat(("ok",)))
    client = ChatClient(endpoint(server), retry=FAST)
    await client.complete(MESSAGES)
    await client.aclose()
    first, second = server.completions
    assert second.received_at - first.received_at >= 0.9


async def test_rate_limit_until_retries_run_out_raises_rate_limited(server: ScriptedLLMServer) -> None:
    server.push(*(Status(429, "quota") for _ in range(2)))
    client = ChatClient(endpoint(server, max_retries=1), retry=FAST)
    with pytest.raises(RateLimited, match="HTTP 429") as info:
        await client.complete(MESSAGES)
    await client.aclose()
    assert info.value.attempts == 2
    assert info.value.status == 429


async def test_client_errors_are_not_retried(server: ScriptedLLMServer) -> None:
    server.push(Status(404, "no such model"))
    client = ChatClient(endpoint(server), retry=FAST)
    with pytest.raises(EndpointRejected, match="no such model"):
        await client.complete(MESSAGES)
    await client.aclose()
    assert len(server.completions) == 1


async def test_timeout_applies_to_each_attempt(server: ScriptedLLMServer) -> None:
    server.push(Chat(("late",), delay_s=5.0), Chat(("late",), delay_s=5.0))
    client = ChatClient(endpoint(server, timeout_s=0.25, max_retries=1), retry=FAST)
    started = time.monotonic()
    with pytest.raises(EndpointTimeout, match=r"no reply within 0\.25 s"):
        await client.complete(MESSAGES)
    elapsed = time.monotonic() - started
    await client.aclose()
    assert 0.5 <= elapsed < 2.5  # far less than the 5 s the server would take
    assert len(server.completions) == 2


async def test_empty_body_is_a_malformed_reply(server: ScriptedLLMServer) -> None:
    server.push(Raw(""))
    client = ChatClient(endpoint(server), retry=FAST)
    with pytest.raises(MalformedReply, match="not a chat completion"):
        await client.complete(MESSAGES)
    await client.aclose()


def test_backoff_grows_is_capped_and_reproducible_from_the_seed() -> None:
    policy = RetryPolicy(base_s=1.0, factor=2.0, max_s=5.0, jitter=0.25)
    ep = Endpoint("http://127.0.0.1:9/v1", "m", None, 1.0, 3, 1, 0.7, 1.0, 64)
    first = ChatClient(ep, retry=policy, seed=5)
    again = ChatClient(ep, retry=policy, seed=5)
    other = ChatClient(ep, retry=policy, seed=6)
    delays = [first.backoff_s(a) for a in range(1, 6)]
    assert delays == [again.backoff_s(a) for a in range(1, 6)]
    assert delays != [other.backoff_s(a) for a in range(1, 6)]
    for attempt, delay in enumerate(delays, start=1):
        base = min(5.0, 2.0 ** (attempt - 1))
        assert base <= delay <= base * 1.25
    assert first.backoff_s(1, retry_after_s=3.0) == 3.0
    assert first.backoff_s(1, retry_after_s=600.0) == policy.max_retry_after_s


def test_retry_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2.0)
    with pytest.raises(ValueError, match="factor"):
        RetryPolicy(factor=0.5)


async def test_limiter_admits_in_order_and_grows_live() -> None:
    limiter = EndpointLimiter(1)
    order: list[int] = []
    gate = asyncio.Event()

    async def worker(i: int) -> None:
        async with limiter.slot():
            order.append(i)
            await gate.wait()

    tasks = [asyncio.create_task(worker(i)) for i in range(4)]
    await asyncio.sleep(0.01)
    assert (order, limiter.in_use) == ([0], 1)
    limiter.set_capacity(3)
    await asyncio.sleep(0.01)
    assert (order, limiter.in_use) == ([0, 1, 2], 3)
    gate.set()
    await asyncio.gather(*tasks)
    assert (order, limiter.in_use) == ([0, 1, 2, 3], 0)


async def test_limiter_cancelled_waiter_does_not_leak_a_slot() -> None:
    limiter = EndpointLimiter(1)
    release = asyncio.Event()

    async def holder() -> None:
        async with limiter.slot():
            await release.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiter.cancel()
    release.set()
    await held
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.in_use == 0
    async with asyncio.timeout(1), limiter.slot():
        assert limiter.in_use == 1


async def test_one_limiter_per_endpoint_url() -> None:
    a = endpoint_limiter("http://h:1/v1", 2)
    b = endpoint_limiter("http://h:1/v1/", 3)
    c = endpoint_limiter("http://h:2/v1", 2)
    assert a is b
    assert a.capacity == 3  # the latest configured capacity wins
    assert c is not a


async def test_error_text_from_the_endpoint_is_redacted(server: ScriptedLLMServer) -> None:
    server.push(Status(400, "rejected", echo_authorization=True))
    ep = endpoint(server)
    client = ChatClient(ep, retry=FAST)
    with pytest.raises(EndpointRejected) as info:
        await client.complete(MESSAGES)
    await client.aclose()
    assert "Bearer [redacted]" in str(info.value)
    assert "sk-client-test-key" not in str(info.value)
    assert "sk-client-test-key" not in repr(ep)
    assert server.completions[0].headers["Authorization"] == "Bearer sk-client-test-key"
