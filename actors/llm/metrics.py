"""Prometheus series of the LLM endpoints, per expert configuration name and model: calls by
outcome, their latency (retries and waits included), retried attempts by cause, and tokens in and
out (marked where the endpoint reported none and they are estimates). Every process that holds a
:class:`~actors.llm.client.ChatClient` (an LLM expert, the LLM diagnoser) exports them on its
``--metrics-port``."""

from __future__ import annotations

from typing import Protocol

from prometheus_client import Counter, Histogram

from actors.llm.errors import EndpointError, EndpointRejected, EndpointTimeout, MalformedReply, RateLimited

CALLS = Counter(
    "kfoundry_llm_calls", "LLM chat calls, by how they ended (retries included)", ["expert", "model", "outcome"]
)
CALL_SECONDS = Histogram(
    "kfoundry_llm_call_seconds",
    "Wall time of one LLM chat call, retries and their waits included",
    ["expert", "model", "outcome"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
RETRIES = Counter(
    "kfoundry_llm_retries", "Attempts that failed and were tried again, by cause", ["expert", "model", "cause"]
)
TOKENS = Counter(
    "kfoundry_llm_tokens",
    "Tokens of LLM chat calls that succeeded (reported=false: estimated from characters)",
    ["expert", "model", "direction", "reported"],
)

COST = Counter(
    "kfoundry_llm_cost",
    "What LLM chat calls that succeeded cost, at the expert configuration's prices per million tokens "
    "(reported=false: from estimated tokens); only where prices are configured",
    ["expert", "model", "reported"],
)

DIAGNOSER_FALLBACKS = Counter(
    "kfoundry_llm_diagnoser_fallbacks",
    "Diagnoses an LLM diagnoser left to the rules, by cause (budget, endpoint, reply)",
    ["expert", "cause"],
)

METRIC_NAMES = (
    "kfoundry_llm_calls",
    "kfoundry_llm_call_seconds",
    "kfoundry_llm_retries",
    "kfoundry_llm_tokens",
    "kfoundry_llm_cost",
    "kfoundry_llm_diagnoser_fallbacks",
)


class Prices(Protocol):
    @property
    def price_in_per_mtok(self) -> float | None: ...
    @property
    def price_out_per_mtok(self) -> float | None: ...


def cost_of(prices: Prices, prompt: int, completion: int) -> float | None:
    """What ``prompt`` and ``completion`` tokens cost at ``prices`` (per million tokens; a price
    not set counts as 0 where the other is set), or None where no price is set."""
    if prices.price_in_per_mtok is None and prices.price_out_per_mtok is None:
        return None
    return (prompt * (prices.price_in_per_mtok or 0.0) + completion * (prices.price_out_per_mtok or 0.0)) / 1e6


def outcome_of(error: EndpointError | None) -> str:
    """The ``outcome`` label of a call that raised ``error`` (None: it succeeded)."""
    if error is None:
        return "ok"
    for kind, name in (
        (RateLimited, "rate_limited"),
        (EndpointTimeout, "timeout"),
        (MalformedReply, "malformed"),
        (EndpointRejected, "rejected"),
    ):
        if isinstance(error, kind):
            return name
    return "error"


def cause_of(error: EndpointError) -> str:
    """The ``cause`` label of a retried attempt: its HTTP status, ``timeout`` or ``connection``."""
    if error.status is not None:
        return str(error.status)
    return "timeout" if isinstance(error, EndpointTimeout) else "connection"
