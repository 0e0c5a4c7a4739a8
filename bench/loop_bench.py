"""The whole loop with no-op evaluators: candidates per second through every actor.

Islands ask the template expert (real), publish candidates, no-op evaluators return flagged
results at once, a diagnoser diagnoses them, islands take the feedback, record experiences for the
curator (hashing embedder), and a migrator watches. Timed from the first candidate to the
``candidates``-th feedback, after a warm-up that lets the template expert analyse the task.

Run alone: ``python -m bench.loop_bench [--candidates N] [--islands N] [--inflight K]``
(``bench/fabric_bench.py`` runs it too). It also reports how long after the stop request the
slowest actor stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from actors.base import Actor
from actors.bus import Bus
from actors.curator import CuratorActor
from actors.diagnoser import DiagnoserActor, RuleDiagnose
from actors.evaluator import EvaluatorActor
from actors.expert import ExpertActor
from actors.island import IslandActor
from actors.kv import put_expert_config, put_run
from actors.launch import default_expert_config, run_actors
from actors.migrator import MigratorActor
from actors.nats_server import start_server, stop_server
from actors.runners import NoopRunner
from schemas import Budget, DeviceChoice, RunSpec, Task, subjects

TASK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


async def run_noop_loop(
    url: str,
    *,
    candidates: int,
    islands: int,
    inflight: int,
    per_request: int = 1,
    evaluators: int = 2,
    experts: int = 2,
    split: bool = False,
) -> dict[str, float]:
    """Run the loop until ``candidates`` feedbacks arrived; returns counts and rate."""
    from actors.signature import with_signature

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
    seen: set[str] = set()
    first: list[float] = []
    cpu: list[float] = []
    done = asyncio.Event()
    warm = asyncio.Event()

    async def on_feedback(msg: object) -> None:
        if not warm.is_set():
            return
        seen.add(json.loads(msg.data)["candidate"]["candidate_id"])  # type: ignore[attr-defined]
        if len(seen) >= candidates:
            done.set()

    async def on_candidate(msg: object) -> None:
        if warm.is_set() and not first:
            first.append(time.perf_counter())
            cpu.append(time.process_time())
        warm.set()

    with tempfile.TemporaryDirectory() as lib:
        actors: list[Actor] = [CuratorActor(nats_url=url, directory=Path(lib), embedder="hashing")]
        actors += [ExpertActor(nats_url=url, config=config) for _ in range(experts)]
        procs: list[subprocess.Popen[bytes]] = []
        if split:
            # Evaluators and the diagnoser in a second OS process, so the loop can use both cores.
            args = ["--nats", url, "--run", run_id, "--log-level", "warning"]
            procs.append(_spawn("evaluator", "--runner", "noop", "--eval-concurrency", "64", *args))
            procs.append(_spawn("diagnoser", "--concurrency", "64", *args))
        else:
            actors += [
                EvaluatorActor(nats_url=url, run_id=run_id, runner=NoopRunner(), concurrency=64)
                for _ in range(evaluators)
            ]
            actors.append(DiagnoserActor(nats_url=url, run_id=run_id, diagnose=RuleDiagnose(), concurrency=64))
        actors.append(MigratorActor(nats_url=url, run_id=run_id))
        actors += [
            IslandActor(nats_url=url, run_id=run_id, island=f"i{i}", per_request=per_request) for i in range(islands)
        ]
        await bus.nc.subscribe(subjects.feedback(run_id), cb=on_feedback)
        await bus.nc.subscribe(subjects.candidates(run_id), cb=on_candidate)
        stop = asyncio.Event()
        runner = asyncio.create_task(run_actors(actors, stop))
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - first[0]
        cpu_s = time.process_time() - cpu[0]
        stop.set()
        stop_requested = time.time()
        await runner
        slowest_stop = max((a.stopped_at or time.time()) for a in actors) - stop_requested
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    await bus.close()
    return {
        "candidates": float(len(seen)),
        "seconds": elapsed,
        "per_s": len(seen) / elapsed,
        "islands": float(islands),
        "inflight": float(inflight),
        "cpu_fraction": cpu_s / elapsed,
        "slowest_stop_s": slowest_stop,
    }


def _spawn(kind: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "actors.cli", "actor", kind, *args])


def main() -> int:
    from actors.logs import configure_logging

    configure_logging(level="warning")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--islands", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--per-request", type=int, default=1, help="candidates per expert request")
    parser.add_argument("--split", action="store_true", help="evaluators and diagnoser in a second process")
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
                    split=args.split,
                )
            )
        finally:
            stop_server(info.pid)
    sys.stdout.write(
        f"whole loop, no-op evaluators: {out['candidates']:.0f} candidates in {out['seconds']:.2f} s = "
        f"{out['per_s']:.0f} candidates/s ({args.islands} islands x {args.inflight} in flight); "
        f"this process used {out['cpu_fraction']:.0%} of one core; every actor stopped within "
        f"{out['slowest_stop_s']:.1f} s of the stop request\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
