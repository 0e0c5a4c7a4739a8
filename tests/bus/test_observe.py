"""Watching a live system: the tap shows what it cannot decode (and why) and each reply once;
``kfoundry dlq`` lists dead letters with their reasons and subjects."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.runtime.bus import Bus, ConsumerSpec
from actors.runtime.observe import dead_letters, tap
from schemas import Control, ControlAction, subjects
from tests.bus.helpers import candidate, register_run

ROOT = Path(__file__).resolve().parents[2]


async def _bus(url: str, run_id: str, name: str) -> Bus:
    return await Bus.connect(url, name=name, actor_id=f"{name}-{run_id}", dlq_run=run_id)


@pytest.mark.timeout(60)
async def test_tap_marks_undecodable_messages_and_shows_each_reply_once(nats_url: str, run_id: str) -> None:
    bus = await _bus(nats_url, run_id, "t")
    watcher = await _bus(nats_url, run_id, "tap")
    lines: list[str] = []
    stop = asyncio.Event()
    try:
        run = await register_run(bus, run_id)
        watching = asyncio.create_task(
            tap(watcher.nc, [subjects.run_all(run_id), subjects.dead_letters(run_id), f"kftest.{run_id}.>", "_INBOX.>"],
                lines.append,
                stop=stop)
        )  # fmt: skip
        await asyncio.sleep(0.3)
        # An undecodable payload and a well-formed JSON object of no known type, on run subjects.
        await bus.nc.publish(subjects.results(run_id, "i0"), b"\x00not json")
        await bus.nc.publish(subjects.results(run_id, "i1"), b'{"type": "no_such_type"}')
        # A candidate into the stream (its publish ack is a reply, but not a Kernel Foundry message)...
        cand = candidate(run, 1)
        await bus.publish_durable(subjects.candidates(run_id, "i0", cand.candidate_id), cand, msg_id=cand.candidate_id)
        # ... then delivered to a pull consumer (a copy of the stream message on the consumer's inbox).
        psub = await bus.js.pull_subscribe(
            subjects.candidates(run_id), durable="tapped", stream=subjects.run_stream(run_id)
        )
        (delivered,) = await psub.fetch(1, timeout=5)
        await delivered.ack()
        # A typed request whose reply is a Kernel Foundry message.
        service = await bus.add_service(name="kf-test", version="0.1.0", description="t", metadata={})

        async def echo(msg: Control) -> Control:
            return Control(action=ControlAction.INFO, reason=f"echo {msg.reason}")

        await bus.serve(service, name="echo", subject=f"kftest.{run_id}.echo", request_type=Control, handler=echo)
        await bus.request(
            f"kftest.{run_id}.echo", Control(action=ControlAction.INFO, reason="ping"), Control, timeout=5
        )
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await watching
        await watcher.close()
        await bus.close()
    undecodable = [line for line in lines if " UNDECODABLE " in line]
    assert len(undecodable) == 2, lines
    assert any("JSONDecodeError" in line or "UnicodeDecodeError" in line for line in undecodable), undecodable
    assert any("unknown message type 'no_such_type'" in line for line in undecodable), undecodable
    assert sum(f"cand={cand.candidate_id[:8]}" in line for line in lines) == 1, lines
    assert sum("'echo ping'" in line for line in lines) == 1, lines  # the reply, once
    assert sum("'ping'" in line for line in lines) == 1, lines  # the request, once


async def test_dlq_lists_dead_letters_of_a_run_with_reasons_and_subjects(
    nats_url: str, run_id: str, tmp_path: Path
) -> None:
    bus = await _bus(nats_url, run_id, "t")
    other = await _bus(nats_url, run_id + "x", "other")
    try:
        await bus.ensure_shared_streams()
        await bus.ensure_run_stream(run_id)
        # A malformed candidate reaches a consumer: it is dead-lettered as invalid.
        got = asyncio.Event()

        async def never(msg: Control, _delivery: object) -> None:
            got.set()

        await bus.consume(
            ConsumerSpec(stream=subjects.run_stream(run_id), durable="dlqtest", filter_subject=f"kf.{run_id}.ctl.>"),
            Control,
            never,
        )
        await bus.js.publish(f"kf.{run_id}.ctl.a", b'{"type": "control", "action": "explode"}')
        await bus.dead_letter(f"kf.{run_id}.cand.i0.c1", b"{}", reason="poison", error="the source is empty")
        await other.dead_letter("kf.elsewhere", b"{}", reason="poison", error="another run's letter")
        async with asyncio.timeout(10):
            # Polls the dead-letter stream: nothing here to wait on.
            while len(letters := await dead_letters(bus.nc, run_id=run_id)) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert not got.is_set()
    finally:
        await other.close()
        await bus.close()
    assert {(letter.reason, letter.subject) for letter in letters} == {
        ("invalid", f"kf.{run_id}.ctl.a"),
        ("poison", f"kf.{run_id}.cand.i0.c1"),
    }
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"))
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "actors.cli", "dlq", "--run", run_id, "--nats", nats_url],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith(f"2 dead letter(s) (run {run_id})")
    assert any("invalid" in line and f"kf.{run_id}.ctl.a" in line and "action" in line for line in out[1:]), out
    assert any("poison" in line and "the source is empty" in line for line in out[1:]), out
    assert not any("another run's letter" in line for line in out)
