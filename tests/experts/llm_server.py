"""A real OpenAI-compatible HTTP server on loopback, driven by a script of replies.

Tests of the LLM experts and the LLM diagnoser talk to it over real HTTP through the real
``openai`` client: ``POST /v1/chat/completions`` answers with the next scripted reply (a
completion, an HTTP error, or a raw body), optionally after a delay; ``GET /v1/models`` lists
one model. Every request is recorded (headers, JSON body, arrival time) so a test can assert
what the prompt carried and what the ``Authorization`` header held. The server also counts the
requests it was serving at once, to check concurrency limits.

Use it as ``async with ScriptedLLMServer() as server:`` and ``server.push(...)`` replies; a
request that finds the script empty gets a 500 and is counted in ``unscripted``. The module also
holds the material the tests script replies with (a reference, a correct and a non-compiling
``ModelNew``) and small builders of expert configurations and requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from actors.llm.client import RetryPolicy
from schemas import ExpertConfig, ExpertKind, GenerateRequest, Task

MODEL = "scripted-model"
"""The model name the server lists (it answers whatever model a request names)."""


@dataclass(frozen=True)
class Chat:
    """A well-formed chat completion with one choice per entry of ``contents``."""

    contents: tuple[str, ...]
    prompt_tokens: int | None = 120
    """``usage.prompt_tokens``; ``None`` leaves ``usage`` out of the reply."""
    completion_tokens: int = 80
    finish_reason: str = "stop"
    refusal: str | None = None
    """Set to reply with a structured refusal (``message.refusal``) and no content."""
    delay_s: float = 0.0


@dataclass(frozen=True)
class Status:
    """An HTTP error with an OpenAI-style error body."""

    status: int
    message: str = "scripted error"
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers, e.g. ``(("Retry-After", "1"),)``."""
    echo_authorization: bool = False
    """Put the request's ``Authorization`` header into the error message (a leaky proxy)."""
    delay_s: float = 0.0


@dataclass(frozen=True)
class Raw:
    """A raw body (broken JSON, empty choices, ...) with a status and content type."""

    body: str
    status: int = 200
    content_type: str = "application/json"
    delay_s: float = 0.0


Reply = Chat | Status | Raw
"""One scripted answer."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    """The decoded JSON body (``None`` when it had none or it was not JSON)."""
    received_at: float

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages of a completion request."""
        if not isinstance(self.body, dict):
            return []
        messages = self.body.get("messages", [])
        return [m for m in messages if isinstance(m, dict)]

    @property
    def prompt(self) -> str:
        """Every message's content, joined: what the model was shown."""
        return "\n".join(str(m.get("content", "")) for m in self.messages)


