"""The LLM endpoints' Prometheus series, per expert name and model, against a real loopback
server: calls by outcome, retries by cause, tokens in and out (estimates marked), latency."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY, generate_latest

from actors.llm.client import ChatClient
from actors.llm.errors import EndpointRejected, MalformedReply
from tests.experts.llm_server import FAST_RETRY, Chat, Raw, ScriptedLLMServer, Status, expert_config

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "user", "content": "y" * 400}]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedLLMServer]:
    async with ScriptedLLMServer() as srv:
        yield srv


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_calls_retries_tokens_and_latency_are_counted_per_expert(server: ScriptedLLMServer) -> None:
    server.push(
        Status(429, headers=(("retry-after-ms", "10"),)),  # retried, then answered
        Chat(("a", "b"), prompt_tokens=150, completion_tokens=40),
        Chat(("c",), prompt_tokens=None),  # no usage: estimated
        Status(404, "no such model"),
        Raw("not json"),
    )
    client = ChatClient.from_config(expert_config(server, name="metrics-expert"), retry=FAST_RETRY)
    mine = {"expert": "metrics-expert", "model": "scripted-model"}
    await client.complete(MESSAGES)
    await client.complete(MESSAGES)
    with pytest.raises(EndpointRejected):
        await client.complete(MESSAGES)
    with pytest.raises(MalformedReply):
        await client.complete(MESSAGES)
    await client.aclose()

    assert _value("kfoundry_llm_calls_total", **mine, outcome="ok") == 2
    assert _value("kfoundry_llm_calls_total", **mine, outcome="rejected") == 1
    assert _value("kfoundry_llm_calls_total", **mine, outcome="malformed") == 1
    assert _value("kfoundry_llm_retries_total", **mine, cause="429") == 1
    assert _value("kfoundry_llm_tokens_total", **mine, direction="prompt", reported="true") == 150
    assert _value("kfoundry_llm_tokens_total", **mine, direction="completion", reported="true") == 40
    assert _value("kfoundry_llm_tokens_total", **mine, direction="prompt", reported="false") == 100  # 400 chars
    assert _value("kfoundry_llm_call_seconds_count", **mine, outcome="ok") == 2
    assert _value("kfoundry_llm_call_seconds_sum", **mine, outcome="ok") > 0
    text = generate_latest(REGISTRY).decode()  # what /metrics serves
    assert 'kfoundry_llm_calls_total{expert="metrics-expert",model="scripted-model",outcome="ok"} 2.0' in text
    assert "sk-" not in text  # no key in any label


async def test_the_cost_of_calls_is_counted_only_where_prices_are_configured(server: ScriptedLLMServer) -> None:
    server.push(
        Chat(("a",), prompt_tokens=2_000_000, completion_tokens=500_000),
        Chat(("b",), prompt_tokens=None),  # no usage: 400 characters estimated as 100 prompt tokens
        Chat(("c",), prompt_tokens=1000, completion_tokens=10),
    )
    priced = ChatClient.from_config(
        expert_config(server, name="priced-expert", price_in_per_mtok=3.0, price_out_per_mtok=15.0), retry=FAST_RETRY
    )
    await priced.complete(MESSAGES)
    await priced.complete(MESSAGES)
    await priced.aclose()
    free = ChatClient.from_config(expert_config(server, name="unpriced-expert"), retry=FAST_RETRY)
    await free.complete(MESSAGES)
    await free.aclose()

    mine = {"expert": "priced-expert", "model": "scripted-model"}
    assert _value("kfoundry_llm_cost_total", **mine, reported="true") == pytest.approx(2 * 3.0 + 0.5 * 15.0)
    estimated = _value("kfoundry_llm_cost_total", **mine, reported="false")
    completion = _value("kfoundry_llm_tokens_total", **mine, direction="completion", reported="false")
    assert estimated == pytest.approx((100 * 3.0 + completion * 15.0) / 1e6)
    assert estimated > 0
    unpriced = {"expert": "unpriced-expert", "model": "scripted-model", "reported": "true"}
    assert REGISTRY.get_sample_value("kfoundry_llm_cost_total", unpriced) is None  # no price: no series
    assert _value("kfoundry_llm_tokens_total", **unpriced, direction="prompt") == 1000
