"""Errors of the LLM experts and their chat client.

Every message here is written by this package from fields it controls; text that came from an
endpoint passes through :func:`actors.llm.redact.redact` first, so no message, log line
or reply built from these errors can carry an API key.
"""

from __future__ import annotations

from actors.runtime.errors import ConfigError, KfError


class LLMError(KfError):
    """Root of the errors of the LLM package."""


class MissingApiKey(ConfigError, LLMError):
    """The configuration names an environment variable for the key, and it is not set."""

    def __init__(self, expert: str, env_var: str) -> None:
        super().__init__(f"expert {expert!r}: environment variable {env_var} (its API key) is not set")
        self.expert = expert
        self.env_var = env_var


class UnknownRole(ConfigError, LLMError):
    """The configuration asks for a prompt role this package does not have."""

    def __init__(self, role: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown LLM role {role!r}; known roles: {', '.join(known)}")
        self.role = role
        self.known = known


class EndpointError(LLMError):
    """A chat call failed for good (after any retries)."""

    def __init__(self, base_url: str, detail: str, *, status: int | None = None, attempts: int = 1) -> None:
        where = f"{base_url}: HTTP {status}" if status is not None else base_url
        super().__init__(f"{where}: {detail} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.base_url = base_url
        self.detail = detail
        self.status = status
        self.attempts = attempts


class EndpointTimeout(EndpointError):
    """Every attempt ran past the per-call timeout (or the connection timed out)."""


class RateLimited(EndpointError):
    """The endpoint kept answering 429 until the retries ran out."""


class EndpointRejected(EndpointError):
    """The endpoint refused the request with a status that retrying cannot fix (400, 401, 404...)."""


class MalformedReply(EndpointError):
    """The endpoint answered 200 with a body that is not a chat completion."""


class BudgetExhausted(LLMError):
    """The call would spend tokens beyond a budget; it was not made."""

    def __init__(self, scope: str, remaining: int, needed: int) -> None:
        super().__init__(f"{scope} token budget: {remaining} tokens left, a call needs at least {needed}")
        self.scope = scope
        self.remaining = remaining
        self.needed = needed
