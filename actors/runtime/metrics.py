"""Prometheus ``/metrics`` for the actors of one process (``--metrics-port``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.runtime.base import Actor
from actors.runtime.errors import ConfigError

_COUNTERS = ("received", "processed", "errors", "dead_lettered", "redelivered")


class ActorCollector(Collector):
    """Reads every actor's statistics snapshot at scrape time."""

    def __init__(self, actors: Sequence[Actor]) -> None:
        self.actors = list(actors)

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
    """Add ``actors``' counters to what ``/metrics`` serves."""
    REGISTRY.register(ActorCollector(actors))
