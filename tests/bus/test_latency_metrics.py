"""The latency histograms on ``/metrics``: evaluations, expert replies and bus handling are observed
by real actors on a real nats-server, and the ``/metrics`` page serves them."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.runtime.bus import Bus
from actors.runtime.metrics import serve_metrics
from schemas import (
    Budget,
    ExpertConfig,
    ExpertKind,
    ExpertRef,
)
from tests.bus.helpers import end_run, publish_candidates, register_run
from tests.bus.scripted import ScriptedExpert


def _count(text: str, name: str, **labels: str) -> float:
    """The ``_count`` of histogram ``name`` summed over the series whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_count" and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def test_served_metrics_carry_evaluation_expert_reply_and_handling_latencies(nats_url: str, run_id: str) -> None:
    port = _free_port()
    bus = await Bus.connect(nats_url, name="test", actor_id="test-latency")
    run = await register_run(
        bus,
        run_id,
        islands=1,
        experts=(ExpertRef(name="scripted"),),
        budget=Budget(candidates=1000, wall_s=600),
        eval_timeout_s=1.0,
    )
    evaluator = EvaluatorActor(nats_url=nats_url, run_id=run_id, runner=NoopRunner(0.01), concurrency=2)
    expert = ExpertActor(
        nats_url=nats_url,
        config=ExpertConfig(name="scripted", kind=ExpertKind.TEMPLATE, role="template"),
        expert=ScriptedExpert(),
        watch_config=False,
    )
    island = IslandActor(nats_url=nats_url, run_id=run_id, island="i0")
    actors = [evaluator, expert, island]
    serve_metrics(actors, port, addr="127.0.0.1")
    before = _scrape(port)
    tasks = [asyncio.create_task(a.run()) for a in (evaluator, expert)]
    try:
        await asyncio.gather(evaluator.wait_ready(), expert.wait_ready())
        await publish_candidates(bus, run, range(5))
        tasks.append(asyncio.create_task(island.run()))
        async with asyncio.timeout(60):
            while True:
                text = await asyncio.to_thread(_scrape, port)
                evaluated = _count(text, "kfoundry_evaluation_seconds", run=run_id, status="correct")
                replies = _count(text, "kfoundry_expert_reply_seconds", run=run_id, expert="scripted")
                if evaluated >= 5 and replies >= 1:
                    break
                await asyncio.sleep(0.2)
    finally:
        await end_run(bus, run_id, [expert], tasks)
        await bus.close()
    assert _count(text, "kfoundry_expert_reply_seconds", run=run_id, expert="scripted", outcome="proposals") >= 1
    # The evaluator took each candidate from its durable consumer, the expert each request at its endpoint.
    for kind, transport in (("evaluator", "jetstream"), ("expert", "service")):
        grew = _count(text, "kfoundry_bus_handle_seconds", kind=kind, transport=transport, outcome="ok") - _count(
            before, "kfoundry_bus_handle_seconds", kind=kind, transport=transport, outcome="ok"
        )
        assert grew >= 1, (kind, transport)
    # The actors' counters are on the same page.
    assert 'kfoundry_messages_processed_total{actor="' + evaluator.actor_id in text