@dataclass
class ScriptedLLMServer:
    """The scripted server. ``base_url`` is valid once it has started."""

    host: str = "127.0.0.1"
    responder: Callable[[RecordedRequest], Reply] | None = None
    """Answers requests when the script is empty (instead of a 500)."""
    requests: list[RecordedRequest] = field(default_factory=list)
    unscripted: int = 0
    """Requests that found the script empty and no responder."""
    max_in_flight: int = 0
    """Most completion requests served at the same time."""
    _script: deque[Reply] = field(default_factory=deque)
    _in_flight: int = 0
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _arrival: asyncio.Condition = field(default_factory=asyncio.Condition)
    _runner: web.AppRunner | None = None
    _port: int | None = None

    def push(self, *replies: Reply) -> None:
        """Append replies to the script, answered in order."""
        self._script.extend(replies)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        if self._port is None:
            raise RuntimeError("the server has not started")
        return f"http://{self.host}:{self._port}/v1"

    @property
    def completions(self) -> list[RecordedRequest]:
        """The chat-completion requests received, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def wait_for_completions(self, count: int) -> None:
        """Return once ``count`` chat-completion requests have arrived (bound it with a timeout)."""
        async with self._arrival:
            await self._arrival.wait_for(lambda: len(self.completions) >= count)

    async def start(self) -> None:
        """Bind a free loopback port and serve."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.host, 0))
            self._port = sock.getsockname()[1]
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            await self._runner.cleanup()
            raise

    async def stop(self) -> None:
        """Release delayed handlers and shut down."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedLLMServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _record(self, request: web.Request) -> RecordedRequest:
        text = await request.text()
        try:
            body: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            body = None
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            headers=dict(request.headers),
            body=body,
            received_at=time.monotonic(),
        )
        self.requests.append(recorded)
        async with self._arrival:
            self._arrival.notify_all()
        return recorded

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        recorded = await self._record(request)
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            reply = self._next(recorded)
            if reply is None:
                self.unscripted += 1
                return _error(500, "the script is empty")
            if reply.delay_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), reply.delay_s)
            return _answer(reply, recorded)
        finally:
            self._in_flight -= 1

    def _next(self, recorded: RecordedRequest) -> Reply | None:
        if self._script:
            return self._script.popleft()
        if self.responder is not None:
            return self.responder(recorded)
        return None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "scripted", "code": str(status)}}
    return web.json_response(body, status=status, headers=headers)


def _answer(reply: Reply, recorded: RecordedRequest) -> web.Response:
    if isinstance(reply, Status):
        message = reply.message
        if reply.echo_authorization:
            message += f" (you sent Authorization: {recorded.headers.get('Authorization', '')})"
        return _error(reply.status, message, dict(reply.headers))
    if isinstance(reply, Raw):
        return web.Response(text=reply.body, status=reply.status, content_type=reply.content_type)
    model = recorded.body.get("model", MODEL) if isinstance(recorded.body, dict) else MODEL
    return web.json_response(completion_body(reply, str(model)))


def completion_body(reply: Chat, model: str = MODEL) -> dict[str, Any]:
    """The JSON of a chat completion for a scripted ``Chat`` reply."""
    choices = [
        {
            "index": i,
            "message": {
                "role": "assistant",
                "content": None if reply.refusal is not None else content,
                "refusal": reply.refusal,
            },
            "finish_reason": reply.finish_reason,
            "logprobs": None,
        }
        for i, content in enumerate(reply.contents)
    ]
    body: dict[str, Any] = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if reply.prompt_tokens is not None:
        body["usage"] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
    return body


# Material for scripted replies: a KernelBench-format reference and answers to it.

REFERENCE_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """GELU (erf form) followed by a constant scaling."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * self.scale


batch_size = 16
dim = 16383


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [2.0]
'''
"""The task every LLM test asks about."""

GOOD_MODELNEW = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024
        gelu_scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, self.scale, BLOCK=BLOCK)
        return out
"""
"""A correct Triton answer to ``REFERENCE_SOURCE`` (one fused kernel)."""

BROKEN_MODELNEW = GOOD_MODELNEW.replace("BLOCK: tl.constexpr", "BLOCK")
"""Valid Python whose Triton kernel does not compile (``tl.arange`` needs constexpr bounds)."""


def answer(code: str, prose: str = "Fused GELU and scaling into one masked kernel.", tag: str = "python") -> str:
    """A model-style reply: a sentence of prose, then the code in one fenced block."""
    return f"{prose}\n\n```{tag}\n{code}```\n"


# Helpers for the expert tests.

TEST_KEY = "sk-kf-test-3f9a1c77e2d04b5e"
"""The API key the expert tests configure (and scan for)."""

FAST_RETRY = RetryPolicy(base_s=0.01, max_s=0.05, jitter=0.5)
"""Backoff short enough for tests."""


def expert_config(server: ScriptedLLMServer, **overrides: Any) -> ExpertConfig:
    """An LLM expert configuration pointing at ``server`` (fusion role, the test key)."""
    fields: dict[str, Any] = {
        "name": "llm-fusion",
        "kind": ExpertKind.LLM,
        "role": "fusion",
        "base_url": server.base_url,
        "model": "scripted-model",
        "api_key": SecretStr(TEST_KEY),
        "timeout_s": 2.0,
        "max_retries": 2,
        **overrides,
    }
    return ExpertConfig.model_validate(fields)


def generate_request(**overrides: Any) -> GenerateRequest:
    """A request for ``REFERENCE_SOURCE`` with seed 7."""
    fields: dict[str, Any] = {
        "run_id": "run1",
        "island": "i0",
        "task": Task.from_source("gelu_scale", REFERENCE_SOURCE),
        "seed": 7,
        **overrides,
    }
    return GenerateRequest.model_validate(fields)
