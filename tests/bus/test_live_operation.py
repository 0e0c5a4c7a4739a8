"""Operating actors while they run, through the CLI and separate processes: ``kfoundry expert set``
reaches a running LLM expert without a restart, and ``--metrics-port`` serves Prometheus metrics
that count what the actor did."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from actors.runtime.bus import Bus
from schemas import EvalResult, EvalStatus, GenerateReply, subjects
from tests.bus.helpers import candidate, register_run, spawn_actor, stop_process, wait_up
from tests.experts.llm_server import GOOD_MODELNEW, Chat, RecordedRequest, ScriptedLLMServer, answer, generate_request

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


async def _kfoundry(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "actors.cli", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip


async def test_expert_set_reaches_a_running_llm_expert_without_a_restart(nats_url: str, tmp_path: Path) -> None:
    name = f"live{os.getpid()}"
    async with ScriptedLLMServer() as server:
        server.responder = lambda _req: Chat((answer(GOOD_MODELNEW),))
        stored = await _kfoundry(
            "expert", "set", name, "--kind", "llm", "--base-url", server.base_url, "--model", "model-one",
            "--role", "fusion", "--nats", nats_url,
        )  # fmt: skip
        assert stored.returncode == 0, stored.stderr[-2000:]
        expert = spawn_actor("expert", "--name", name, "--id", f"{name}-1", "--nats", nats_url, log=tmp_path / "e.log")
        bus = await Bus.connect(nats_url, name="test", actor_id="test-live-expert")
        try:
            await wait_up(bus, f"{name}-1")
            first = await bus.request(subjects.expert_generate(name), generate_request(), GenerateReply, timeout=60)
            assert first.proposals, first.decline
            assert _models(server.completions) == ["model-one"]
            changed = await _kfoundry("expert", "set", name, "--model", "model-two", "--nats", nats_url)
            assert changed.returncode == 0, changed.stderr[-2000:]
            # The running expert takes the new configuration up live (KV watch): same process.
            async with asyncio.timeout(60):
                while _models(server.completions)[-1] != "model-two":
                    reply = await bus.request(
                        subjects.expert_generate(name), generate_request(), GenerateReply, timeout=60
                    )
                    assert reply.proposals, reply.decline
                    await asyncio.sleep(0.2)
            assert expert.poll() is None  # not restarted
        finally:
            stop_process(expert)
            await bus.close()


def _models(requests: list[RecordedRequest]) -> list[str]:
    return [str(r.body.get("model")) for r in requests]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


async def test_metrics_port_serves_the_actors_counts(nats_url: str, run_id: str, tmp_path: Path) -> None:
    port = _free_port()
    bus = await Bus.connect(nats_url, name="test", actor_id="test-metrics")
    run = await register_run(bus, run_id)
    diag = spawn_actor(
        "diagnoser", "--id", "diag-metrics", "--run", run_id, "--nats", nats_url, "--metrics-port", str(port),
        log=tmp_path / "d.log",
    )  # fmt: skip
    try:
        await wait_up(bus, "diag-metrics")
        before = await asyncio.to_thread(_scrape, port)
        assert 'kfoundry_messages_processed_total{actor="diag-metrics",island="",kind="diagnoser"' in before
        for i in range(3):
            cand = candidate(run, i)
            await bus.publish_durable(
                subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id
            )
            result = EvalResult(
                run_id=run_id, candidate_id=cand.candidate_id, island="i0", task_id=cand.task_id,
                status=EvalStatus.COMPILE_ERROR, summary="compile error", compile_log="SyntaxError: bad (line 1)",
            )  # fmt: skip
            await bus.publish_durable(subjects.results(run_id, "i0"), result, msg_id=f"result-{cand.candidate_id}")
        async with asyncio.timeout(60):
            while True:
                text = await asyncio.to_thread(_scrape, port)
                line = next(ln for ln in text.splitlines() if ln.startswith("kfoundry_messages_processed_total{"))
                if line.endswith(" 3.0"):
                    break
                await asyncio.sleep(0.2)
        assert f'run="{run_id}"' in line
        # the backlog of the run's durable consumers, asked of the server at scrape time
        lag = [ln for ln in text.splitlines() if ln.startswith("kfoundry_consumer_pending{") and run_id in ln]
        assert lag, text
        assert all(f'stream="KF_RUN_{run_id}"' in ln for ln in lag)
        assert any('consumer="diagnosers"' in ln for ln in lag), lag
        assert any(ln.startswith("kfoundry_consumer_ack_pending{") for ln in text.splitlines())
    finally:
        stop_process(diag)
        await bus.close()
