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
