"""Latency histograms the actors export on ``/metrics``: evaluations, expert replies, bus handling.

They live in prometheus-client's default registry, which ``actors.runtime.metrics.serve_metrics`` serves;
an actor process without ``--metrics-port`` still observes them (a few microseconds each) and
nobody reads them. Labels are bounded sets (kinds, transports, outcomes, statuses, expert names,
run ids), never candidate or request ids.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from prometheus_client import Histogram

# Handler and reply times run from sub-millisecond (a no-op evaluator, a cached retrieval) to
# minutes (a GPU evaluation with baselines, an LLM reply with retries).
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Transport(StrEnum):
    """How a handled message arrived."""

    CORE = "core"
    JETSTREAM = "jetstream"
    SERVICE = "service"


class Outcome(StrEnum):
    """How the handling of one message ended."""

    OK = "ok"
    ERROR = "error"
    RETRY = "retry"
    DROP = "drop"
    POISON = "poison"


class ReplyOutcome(StrEnum):
    """What an island got back from an expert."""

    PROPOSALS = "proposals"
    DECLINE = "decline"
    UNAVAILABLE = "unavailable"


EVALUATION_SECONDS = Histogram(
    "kfoundry_evaluation_seconds",
    "Time an evaluator took to judge one candidate (runner call), by verdict",
    ["run", "status"],
    buckets=_BUCKETS,
)
EXPERT_REPLY_SECONDS = Histogram(
    "kfoundry_expert_reply_seconds",
    "Time from an island's GenerateRequest to the expert's reply (or the request's failure)",
    ["run", "expert", "outcome"],
    buckets=_BUCKETS,
)
HANDLE_SECONDS = Histogram(
    "kfoundry_bus_handle_seconds",
    "Time a handler took for one message taken from the bus",
    ["kind", "transport", "outcome"],
    buckets=_BUCKETS,
)

METRIC_NAMES = ("kfoundry_evaluation_seconds", "kfoundry_expert_reply_seconds", "kfoundry_bus_handle_seconds")
"""The histogram names (each also exported with ``_bucket``, ``_sum`` and ``_count``)."""


_HANDLE_CHILDREN: dict[tuple[str, Transport, Outcome], Any] = {}
"""The histogram's labelled children: looking one up by its labels each time (a lock, a tuple, a
dict) was a third of the cost of an observation, paid on every message."""


def observe_handle(kind: str, transport: Transport, outcome: Outcome, seconds: float) -> None:
    """Record one handled message."""
    child = _HANDLE_CHILDREN.get((kind, transport, outcome))
    if child is None:
        child = HANDLE_SECONDS.labels(kind or "unknown", transport.value, outcome.value)
        _HANDLE_CHILDREN[kind, transport, outcome] = child
    child.observe(seconds)
