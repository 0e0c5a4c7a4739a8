"""Helpers for fabric tests: actor processes, run registration, collecting stream messages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.runtime.bus import Bus
from actors.runtime.errors import BusError
from actors.runtime.kv import put_expert_config, put_run
from actors.runtime.nats_server import find_binary
from schemas import (
    ActorInfo,
    ActorState,
    Candidate,
    Control,
    ControlAction,
    DiagnosisCategory,
    EvalResult,
    EvalStatus,
    Experience,
    ExpertConfig,
    ExpertKind,
    ExpertRef,
    KernelLanguage,
    Message,
    Proposal,
    Role,
    RunEnd,
    RunSpec,
    StopReason,
    Task,
    TaskSignature,
    TensorSpec,
    subjects,
)

if TYPE_CHECKING:
    from actors.experts.base import Expert
    from actors.kinds.island import IslandActor
    from actors.runtime.base import Actor

REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""


async def register_run(bus: Bus, run_id: str, **spec: object) -> RunSpec:
    """Create the run's streams and store its spec, as ``kfoundry run`` does."""
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    run = RunSpec(run_id=run_id, task=Task.from_source("relu", REFERENCE), **spec)  # type: ignore[arg-type]
    await put_run(bus, run)
    return run


def candidate(run: RunSpec, i: int, island: str = "i0") -> Candidate:
    return Candidate(
        candidate_id=f"cand{i:05d}",
        run_id=run.run_id,
        island=island,
        task_id=run.task.task_id,
        expert="test",
        proposal=Proposal(source=f"# candidate {i}\nclass ModelNew: ...\n", language=KernelLanguage.TRITON),
    )


def result_for(cand: Candidate, status: EvalStatus, summary: str, **fields: Any) -> EvalResult:
    """An evaluator's result for ``cand`` (its run, island and task)."""
    return EvalResult(
        run_id=cand.run_id,
        candidate_id=cand.candidate_id,
        island=cand.island,
        task_id=cand.task_id,
        status=status,
        summary=summary,
        **fields,
    )


async def end_run(bus: Bus, run_id: str, actors: list[Actor], tasks: list[asyncio.Task[Any]]) -> None:
    """End a test's run as its controller would (every actor of the run leaves at once; the island
    stops waiting for feedback), stop ``actors`` that serve any run (experts), wait for ``tasks``."""
    end = RunEnd(run_id=run_id, reason=StopReason.INTERRUPTED, evaluated=0)
    await bus.publish_durable(subjects.run_end(run_id), end, msg_id=f"end-{run_id}")
    for actor in actors:
        actor.request_stop("test over")
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class IslandWithExpert:
    """What :func:`island_with_expert` runs: its bus, run and island, and every candidate the island
    has published so far (``arrived`` set at each)."""

    bus: Bus
    run_id: str
    island: IslandActor
    published: list[Candidate] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_published(self, n: int, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.published) < n:
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def island_with_expert(nats_url: str, expert: Expert, **spec: object) -> AsyncIterator[IslandWithExpert]:
    """A one-island run (``spec``: more ``RunSpec`` fields) whose only expert is ``expert``, served
    by a real expert actor under a template configuration, with no evaluator: the island asks, and
    what it publishes is recorded. The run ends, and the actors stop, on leaving."""
    from actors.kinds.expert import ExpertActor
    from actors.kinds.island import IslandActor

    run_id = "ie" + uuid.uuid4().hex[:10]
    name = "x" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url, name="test", actor_id=f"test-{run_id}")
    config = ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)
    await put_expert_config(bus, config)
    await register_run(bus, run_id, islands=1, experts=(ExpertRef(name=name),), **spec)
    run = IslandWithExpert(bus, run_id, IslandActor(nats_url=nats_url, run_id=run_id, island="i0", retrieve_ttl_s=0.0))

    async def seen(msg):  # type: ignore[no-untyped-def]
        run.published.append(Candidate.model_validate_json(msg.data))
        run.arrived.set()

    sub = await bus.nc.subscribe(subjects.candidates(run_id, "i0", "*"), cb=seen)
    actor = ExpertActor(nats_url=nats_url, config=config, expert=expert, watch_config=False)
    tasks = [asyncio.create_task(actor.run())]
    try:
        await actor.wait_ready()
        tasks.append(asyncio.create_task(run.island.run()))
        yield run
    finally:
        await end_run(bus, run_id, [actor], tasks)
        await sub.unsubscribe()
        await bus.close()


