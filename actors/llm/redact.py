"""Keeping secrets out of text: API keys out of messages, credentials out of URLs.

Anything an endpoint sends back (an error body, a reply) may echo what it received; every such
text goes through :func:`redact` before it reaches a log line, an exception or a reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[redacted]"
"""What a secret is replaced with."""

_MIN_SECRET = 4
"""Shorter strings are not treated as secrets (they would blank out ordinary words)."""


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``[redacted]``."""
    for secret in secrets:
        if len(secret) >= _MIN_SECRET and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def safe_url(url: str) -> str:
    """The URL without user, password, query or fragment, fit for logs and replies."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marking the cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 15)] + " …[truncated]"
