"""deploy/nats/roles.conf gives every actor role the subjects its actor really uses, and no more:
a nats-server runs with those users, every actor kind runs a short loop as its own user, and the
server must report no permission violation; a role is refused a subject outside its list."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from actors.kinds.curator import CuratorActor
from actors.kinds.diagnoser import DiagnoserActor, RuleDiagnose
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.kinds.migrator import MigratorActor
from actors.runtime.base import Actor
from actors.runtime.bus import Bus
from actors.runtime.kv import put_expert_config
from actors.runtime.nats_server import find_binary
from schemas import (
    ActorKind,
    Budget,
    ExpertConfig,
    ExpertKind,
    ExpertRef,
    MigrationPolicy,
    RunEnd,
    StopReason,
    subjects,
)
from tests.bus.helpers import publish_candidates, register_run
from tests.bus.scripted import ScriptedExpert, ScriptedRunner
from tests.cluster.nodes import free_ports

ROLES = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "roles.conf"
PASSWORD = "test-secret"


def _users() -> list[str]:
    return re.findall(r"\{\s*user:\s*(\w+)", ROLES.read_text())


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A nats-server with JetStream and the role users of roles.conf; yields (host:port, log)."""
    port, http = free_ports(2)
    shutil.copy(ROLES, tmp_path / "roles.conf")
    conf = tmp_path / "server.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\n"
        f"jetstream {{ store_dir: {tmp_path / 'js'} }}\ninclude ./roles.conf\n"
    )
    env = {f"KF_{user.upper()}_PASSWORD": PASSWORD for user in _users()}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(find_binary()), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(200):
            if "Server is ready" in log.read_text():
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _url(user: str, hostport: str) -> str:
    return f"nats://{user}:{PASSWORD}@{hostport}"


def _violations(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "Violation" in line]


async def _migrants_taken(bus: Bus, run_id: str, islands: tuple[str, ...]) -> bool:
    """Whether every island has taken (and acknowledged) at least one migration."""
    for island in islands:
        info = await bus.js.consumer_info(subjects.run_stream(run_id), subjects.island_migrant_consumer(island))
        if info.delivered is None or not info.delivered.consumer_seq or info.num_ack_pending:
            return False
    return True


def test_every_actor_kind_has_its_own_user() -> None:
    users = set(_users())
    assert {kind.value for kind in ActorKind} <= users, sorted({k.value for k in ActorKind} - users)
    assert "operator" in users


async def test_every_actor_runs_as_its_role_without_a_permission_violation(
    auth_server: tuple[str, Path], run_id: str, tmp_path: Path
) -> None:
    hostport, log = auth_server
    admin = await Bus.connect(_url("operator", hostport), name="test", actor_id="test-auth")
    await admin.ensure_shared_streams()
    run = await register_run(
        admin,
        run_id,
        islands=2,
        experts=(ExpertRef(name="scripted"),),
        budget=Budget(candidates=1000, wall_s=600),
        eval_timeout_s=1.0,
        migration=MigrationPolicy(interval_s=0.3),
    )
    await put_expert_config(admin, ExpertConfig(name="scripted", kind=ExpertKind.TEMPLATE, role="template"))
    # A candidate the islands did not publish (as the controller publishes seeds): island i0 reads it
    # back from the run stream when its feedback comes.
    await publish_candidates(admin, run, range(1), island="i0")
    config = ExpertConfig(name="scripted", kind=ExpertKind.TEMPLATE, role="template")
    actors: list[Actor] = [
        CuratorActor(nats_url=_url("curator", hostport), directory=tmp_path / "lib", embedder="hashing"),
        ExpertActor(nats_url=_url("expert", hostport), config=config, expert=ScriptedExpert()),
        EvaluatorActor(nats_url=_url("evaluator", hostport), run_id=run_id, runner=ScriptedRunner(), concurrency=2),
        DiagnoserActor(nats_url=_url("diagnoser", hostport), run_id=run_id, diagnose=RuleDiagnose()),
        MigratorActor(nats_url=_url("migrator", hostport), run_id=run_id, tick_s=0.1),
        IslandActor(nats_url=_url("island", hostport), run_id=run_id, island="i0"),
        IslandActor(nats_url=_url("island", hostport), run_id=run_id, island="i1"),
    ]
    tasks = [asyncio.create_task(a.run()) for a in actors]
    state: dict[str, object] = {}
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(a.wait_ready() for a in actors))
        curator, migrator = actors[0], actors[4]
        assert isinstance(curator, CuratorActor)
        assert isinstance(migrator, MigratorActor)
        islands = [a for a in actors if isinstance(a, IslandActor)]
        # Run until every path has been taken: feedback to both islands, elites announced and
        # migrated, experiences recorded and retrieved, a candidate read back.
        for _ in range(600):
            state = {
                "evaluated": [i.brain.evaluated for i in islands],
                "migrations": migrator.sent,
                "migrants_taken": await _migrants_taken(admin, run_id, ("i0", "i1")),
                "queries": curator.queries,
                "replayed": curator.replayed,
                "read_back": sum(i._reader.reads for i in islands if i._reader is not None),
            }
            if (
                min(state["evaluated"]) >= 3  # type: ignore[call-overload]
                and state["migrations"]
                and state["migrants_taken"]
                and state["queries"]
                and state["replayed"]
                and state["read_back"]
            ):
                break
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"not every path was taken within 60 s: {state}")
    finally:
        end = RunEnd(run_id=run_id, reason=StopReason.INTERRUPTED, evaluated=0)
        await admin.publish_durable(subjects.run_end(run_id), end, msg_id=f"end-{run_id}")
        for actor in actors:
            if actor.run_id is None:
                actor.request_stop("test over")
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.close()
    assert run.run_id == run_id
    assert _violations(log) == []


async def test_a_role_is_refused_a_subject_outside_its_list(auth_server: tuple[str, Path]) -> None:
    hostport, log = auth_server
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(_url("evaluator", hostport), error_cb=on_error)
    try:
        await nc.publish("kf.somerun.cand.i0.c1", b"{}")  # evaluators read candidates, never write them
        await nc.flush()
        async with asyncio.timeout(5):
            # Polls the server's log file: there is no event to wait on.
            while not _violations(log):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    finally:
        await nc.close()
    assert any("kf.somerun.cand.i0.c1" in line for line in _violations(log))
