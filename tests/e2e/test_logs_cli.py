"""``kfoundry logs RUN``: the log lines of a run's actors, gathered from the server's log stream
(a real ``nats-server``, a real actor process), filtered by actor and level; the lines a process
logs as it stops reach the stream too."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest

from actors.commands.logs import _select
from actors.runtime.bus import Bus
from actors.runtime.nats_server import ServerInfo
from tests.bus.helpers import register_run
from tests.e2e.helpers import cli_env as _env
from tests.e2e.helpers import kfoundry as _kfoundry
from tests.e2e.helpers import popen as _popen


async def _register(url: str, run_id: str) -> None:
    bus = await Bus.connect(url, name="test", actor_id=f"test-logs-{run_id}")
    try:
        await register_run(bus, run_id)
    finally:
        await bus.close()


def _lines(url: str, run_id: str, env: dict[str, str], *more: str) -> list[dict[str, object]]:
    proc = _kfoundry("logs", run_id, "--json", "--nats", url, *more, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.slow  # ~12 s: a whole run
@pytest.mark.timeout(180)
def test_logs_gathers_a_run_s_actor_lines_from_the_stream(nats_server: ServerInfo, run_id: str, tmp_path: Path) -> None:
    url, env = nats_server.url, _env(tmp_path)
    asyncio.run(_register(url, run_id))
    actor = _popen("actor", "diagnoser", "--run", run_id, "--nats", url, env=env)
    try:
        deadline = time.monotonic() + 90
        lines: list[dict[str, object]] = []
        while time.monotonic() < deadline and not any(line.get("event") == "actor running" for line in lines):
            time.sleep(1.0)
            lines = _lines(url, run_id, env)
        assert any(line.get("event") == "actor running" for line in lines), lines
        actor.send_signal(signal.SIGTERM)
        _, err = actor.communicate(timeout=60)
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait(timeout=10)
    ids = {str(line["actor"]) for line in _lines(url, run_id, env)}
    assert len(ids) == 1
    (actor_id,) = ids
    assert actor_id.startswith("diagnoser-")
    stored = _lines(url, run_id, env)
    on_stderr = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert on_stderr
    # every line it wrote on its stderr, the last ones of its stop included, is in the stream
    assert [line["event"] for line in stored] == [line["event"] for line in on_stderr], (stored, on_stderr)
    assert all(line["run"] == run_id for line in stored)

    text = _kfoundry("logs", run_id, "--nats", url, env=env)
    assert text.returncode == 0, text.stderr
    assert any(f" info    {actor_id} actor running " in line for line in text.stdout.splitlines()), text.stdout
    assert _lines(url, run_id, env, "--actor", "diagnoser") == stored
    for more in (["--actor", "island"], ["--level", "error"]):
        none = _kfoundry("logs", run_id, "--nats", url, *more, env=env)
        assert (none.returncode, none.stdout) == (1, ""), none.stderr
        assert none.stderr.startswith(f"kfoundry: no log line of run {run_id} in the log stream")
    other = _kfoundry("logs", run_id + "x", "--nats", url, env=env)
    assert other.returncode == 1, other.stderr
    bad = _kfoundry("logs", "a.b", "--nats", url, env=env)
    assert bad.returncode == 2
    assert bad.stderr.startswith("kfoundry: "), bad.stderr


def test_a_shared_actor_s_lines_are_shown_for_the_run_they_name() -> None:
    expert = json.dumps({"event": "proposal", "run": "r1", "actor": "expert-1"}).encode()
    elsewhere = json.dumps({"event": "proposal", "run": "r2", "actor": "expert-1"}).encode()
    own = json.dumps({"event": "evaluated", "level": "warning"}).encode()
    assert _select("kflog._.expert-1", expert, "r1", None, 0) == {"event": "proposal", "run": "r1", "actor": "expert-1"}
    assert _select("kflog._.expert-1", elsewhere, "r1", None, 0) is None
    assert _select("kflog.r1.evaluator-2", own, "r1", None, 0) == {
        "event": "evaluated", "level": "warning", "actor": "evaluator-2"
    }  # fmt: skip
    assert _select("kflog.r1.evaluator-2", own, "r1", "island", 0) is None
    assert _select("kflog.r1.evaluator-2", own, "r1", None, 3) is None  # error and above only
    assert _select("kflog.r2.evaluator-2", own, "r1", None, 0) is None
    assert _select("kflog.r1.evaluator-2", b"not json", "r1", None, 0) == {"event": "not json", "actor": "evaluator-2"}
