"""Hot swap of an expert under load: a new version starts and serves, the old one drains, no
request is lost.

The old version is drained once the new one has answered a request (the operator's order in the
README: start the new version beside the old, then drain the old), and a client waits up to 180 s
for an answer (the new version's first requests wait for its own analysis of the task, on a host
the clients keep busy). The test failed in two CI runs on a fresh 2-core clone (the stops of
e08cf75 and 5e649ee, with a fixed second before the drain and 60 s per request); the cause is not
established: in the second one's logs both versions had handled every request they received, and
the test failed about a minute after the drain, which is as long as a stuck request's wait and as
``v1.wait(60)``. Each version's last word is checked against what the clients received."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from actors.runtime.bus import Bus
from actors.runtime.errors import BusError
from schemas import ActorInfo, Control, ControlAction, GenerateReply, GenerateRequest, Task, subjects
from tests.bus.helpers import spawn_actor, stop_process, stopped_stats, wait_up

ROOT = Path(__file__).resolve().parents[2]
TASK = Task.from_source("quickstart", (ROOT / "examples" / "quickstart.py").read_text())


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
@pytest.mark.timeout(600)
async def test_expert_hot_swap_under_load_loses_no_request(nats_url: str, tmp_path: Path) -> None:
    began = time.monotonic()
    bus = await Bus.connect(nats_url, name="test", actor_id="test-expert-swap")
    args = ["--nats", nats_url, "--name", "template"]
    v1 = spawn_actor("expert", "--id", "expert-v1", "--version", "1.0.0", *args, log=tmp_path / "v1.log")
    v2 = None
    answered: Counter[str] = Counter()
    failures: list[str] = []
    stop = asyncio.Event()
    v2_served = asyncio.Event()

    async def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            request = GenerateRequest(run_id="swap", island=f"i{k}", task=TASK, n=2, seed=k * 1000 + i)
            i += 1
            sent = time.monotonic()
            try:
                reply = await bus.request(subjects.expert_generate("template"), request, GenerateReply, timeout=180)
            except BusError as exc:
                # which request, when (from the test's start) and after how long: to find it in the logs
                at, waited = sent - began, time.monotonic() - sent
                failures.append(f"{request.request_id} sent at {at:.1f} s, {waited:.1f} s: {type(exc).__name__}: {exc}")
                continue
            assert reply.request_id == request.request_id
            assert reply.decline is None, reply.decline
            answered[reply.expert_instance] += 1
            if reply.expert_instance == "expert-v2":
                v2_served.set()

    try:
        await wait_up(bus, "expert-v1")
        # Warm: the first request makes v1 analyse the task.
        await bus.request(
            subjects.expert_generate("template"),
            GenerateRequest(run_id="swap", island="w", task=TASK),
            GenerateReply,
            timeout=120,
        )
        clients = [asyncio.create_task(client(k)) for k in range(6)]
        await asyncio.sleep(1.0)
        v2 = spawn_actor("expert", "--id", "expert-v2", "--version", "2.0.0", *args, log=tmp_path / "v2.log")
        await wait_up(bus, "expert-v2")
        async with asyncio.timeout(180):  # the new version serves (its own analysis done) before the swap
            await v2_served.wait()
        await bus.request(
            subjects.control("expert-v1"), Control(action=ControlAction.DRAIN, reason="swap"), ActorInfo, timeout=5
        )
        assert await asyncio.to_thread(v1.wait, 60) == 0
        await asyncio.sleep(2.0)  # load goes on, served by v2 alone
        stop.set()
        await asyncio.gather(*clients)
    finally:
        stop.set()
        if v2 is not None:
            assert stop_process(v2) == 0
        stop_process(v1)
        await bus.close()
    logs = {name: (tmp_path / f"{name}.log").read_text()[-3000:] for name in ("v1", "v2")}
    assert failures == [], (failures, logs)
    assert answered["expert-v1"] > 0
    assert answered["expert-v2"] > 0
    # Each version's last word counts what it answered (v1 also the warm-up request).
    assert stopped_stats(tmp_path / "v1.log")["extra"]["answered"] == answered["expert-v1"] + 1
    assert stopped_stats(tmp_path / "v2.log")["extra"]["answered"] == answered["expert-v2"]
