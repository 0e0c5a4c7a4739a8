"""A chat client for any OpenAI-compatible endpoint, with our own retry, timeout and limits.

:class:`ChatClient` wraps ``openai.AsyncOpenAI`` (its own retries off) and adds: a per-call
timeout scope; retries with exponential backoff and seeded jitter on 408/409/429/5xx,
connection errors and timeouts, honouring ``Retry-After`` / ``retry-after-ms``; a concurrency
limit shared by every client of the same ``base_url`` in the process (:mod:`.limiter`); and a
typed parse of the reply (``usage`` read when reported, estimated from characters when not).
Failures raise the typed errors of :mod:`actors.llm.errors`, whose text never carries
the key. The LLM experts and the LLM diagnoser both use it.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import openai
import structlog
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from actors.llm import metrics
from actors.llm.errors import (
    EndpointError,
    EndpointRejected,
    EndpointTimeout,
    MalformedReply,
    MissingApiKey,
    RateLimited,
)
from actors.llm.limiter import endpoint_limiter
from actors.llm.redact import redact, safe_url, shorten
from schemas import ExpertConfig, TokenUsage

log = structlog.get_logger(__name__)

NO_KEY = "no-key"
"""Sent as the bearer token when no key is configured (local vLLM / Ollama servers need none)."""

_RETRY_STATUSES = frozenset({408, 409, 429})
_DETAIL_LIMIT = 300


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token), used only when an endpoint reports no usage."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``base_s * factor**(attempt-1)``, capped, times ``1 + U(0, jitter)``."""

    base_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.25
    max_retry_after_s: float = 60.0
    """A ``Retry-After`` longer than this is cut to it."""

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < 0 or self.max_retry_after_s < 0:
            raise ValueError(f"retry delays must be >= 0, got {self}")
        if self.factor < 1:
            raise ValueError(f"retry factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"retry jitter must be in [0, 1], got {self.jitter}")


@dataclass(frozen=True)
class Endpoint:
    """What a chat call needs from an :class:`ExpertConfig`, with the key resolved."""

    base_url: str
    model: str
    api_key: SecretStr | None
    timeout_s: float
    max_retries: int
    concurrency: int
    temperature: float
    top_p: float
    max_tokens: int
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None

    @classmethod
    def from_config(cls, config: ExpertConfig, environ: Mapping[str, str] | None = None) -> Endpoint:
        """Resolve the key: ``config.api_key``, else the variable ``config.api_key_env`` names."""
        if not config.base_url or not config.model:
            raise EndpointRejected(config.base_url or "?", f"expert {config.name!r} has no base_url/model")
        key = config.api_key
        if key is None and config.api_key_env:
            env = os.environ if environ is None else environ
            value = env.get(config.api_key_env)
            if not value:
                raise MissingApiKey(config.name, config.api_key_env)
            key = SecretStr(value)
        return cls(
            base_url=config.base_url.rstrip("/"),
            model=config.model,
            api_key=key,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            concurrency=config.concurrency,
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
            price_in_per_mtok=config.price_in_per_mtok,
            price_out_per_mtok=config.price_out_per_mtok,
        )

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in text we produce."""
        return (self.api_key.get_secret_value(),) if self.api_key is not None else ()


@dataclass(frozen=True)
class ChatChoice:
    """One choice of a completion."""

    text: str
    """The message content ('' when there was none)."""
    refusal: str | None
    """A structured refusal, when the endpoint sent one."""
    finish_reason: str | None


@dataclass(frozen=True)
class ChatResult:
    """A completed chat call."""

    choices: tuple[ChatChoice, ...]
    usage: TokenUsage
    usage_reported: bool
    """False when the endpoint sent no ``usage`` and the numbers are estimates."""
    attempts: int
    elapsed_s: float
    model: str


class _WireMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str | list[dict[str, Any]] | None = None
    refusal: str | None = None


class _WireChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    message: _WireMessage
    finish_reason: str | None = None


class _WireUsage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WireCompletion(BaseModel):
    model_config = ConfigDict(extra="ignore")
    choices: list[_WireChoice]
    usage: _WireUsage | None = None
    model: str | None = None


def _content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type", "text") == "text")


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class _Failure:
    error: EndpointError
    retryable: bool
    retry_after_s: float | None = None


class ChatClient:
    """One endpoint and model; ``complete`` makes a chat call with retries and limits."""

    def __init__(
        self, endpoint: Endpoint, *, retry: RetryPolicy | None = None, seed: int = 0, expert: str = ""
    ) -> None:
        self.endpoint = endpoint
        self.expert = expert
        """The expert configuration's name: the ``expert`` label of its metrics (:mod:`.metrics`)."""
        self.retry = retry or RetryPolicy()
        self._rng = np.random.default_rng(seed)
        self._secrets = endpoint.secrets()
        self._url = safe_url(endpoint.base_url)
        key = endpoint.api_key.get_secret_value() if endpoint.api_key is not None else NO_KEY
        self._openai = openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=key, timeout=endpoint.timeout_s, max_retries=0
        )

    @classmethod
    def from_config(
        cls,
        config: ExpertConfig,
        *,
        environ: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        seed: int = 0,
    ) -> ChatClient:
        """A client for an expert's configured endpoint."""
        return cls(Endpoint.from_config(config, environ), retry=retry, seed=seed, expert=config.name)

    def redact(self, text: str) -> str:
        """``text`` with this client's key removed."""
        return redact(text, self._secrets)

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        n: int = 1,
        seed: int | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> ChatResult:
        """One chat completion with ``n`` choices; retries transient failures.

        Raises ``EndpointTimeout``, ``RateLimited``, ``EndpointRejected``, ``MalformedReply`` or
        ``EndpointError`` once retrying is over.
        """
        started = time.perf_counter()
        try:
            result = await self._complete(messages, n=n, seed=seed, temperature=temperature, max_tokens=max_tokens)
        except EndpointError as exc:
            self._count(exc, time.perf_counter() - started)
            raise
        self._count(None, time.perf_counter() - started)
        labels = {"expert": self.expert, "model": self.endpoint.model, "reported": str(result.usage_reported).lower()}
        metrics.TOKENS.labels(direction="prompt", **labels).inc(result.usage.prompt)
        metrics.TOKENS.labels(direction="completion", **labels).inc(result.usage.completion)
        cost = metrics.cost_of(self.endpoint, result.usage.prompt, result.usage.completion)
        if cost is not None:
            metrics.COST.labels(**labels).inc(cost)
        return result

    def _count(self, error: EndpointError | None, seconds: float) -> None:
        outcome = metrics.outcome_of(error)
        metrics.CALLS.labels(self.expert, self.endpoint.model, outcome).inc()
        metrics.CALL_SECONDS.labels(self.expert, self.endpoint.model, outcome).observe(seconds)

    async def _complete(
        self,
        messages: list[dict[str, str]],
        *,
        n: int,
        seed: int | None,
        temperature: float | None,
        max_tokens: int | None,
    ) -> ChatResult:
        ep = self.endpoint
        started = time.perf_counter()
        limiter = endpoint_limiter(ep.base_url, ep.concurrency)
        attempt = 0
        while True:
            attempt += 1
            try:
                async with limiter.slot(), asyncio.timeout(ep.timeout_s):
                    raw = await self._openai.chat.completions.with_raw_response.create(
                        model=ep.model,
                        messages=messages,  # type: ignore[arg-type]
                        n=n,
                        seed=seed if seed is not None else openai.omit,
                        temperature=ep.temperature if temperature is None else temperature,
                        top_p=ep.top_p,
                        max_tokens=ep.max_tokens if max_tokens is None else max_tokens,
                    )
                    body = raw.text
            except (TimeoutError, openai.APIError) as exc:
                failure = self._classify(exc, attempt)
                if not failure.retryable or attempt > ep.max_retries:
                    log.warning(
                        "llm.call_failed",
                        endpoint=self._url,
                        model=ep.model,
                        attempts=attempt,
                        error=str(failure.error),
                    )
                    raise failure.error from None
                delay = self.backoff_s(attempt, failure.retry_after_s)
                metrics.RETRIES.labels(self.expert, ep.model, metrics.cause_of(failure.error)).inc()
                log.info(
                    "llm.retry",
                    endpoint=self._url,
                    model=ep.model,
                    attempt=attempt,
                    delay_s=round(delay, 3),
                    reason=failure.error.detail,
                    status=failure.error.status,
                )
                await asyncio.sleep(delay)
                continue
            result = self._parse(body, messages, attempt, time.perf_counter() - started)
            log.info(
                "llm.call",
                endpoint=self._url,
                model=ep.model,
                attempts=attempt,
                choices=len(result.choices),
                prompt_tokens=result.usage.prompt,
                completion_tokens=result.usage.completion,
                usage_reported=result.usage_reported,
                elapsed_s=round(result.elapsed_s, 3),
            )
            return result

    def backoff_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): ``Retry-After`` if given."""
        policy = self.retry
        if retry_after_s is not None:
            return min(retry_after_s, policy.max_retry_after_s)
        backoff = min(policy.max_s, policy.base_s * policy.factor ** (attempt - 1))
        return float(backoff * (1.0 + self._rng.uniform(0.0, policy.jitter)))

    def _classify(self, exc: BaseException, attempt: int) -> _Failure:
        url = self._url
        if isinstance(exc, TimeoutError | openai.APITimeoutError):
            detail = f"no reply within {self.endpoint.timeout_s:g} s"
            return _Failure(EndpointTimeout(url, detail, attempts=attempt), retryable=True)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = shorten(self.redact(exc.message), _DETAIL_LIMIT)
            headers = exc.response.headers
            if status == 429:
                error: EndpointError = RateLimited(url, detail, status=status, attempts=attempt)
                return _Failure(error, retryable=True, retry_after_s=_retry_after_s(headers))
            if status >= 500 or status in _RETRY_STATUSES:
                error = EndpointError(url, detail, status=status, attempts=attempt)
                return _Failure(error, retryable=True, retry_after_s=_retry_after_s(headers))
            return _Failure(EndpointRejected(url, detail, status=status, attempts=attempt), retryable=False)
        if isinstance(exc, openai.APIConnectionError):
            detail = f"connection failed ({type(exc).__name__})"
            return _Failure(EndpointError(url, detail, attempts=attempt), retryable=True)
        detail = f"unexpected client error {type(exc).__name__}"
        return _Failure(EndpointError(url, detail, attempts=attempt), retryable=False)

    def _parse(self, body: str, messages: list[dict[str, str]], attempts: int, elapsed_s: float) -> ChatResult:
        try:
            wire = _WireCompletion.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            detail = f"reply is not a chat completion ({where}: {first['type']})"
            raise MalformedReply(self._url, detail, status=200, attempts=attempts) from None
        choices = tuple(
            ChatChoice(
                text=_content_text(c.message.content),
                refusal=c.message.refusal,
                finish_reason=c.finish_reason,
            )
            for c in wire.choices
        )
        reported = wire.usage
        if reported is not None and reported.prompt_tokens is not None and reported.completion_tokens is not None:
            usage = TokenUsage(prompt=max(0, reported.prompt_tokens), completion=max(0, reported.completion_tokens))
        else:
            reported = None
            prompt = sum(estimate_tokens(m.get("content", "")) for m in messages)
            completion = sum(estimate_tokens(c.text) for c in choices)
            usage = TokenUsage(prompt=prompt, completion=completion)
        return ChatResult(
            choices=choices,
            usage=usage,
            usage_reported=reported is not None,
            attempts=attempts,
            elapsed_s=elapsed_s,
            model=wire.model or self.endpoint.model,
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has run."""
        return self._openai.is_closed()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._openai.close()
