"""API keys of LLM experts: where they come from, and that they reach nothing but the Authorization header."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import pytest
import structlog

from actors.experts.llm import LLMExpert
from actors.llm.errors import MissingApiKey
from actors.runtime.errors import ConfigError
from schemas import ExpertConfig, ExpertKind
from tests.experts.llm_server import (
    FAST_RETRY,
    GOOD_MODELNEW,
    TEST_KEY,
    Chat,
    RecordedRequest,
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


def _scan(secret: str, *texts: str) -> list[str]:
    return [t for t in texts if secret in t]


async def test_api_key_reaches_only_the_authorization_header(
    server: ScriptedLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A leaky proxy: echoes the Authorization header in error bodies and in completions.
    server.push(Status(500, "boom", echo_authorization=True), Status(400, "no", echo_authorization=True))

    def leaky(req: RecordedRequest) -> Chat:
        auth = req.headers.get("Authorization", "")
        return Chat((answer(GOOD_MODELNEW + f"# {auth}\n", prose=f"Done with {auth}."),))

    caplog.set_level("DEBUG")
    with structlog.testing.capture_logs() as logs:
        expert = LLMExpert(
            expert_config(server, api_key=None, api_key_env="KF_TEST_KEY", max_retries=1),
            retry=FAST_RETRY,
            environ={"KF_TEST_KEY": TEST_KEY},
        )
        failed = await expert.generate(generate_request())
        server.responder = leaky
        succeeded = await expert.generate(generate_request())
        await expert.aclose()
    assert failed.decline is not None
    assert "[redacted]" in failed.decline.detail
    assert succeeded.proposals
    assert "[redacted]" in succeeded.proposals[0].source
    assert _scan(TEST_KEY, failed.model_dump_json(), succeeded.model_dump_json()) == []
    assert _scan(TEST_KEY, *(repr(entry) for entry in logs)) == []
    assert logs, "the expert logs its calls"
    assert _scan(TEST_KEY, *(r.getMessage() for r in caplog.records)) == []
    assert _scan(TEST_KEY, expert.config.model_dump_json()) == []
    for request in server.completions:
        assert request.headers["Authorization"] == f"Bearer {TEST_KEY}"
        others = [v for k, v in request.headers.items() if k != "Authorization"]
        assert _scan(TEST_KEY, json.dumps(request.body), *others) == []


async def test_no_key_configured_never_sends_the_ambient_openai_key(
    server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clean environment (the developer's shell is not part of the test), then the variable the
    # OpenAI SDK reads on its own when it is given no key.
    for name in [n for n in os.environ if n.startswith("OPENAI_")]:
        monkeypatch.delenv(name)
    ambient = "sk-ambient-must-not-be-sent"
    monkeypatch.setenv("OPENAI_API_KEY", ambient)
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(expert_config(server, api_key=None), retry=FAST_RETRY)
    await expert.generate(generate_request())
    await expert.aclose()
    request = server.completions[0]
    assert request.headers["Authorization"] == "Bearer no-key"
    sent = [json.dumps(request.body), *request.headers.values()]
    assert _scan(ambient, *sent) == []


async def test_key_variable_named_in_the_config_wins_over_the_ambient_openai_key(
    server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-must-not-be-sent")
    server.push(Chat((answer(GOOD_MODELNEW),)))
    expert = LLMExpert(
        expert_config(server, api_key=None, api_key_env="KF_TEST_KEY"),
        retry=FAST_RETRY,
        environ={"KF_TEST_KEY": TEST_KEY},
    )
    await expert.generate(generate_request())
    await expert.aclose()
    assert server.completions[0].headers["Authorization"] == f"Bearer {TEST_KEY}"


def test_missing_key_variable_fails_at_construction_naming_the_variable() -> None:
    config = ExpertConfig(
        name="llm-x", kind=ExpertKind.LLM, base_url="http://127.0.0.1:9/v1", model="m", api_key_env="KF_NOPE"
    )
    with pytest.raises(MissingApiKey, match="environment variable KF_NOPE"):
        LLMExpert(config, environ={"OTHER": "x"})


def test_template_kind_config_is_refused() -> None:
    config = ExpertConfig(name="tpl", kind=ExpertKind.TEMPLATE)
    with pytest.raises(ConfigError, match="has kind 'template', not 'llm'"):
        LLMExpert(config)