async def wait_evaluated(island: IslandActor, n: int, timeout: float = 30.0) -> None:
    """Until ``island`` has taken ``n`` feedbacks (its own counter: it announces nothing per feedback)."""
    async with asyncio.timeout(timeout):
        while True:  # polled: the island has no event for it
            if island.brain.evaluated >= n:
                return
            await asyncio.sleep(0.05)


async def publish_candidates(bus: Bus, run: RunSpec, ids: range, island: str = "i0") -> None:
    for i in ids:
        cand = candidate(run, i, island)
        await bus.publish_durable(
            subjects.candidates(run.run_id, island, cand.candidate_id), cand, msg_id=cand.candidate_id
        )


async def collect(bus: Bus, stream: str, subject: str, msg_type: type[Message], want: int, timeout: float) -> list:  # type: ignore[type-arg]
    """Read ``want`` messages of ``subject`` from ``stream`` (from its start), then linger briefly
    to catch any duplicates."""
    sub = await bus.js.subscribe(subject, stream=stream, ordered_consumer=True)
    out: list[Message] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < want:
                msg = await sub.next_msg(timeout=timeout)
                out.append(msg_type.model_validate_json(msg.data))
        while True:  # duplicates would arrive right behind
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            out.append(msg_type.model_validate_json(msg.data))
    finally:
        await sub.unsubscribe()
    return out


def spawn_actor(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """``kfoundry actor ...`` as a separate OS process (its own session), logging to ``log``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "actor", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    finally:
        fh.close()


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM (a graceful drain), then SIGKILL if it lingers; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    return int(proc.returncode)


async def actor_info(bus: Bus, actor_id: str) -> ActorInfo | None:
    """The actor's info through its control endpoint, or ``None`` if it does not answer."""
    try:
        return await bus.request(subjects.control(actor_id), Control(action=ControlAction.INFO), ActorInfo, timeout=0.5)
    except BusError:
        return None


async def wait_up(bus: Bus, actor_id: str, timeout: float = 120.0) -> ActorInfo:
    """Wait until an actor (started in another process) is running: set up and consuming. Its control
    endpoint answers from before its set-up (an evaluator warming up, an island loading its task),
    so an answer alone does not say it would hear a run's end or take a candidate."""
    async with asyncio.timeout(timeout):
        while True:
            info = await actor_info(bus, actor_id)
            if info is not None and info.state is ActorState.RUNNING:
                return info
            await asyncio.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RestartableServer:
    """A nats-server on a fixed port that can be stopped and started again on its store."""

    def __init__(self, store: Path) -> None:
        self.port = _free_port()
        self.store = store
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [str(find_binary()), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


SIG = TaskSignature(ops=("linear", "gelu"), inputs=(TensorSpec(shape=(128, 4096), dtype="float32"),))


def experience_record(run_id: str, i: int) -> Experience:
    """A distinct experience record of a run (every other one memory-bound)."""
    return Experience(
        experience_id=f"{run_id}-e{i}",
        run_id=run_id,
        task_id="t1",
        signature=SIG,
        candidate_id=f"c{i}",
        diagnosis=DiagnosisCategory.SLOW_MEMORY_BOUND if i % 2 else DiagnosisCategory.COMPILE_RESOURCES,
        expert="template",
        strategy=f"tile-{i}",
        status=EvalStatus.CORRECT,
        parent_fitness=1.0,
        child_fitness=1.0 + i / 100,
        description=f"block size {16 * (i % 8 + 1)} with {i % 4 + 1} warps",
    )


def stopped_stats(log: Path) -> dict[str, Any]:
    """The statistics an actor logs as it stops (its JSON log's ``actor stopped`` line)."""
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("{") and '"actor stopped"' in line:
            entry: dict[str, Any] = json.loads(line)
            return entry
    raise AssertionError(f"{log.name}: the actor did not log its stop")
