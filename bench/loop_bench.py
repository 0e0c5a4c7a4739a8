"""The whole loop with no-op evaluators: candidates per second through every actor.

Islands ask the template expert (real), publish candidates, no-op evaluators return flagged
results at once, a diagnoser diagnoses them, islands take the feedback, record experiences for the
curator (hashing embedder), and a migrator watches. Timed from the first candidate to the
``candidates``-th feedback the islands took, after a warm-up that lets the template expert
analyse the task. CPU time per candidate is reported for this process and for the server (and
the other actor processes): on a shared machine it is steadier than the rate.

Where the actors run (``--layout``):

- ``one``: every actor in this process (one core at most, with the server on the other);
- ``split``: evaluators and the diagnoser in a second process;
- ``spread``: the islands here, every other actor kind in a process of its own, as the README's
  multi-machine recipe starts them; the CPU per candidate is reported per process.

Run alone: ``python -m bench.loop_bench [--candidates N] [--islands N] [--inflight K]
[--per-request N] [--layout one|split|spread]`` (``bench/fabric_bench.py`` runs it too). It also
reports how long after the stop request the slowest actor stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from actors.commands.launch import run_actors
from actors.kinds.curator import CuratorActor
from actors.kinds.diagnoser import DiagnoserActor, RuleDiagnose
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import NoopRunner
from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.kinds.migrator import MigratorActor
from actors.kinds.registry import default_expert_config
from actors.runtime.base import Actor
from actors.runtime.bus import Bus
from actors.runtime.errors import BusError
from actors.runtime.kv import put_expert_config, put_run
from actors.runtime.nats_server import start_server, stop_server
from schemas import ActorInfo, ActorState, Budget, Control, ControlAction, DeviceChoice, RunSpec, Task, subjects

TASK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


class Layout(StrEnum):
    """Where the actors of the bench run (see the module docstring)."""

    ONE = "one"
    SPLIT = "split"
    SPREAD = "spread"


async def run_noop_loop(
    url: str,
    *,
    candidates: int,
    islands: int,
    inflight: int,
    per_request: int = 1,
    evaluators: int = 2,
    experts: int = 2,
    layout: Layout = Layout.ONE,
    server_pid: int | None = None,
    server_http: str | None = None,
) -> dict[str, float]:
    """Run the loop until ``candidates`` feedbacks arrived; returns counts, rate and CPU time per
    candidate (this process; the server too when ``server_pid`` is given; the other actor
    processes too, each as ``cpu_ms.<name>``), messages through the server per candidate (when its
    monitoring URL ``server_http`` is given) and, per actor kind, the seconds its slowest actor
    took to stop after the stop request (``stop_s.<kind>``)."""
    from actors.commands.signature import with_signature

    run_id = f"loop{int(time.time() * 1000) % 10**9}"
    task = with_signature(Task.from_source("quickstart", TASK.read_text()))
    spec = RunSpec(
        run_id=run_id,
        task=task,
        islands=islands,
        inflight_per_island=inflight,
        budget=Budget(candidates=candidates * 10, wall_s=3600),
        device=DeviceChoice.CPU,
    )
    bus = await Bus.connect(url, name="loop-bench", actor_id="loop-bench")
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    await put_run(bus, spec)
    config = default_expert_config("template")
    await put_expert_config(bus, config)
    procs: dict[str, _Process] = {}

    def pids() -> list[int]:
        return [p.popen.pid for p in procs.values()] + ([server_pid] if server_pid else [])

    with tempfile.TemporaryDirectory() as lib:
        actors: list[Actor] = []
        args = ["--nats", url, "--log-level", "warning"]
        evaluator_args = ["evaluator", "--run", run_id, "--runner", "noop", "--eval-concurrency", "64"]
        diagnoser_args = ["diagnoser", "--run", run_id, "--concurrency", "64"]
        if layout is Layout.SPREAD:
            # Every kind but the islands in a process of its own (one process per kind, with the
            # instances this layout would otherwise run side by side in one).
            procs["curator"] = _spawn("curator", "--embedder", "hashing", "--library-dir", lib, *args)
            procs["expert"] = _spawn("expert", "--name", config.name, *args)
            procs["migrator"] = _spawn("migrator", "--run", run_id, *args)
        else:
            actors.append(CuratorActor(nats_url=url, directory=Path(lib), embedder="hashing"))
            actors += [ExpertActor(nats_url=url, config=config) for _ in range(experts)]
            actors.append(MigratorActor(nats_url=url, run_id=run_id))
        if layout is not Layout.ONE:
            # Evaluators and the diagnoser in processes of their own, so the loop can use both cores.
            procs["evaluator"] = _spawn(*evaluator_args, *args)
            procs["diagnoser"] = _spawn(*diagnoser_args, *args)
        else:
            actors += [
                EvaluatorActor(nats_url=url, run_id=run_id, runner=NoopRunner(), concurrency=64)
                for _ in range(evaluators)
            ]
            actors.append(DiagnoserActor(nats_url=url, run_id=run_id, diagnose=RuleDiagnose(), concurrency=64))
        await _until_running(bus, procs)
        isles = [
            IslandActor(nats_url=url, run_id=run_id, island=f"i{i}", per_request=per_request) for i in range(islands)
        ]
        actors += isles
        stop = asyncio.Event()
        runner = asyncio.create_task(run_actors(actors, stop))
        # Counted from the islands' own counters (no subscription of this bench's own adds load):
        # timed from the first candidate published (the template expert has analysed the task by
        # then) until the islands have taken ``candidates`` more feedbacks.
        async with asyncio.timeout(600):
            for island in isles:
                await island.wait_ready()
            await _until(lambda: any(island.published for island in isles))
            t0, cpu0, others0 = time.perf_counter(), time.process_time(), _cpu_s(pids())
            each0 = {name: _cpu_s([proc.popen.pid]) for name, proc in procs.items()}
            msgs0 = _server_msgs(server_http)
            evaluated0 = sum(island.brain.evaluated for island in isles)
            await _until(lambda: sum(island.brain.evaluated for island in isles) - evaluated0 >= candidates)
            evaluated = sum(island.brain.evaluated for island in isles) - evaluated0
        elapsed = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
        other_cpu_s = _cpu_s(pids()) - others0
        each = {name: _cpu_s([proc.popen.pid]) - each0[name] for name, proc in procs.items()}
        if server_pid:
            each["nats-server"] = other_cpu_s - sum(each.values())
        msgs1 = _server_msgs(server_http)
        stop.set()
        stop_requested = time.time()
        await runner
        stop_s: dict[str, float] = {}
        for actor in actors:
            took = (actor.stopped_at or time.time()) - stop_requested
            key = f"stop_s.{actor.kind}"
            stop_s[key] = max(stop_s.get(key, 0.0), took)
        # The actors of other processes get their stop request (SIGTERM) at once, side by side.
        signalled = time.time()
        for proc in procs.values():
            proc.popen.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            await asyncio.to_thread(proc.popen.wait, 30)
            stop_s[f"stop_s.{name}"] = max(stop_s.get(f"stop_s.{name}", 0.0), time.time() - signalled)
        slowest_stop = max(stop_s.values())
    await bus.close()
    return {
        "candidates": float(evaluated),
        "seconds": elapsed,
        "per_s": evaluated / elapsed,
        "islands": float(islands),
        "inflight": float(inflight),
        "cpu_fraction": cpu_s / elapsed,
        "cpu_ms_per_candidate": cpu_s / evaluated * 1e3,
        "other_cpu_ms_per_candidate": other_cpu_s / evaluated * 1e3,
        "slowest_stop_s": slowest_stop,
        "processes": float(1 + len(procs)),
        **stop_s,
        **{f"cpu_ms.{name}": cpu / evaluated * 1e3 for name, cpu in each.items()},
        **{f"server_{k}_per_candidate": (msgs1[k] - msgs0[k]) / evaluated for k in msgs0},
    }


def _server_msgs(http_url: str | None) -> dict[str, float]:
    """Messages and bytes into and out of the server so far (its ``/varz``); empty without a URL."""
    if http_url is None:
        return {}
    with urllib.request.urlopen(f"{http_url}/varz", timeout=5) as answer:
        varz = json.load(answer)
    return {key: float(varz[key]) for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")}


async def _until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` every 5 ms (the counters it reads are plain attributes of the actors)."""
    while True:
        if condition():
            return
        await asyncio.sleep(0.005)


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by other processes (the server, split actors)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # not Linux, or gone
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@dataclass(frozen=True)
class _Process:
    """An actor process of the bench."""

    actor_id: str
    popen: subprocess.Popen[bytes]


