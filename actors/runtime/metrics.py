"""Prometheus ``/metrics`` for the actors of one process (``--metrics-port``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.runtime.base import Actor
from actors.runtime.bus import Bus
from actors.runtime.errors import ConfigError

_COUNTERS = ("received", "processed", "errors", "dead_lettered", "redelivered")


LAG_TIMEOUT_S = 2.0
"""How long a scrape waits for the server's consumer counts (it goes on without them after)."""


class ActorCollector(Collector):
    """Reads every actor's statistics snapshot at scrape time, and the backlog of the durable
    consumers of the runs they serve (``kfoundry_consumer_pending``, ``..._ack_pending``), asked
    of the server over an actor's own connection, on its event loop."""

    def __init__(self, actors: Sequence[Actor], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.actors = list(actors)
        self.loop = loop

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["actor", "kind", "run", "island"]
        counters = {
            name: CounterMetricFamily(f"kfoundry_messages_{name}", f"Messages {name} by the actor", labels=labels)
            for name in _COUNTERS
        }
        in_flight = GaugeMetricFamily("kfoundry_in_flight", "Messages being handled now", labels=labels)
        handle = GaugeMetricFamily("kfoundry_mean_handle_seconds", "Mean handler time", labels=labels)
        extra = GaugeMetricFamily("kfoundry_actor_value", "Actor-specific numeric counters", labels=[*labels, "name"])
        for actor in self.actors:
            stats = actor.snapshot()
            values = [actor.actor_id, str(actor.kind), actor.run_id or "", actor.island or ""]
            for name, family in counters.items():
                family.add_metric(values, float(getattr(stats, name)))
            in_flight.add_metric(values, float(stats.in_flight))
            if stats.mean_handle_ms is not None:
                handle.add_metric(values, stats.mean_handle_ms / 1e3)
            for key, value in stats.extra.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    extra.add_metric([*values, key], float(value))
        yield from counters.values()
        yield in_flight
        yield handle
        yield extra
        yield from self._lag()

    def _lag(self) -> Iterator[GaugeMetricFamily]:
        labels = ["run", "stream", "consumer"]
        pending = GaugeMetricFamily(
            "kfoundry_consumer_pending",
            "Messages of a run's stream not yet delivered to a durable consumer",
            labels=labels,
        )
        unacked = GaugeMetricFamily(
            "kfoundry_consumer_ack_pending",
            "Messages delivered to a durable consumer, not yet acknowledged",
            labels=labels,
        )
        loop = self.loop
        serving: dict[str, Bus] = {}
        for actor in self.actors:
            if actor.run_id and actor.run_id not in serving and actor._bus is not None:
                serving[actor.run_id] = actor._bus
        # Never from the loop's own thread (it would wait on itself): only the HTTP server's.
        if loop is not None and loop.is_running() and asyncio._get_running_loop() is not loop:
            from actors.runtime.observe import consumer_lag

            for run_id, bus in serving.items():
                future = asyncio.run_coroutine_threadsafe(consumer_lag(bus.nc, run_id=run_id), loop)
                try:
                    rows = future.result(timeout=LAG_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - a scrape never fails for the server's counts
                    future.cancel()
                    continue
                for row in rows:
                    pending.add_metric([run_id, row.stream, row.consumer], float(row.pending))
                    unacked.add_metric([run_id, row.stream, row.consumer], float(row.ack_pending))
        yield pending
        yield unacked


def serve_metrics(actors: Sequence[Actor], port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` for ``actors`` on ``port`` (a daemon thread of prometheus_client);
    ``ConfigError`` naming the port when it cannot be bound (in use, or not allowed)."""
    start_metrics_server(port, addr)
    collect_actors(actors)


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve this process's ``/metrics`` on ``port`` (``kfoundry run`` binds it before anything
    starts, so a taken port is one line at once; its actors are added once they exist)."""
    try:
        start_http_server(port, addr=addr)
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {port}: cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
        ) from exc


def collect_actors(actors: Sequence[Actor]) -> None:
    """Add ``actors``' counters to what ``/metrics`` serves (called on their event loop, whose
    connections then answer the scrapes' questions to the server)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    REGISTRY.register(ActorCollector(actors, loop))
