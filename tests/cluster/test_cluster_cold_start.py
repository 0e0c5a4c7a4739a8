"""A bus on a three-server cluster that has only just formed creates its buckets and streams of
three replicas: the metadata leader's "no suitable peers for placement" while it has not heard
from the other servers is waited out, not taken for an answer (it ended the cluster failover test's
controller with ``BucketNotFoundError``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js.kv import KeyValue

from actors.runtime.bus import Bus, settled
from actors.runtime.kv import bucket
from schemas import subjects
from tests.cluster.nodes import Cluster

STARTS = 12
"""Cold starts, ~1.3 s each. The refusal came in one to three of twelve; without waiting it out,
one run of this test in five failed with the failover test's ``BucketNotFoundError``."""


async def _open_at_once(url: str) -> list[str]:
    """Connect as soon as the server takes connections and create two buckets and a stream."""
    while True:
        try:
            bus = await Bus.connect(url, name="t", actor_id="t-cold", connect_timeout=1.0)
            break
        except Exception:  # noqa: BLE001 - the server is still starting: connect again
            await asyncio.sleep(0.02)
    try:
        made = []
        for name in ("kf_cold_a", "kf_cold_b"):
            kv = await bucket(bus, name)

            async def put(kv: KeyValue = kv) -> int:
                return await kv.put("k", b"v")

            # a bucket just made may have no stream leader yet: the fabric's own writes ask again
            await settled(f"writing to {name}", put)
            made.append(name)
        await bus.ensure_run_stream("coldrun")
        info = await bus.js.stream_info(subjects.run_stream("coldrun"))
        made.append(f"{info.config.name} x{info.config.num_replicas}")
        return made
    finally:
        await bus.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_buckets_and_streams_of_three_replicas_are_made_on_a_cluster_that_has_just_formed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_STREAM_REPLICAS", "3")  # before the servers list each other, too
    for start in range(STARTS):
        cluster = Cluster(tmp_path / f"nats{start}", ["127.0.0.1"] * 3)
        for node in cluster.nodes:
            node.start()
        try:
            made = asyncio.run(_open_at_once(cluster.nodes[start % 3].url))
        except Exception as exc:
            raise AssertionError(f"cold start {start}: {exc}\n{cluster.describe()}") from exc
        finally:
            cluster.stop()
        assert made == ["kf_cold_a", "kf_cold_b", "KF_RUN_coldrun x3"], made