def _spawn(kind: str, *args: str) -> _Process:
    actor_id = f"bench-{kind}-{os.getpid()}"
    argv = [sys.executable, "-m", "actors.cli", "actor", kind, "--id", actor_id, *args]
    return _Process(actor_id, subprocess.Popen(argv))


async def _until_running(bus: Bus, procs: dict[str, _Process], timeout_s: float = 120.0) -> None:
    """Wait until every spawned actor says it is running (set up, consuming or serving), so the
    islands do not start against experts and evaluators that are still importing torch."""
    async with asyncio.timeout(timeout_s):
        for proc in procs.values():
            while True:
                if proc.popen.poll() is not None:
                    raise RuntimeError(f"actor {proc.actor_id} exited with {proc.popen.returncode} before it ran")
                try:
                    info = await bus.request(
                        subjects.control(proc.actor_id), Control(action=ControlAction.INFO), ActorInfo, timeout=0.5
                    )
                except BusError:
                    info = None
                if info is not None and info.state is ActorState.RUNNING:
                    break
                await asyncio.sleep(0.1)


def main() -> int:
    from actors.runtime.logs import configure_logging

    configure_logging(level="warning")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--islands", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--per-request", type=int, default=1, help="candidates per expert request")
    parser.add_argument(
        "--layout",
        choices=[layout.value for layout in Layout],
        default=Layout.ONE.value,
        help="one: every actor in this process; split: evaluators and the diagnoser in processes of their own; "
        "spread: every kind but the islands in a process of its own",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        info = start_server(Path(tmp))
        try:
            out = asyncio.run(
                run_noop_loop(
                    info.url,
                    candidates=args.candidates,
                    islands=args.islands,
                    inflight=args.inflight,
                    per_request=args.per_request,
                    layout=Layout(args.layout),
                    server_pid=info.pid,
                    server_http=info.http_url,
                )
            )
        finally:
            stop_server(info.pid)
    sys.stdout.write(describe(out) + "\n")
    return 0


def describe(out: dict[str, float]) -> str:
    """A result of :func:`run_noop_loop` as a few lines: the rate, where the CPU went, the
    messages through the server, and how long each kind of actor took to stop."""
    lines = [
        f"whole loop, no-op evaluators: {out['candidates']:.0f} candidates in {out['seconds']:.2f} s = "
        f"{out['per_s']:.0f} candidates/s ({out['islands']:.0f} islands x {out['inflight']:.0f} in flight)",
        f"  CPU per candidate: {out['cpu_ms_per_candidate']:.2f} ms in this process (it used "
        f"{out['cpu_fraction']:.0%} of one core), {out['other_cpu_ms_per_candidate']:.2f} ms in nats-server and "
        "other actor processes",
    ]
    if "server_in_msgs_per_candidate" in out:
        lines.append(
            f"  through nats-server per candidate: {out['server_in_msgs_per_candidate']:.1f} messages in "
            f"({out['server_in_bytes_per_candidate'] / 1024:.1f} KiB), {out['server_out_msgs_per_candidate']:.1f} "
            f"out ({out['server_out_bytes_per_candidate'] / 1024:.1f} KiB)"
        )
    per_process = sorted((k.removeprefix("cpu_ms."), v) for k, v in out.items() if k.startswith("cpu_ms."))
    if per_process:
        lines.append(f"  {'CPU per candidate, by process':<32} {'ms':>8}")
        lines += [f"  {name:<32} {ms:>8.2f}" for name, ms in per_process]
    stops = sorted((key.removeprefix("stop_s."), value) for key, value in out.items() if key.startswith("stop_s."))
    lines.append(f"  {'stopped after the stop request':<32} {'seconds':>8}")
    lines += [f"  {kind:<32} {seconds:>8.2f}" for kind, seconds in stops]
    lines.append(f"  {'slowest actor':<32} {out['slowest_stop_s']:>8.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
