"""Benchmark of the actor fabric against raw nats-py, on one real nats-server.

Prints a table:
1. typed request/reply (``Bus.request`` → micro endpoint with validation) vs raw nats-py
   request/reply carrying the same bytes: per-request latency p50 and throughput, and the ratio;
2. the candidate→result hop: a ``Candidate`` published into the run stream, consumed by a durable
   pull consumer, answered with an ``EvalResult`` published into the stream before the ack —
   typed (``Bus.publish_durable`` + ``Bus.consume``) vs the same protocol in raw nats-py;
3. the whole loop with no-op evaluators: islands, the template expert, evaluators with the
   ``noop`` runner, a diagnoser, a migrator and a curator — candidates per second from the first
   candidate to the last feedback, CPU per candidate over every process, and the slowest actor's
   stop, with the actors in one process or each kind in its own (``LOOPS``), one or eight
   candidates per expert request; then the fastest configuration in detail.

Run: ``python -m bench.fabric_bench [--quick]`` (or ``python bench/fabric_bench.py``). Ratios come
from runs side by side on the same server; this machine is shared, so run it twice and compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a script (``python bench/fabric_bench.py``): this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from actors.runtime.bus import Bus, ConsumerSpec, Delivery
from actors.runtime.nats_server import ServerInfo, start_server, stop_server
from bench.loop_bench import Layout, describe, run_noop_loop
from schemas import (
    Candidate,
    Control,
    ControlAction,
    EvalResult,
    EvalStatus,
    KernelLanguage,
    Proposal,
    subjects,
)

SOURCE = "import torch\n" + "# a kernel source of realistic size\n" * 120 + "class ModelNew(torch.nn.Module): ...\n"


def _candidate(run_id: str, i: int) -> Candidate:
    return Candidate(
        candidate_id=f"c{i:07d}",
        run_id=run_id,
        island="i0",
        task_id="t" * 16,
        expert="bench",
        proposal=Proposal(source=SOURCE, language=KernelLanguage.TRITON, strategy="bench"),
    )


def _result(c: Candidate) -> EvalResult:
    return EvalResult(
        run_id=c.run_id,
        candidate_id=c.candidate_id,
        island=c.island,
        task_id=c.task_id,
        status=EvalStatus.CORRECT,
        summary="bench",
        speedup_vs_eager=1.0,
    )


async def bench_request_reply(url: str, n: int) -> dict[str, float]:
    """Sequential requests: typed vs raw, same payload bytes."""
    server = await Bus.connect(url, name="rr-server", actor_id="rr-server")
    client = await Bus.connect(url, name="rr-client", actor_id="rr-client")
    service = await server.add_service(name="kf-bench", version="0.1.0", description="bench", metadata={})
    reply_msg = Control(action=ControlAction.INFO, reason="pong")

    async def typed_handler(msg: Control) -> Control:
        return reply_msg

    await server.serve(service, name="typed", subject="bench.typed", request_type=Control, handler=typed_handler)
    raw_nc = await nats.connect(url)
    raw_reply = reply_msg.to_bytes()

    async def raw_handler(msg: Msg) -> None:
        await msg.respond(raw_reply)

    await raw_nc.subscribe("bench.raw", cb=raw_handler)
    raw_client = await nats.connect(url)
    await raw_nc.flush()
    req = Control(action=ControlAction.INFO, reason="ping")
    req_bytes = req.to_bytes()
    out: dict[str, float] = {}
    for rnd in range(2):  # interleave rounds to share the machine's noise
        t_typed: list[float] = []
        t_raw: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await client.request("bench.typed", req, Control, timeout=5)
            t1 = time.perf_counter()
            await raw_client.request("bench.raw", req_bytes, timeout=5)
            t2 = time.perf_counter()
            t_typed.append(t1 - t0)
            t_raw.append(t2 - t1)
        if rnd == 1:
            out = {
                "typed_p50_ms": statistics.median(t_typed) * 1e3,
                "raw_p50_ms": statistics.median(t_raw) * 1e3,
                "typed_per_s": n / sum(t_typed),
                "raw_per_s": n / sum(t_raw),
            }
    await raw_client.close()
    await raw_nc.close()
    await client.close()
    await server.close()
    return out


async def _typed_hop(url: str, run_id: str, n: int, concurrency: int) -> float:
    bus = await Bus.connect(url, name="hop", actor_id=f"hop-{run_id}", dlq_run=run_id)
    await bus.ensure_shared_streams()
    await bus.ensure_run_stream(run_id)
    done = asyncio.Event()
    got = 0

    async def evaluate(c: Candidate, d: Delivery) -> None:
        await bus.publish_durable(subjects.results(run_id, c.island), _result(c), msg_id=f"result-{c.candidate_id}")

    async def collect(r: EvalResult, d: Delivery) -> None:
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    stream = subjects.run_stream(run_id)
    await bus.consume(
        ConsumerSpec(stream=stream, durable="evaluators", filter_subject=subjects.candidates(run_id)),
        Candidate,
        evaluate,
        concurrency=concurrency,
    )
    await bus.consume(
        ConsumerSpec(stream=stream, durable="results", filter_subject=subjects.results(run_id)),
        EvalResult,
        collect,
        concurrency=concurrency,
    )
    cands = [_candidate(run_id, i) for i in range(n)]
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(concurrency * 4)

    async def pub(c: Candidate) -> None:
        async with sem:
            await bus.publish_durable(subjects.candidates(run_id, "i0", c.candidate_id), c, msg_id=c.candidate_id)

    await asyncio.gather(*(pub(c) for c in cands))
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - t0
    await bus.close()
    return n / elapsed


async def _raw_hop(url: str, run_id: str, n: int, concurrency: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = f"RAW_{run_id}"
    await js.add_stream(name=stream, subjects=[f"raw.{run_id}.>"])
    cand_bytes = [_candidate(run_id, i).to_bytes() for i in range(n)]
    res_bytes = _result(_candidate(run_id, 0)).to_bytes()
    done = asyncio.Event()
    got = 0
    stop = asyncio.Event()

    async def worker(subject: str, durable: str, on_msg: object) -> None:
        psub = await js.pull_subscribe(
            subject, durable=durable, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
        )
        while not stop.is_set():
            try:
                msgs = await psub.fetch(64, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            await asyncio.gather(*(on_msg(m) for m in msgs))  # type: ignore[operator]
        await psub.unsubscribe()

    async def evaluate(m: Msg) -> None:
        await js.publish(f"raw.{run_id}.result", res_bytes, headers={"Nats-Msg-Id": m.data[-40:].hex()})
        await m.ack()

    async def collect(m: Msg) -> None:
        nonlocal got
        await m.ack()
        got += 1
        if got >= n:
            done.set()

    tasks = [
        asyncio.create_task(worker(f"raw.{run_id}.cand", "ev", evaluate)),
        asyncio.create_task(worker(f"raw.{run_id}.result", "res", collect)),
    ]
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(concurrency * 4)

    async def pub(i: int, data: bytes) -> None:
        async with sem:
            await js.publish(f"raw.{run_id}.cand", data, headers={"Nats-Msg-Id": f"{run_id}-{i}"})

    await asyncio.gather(*(pub(i, d) for i, d in enumerate(cand_bytes)))
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*tasks)
    await nc.close()
    return n / elapsed


async def bench_hop(url: str, n: int, concurrency: int = 64) -> dict[str, float]:
    typed: list[float] = []
    raw: list[float] = []
    for rnd in range(2):
        typed.append(await _typed_hop(url, f"typedhop{rnd}", n, concurrency))
        raw.append(await _raw_hop(url, f"rawhop{rnd}", n, concurrency))
    return {"typed_per_s": max(typed), "raw_per_s": max(raw)}


LOOPS: tuple[tuple[Layout, int], ...] = ((Layout.ONE, 1), (Layout.ONE, 8), (Layout.SPREAD, 1), (Layout.SPREAD, 8))
"""The whole loop's configurations: every actor in one process (one core at most), or each kind but
the islands in a process of its own (both cores, as the multi-machine recipe starts them); islands
asking the template expert for one candidate per request, or eight."""


async def bench_loop(
    info: ServerInfo, candidates: int, islands: int, inflight: int, layout: Layout, per_request: int
) -> dict[str, float]:
    return await run_noop_loop(
        info.url,
        candidates=candidates,
        islands=islands,
        inflight=inflight,
        per_request=per_request,
        layout=layout,
        server_pid=info.pid,
        server_http=info.http_url,
    )


def loop_table(loops: list[tuple[Layout, int, dict[str, float]]]) -> str:
    """The whole loop's runs side by side: rate, CPU per candidate (all processes) and the slowest
    actor's stop."""
    lines = [
        f"{'whole loop (no-op evaluators)':<32} {'per request':>11} {'candidates/s':>13} {'CPU ms/cand':>12} "
        f"{'processes':>9} {'slowest stop s':>15}"
    ]
    for layout, per_request, out in loops:
        cpu = out["cpu_ms_per_candidate"] + out["other_cpu_ms_per_candidate"]
        lines.append(
            f"{'layout ' + layout.value:<32} {per_request:>11} {out['per_s']:>13.0f} {cpu:>12.2f} "
            f"{out['processes']:>9.0f} {out['slowest_stop_s']:>15.2f}"
        )
    return "\n".join(lines)


def main() -> int:
    if __package__ in (None, ""):  # run as ``python bench/fabric_bench.py``: the repository root is not on the path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from actors.runtime.logs import configure_logging

    # The actors' per-message info lines would go to the console and cost as much as a part of
    # the loop: at warning, like ``bench.loop_bench``, the bench times the fabric.
    configure_logging(level="warning")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages")
    parser.add_argument("--skip-loop", action="store_true", help="only the bus benchmarks")
    args = parser.parse_args()
    n_rr = 500 if args.quick else 3000
    n_hop = 1000 if args.quick else 5000
    with tempfile.TemporaryDirectory() as tmp:
        info: ServerInfo = start_server(Path(tmp))
        try:
            rr = asyncio.run(bench_request_reply(info.url, n_rr))
            hop = asyncio.run(bench_hop(info.url, n_hop))
        finally:
            stop_server(info.pid)
    loops: list[tuple[Layout, int, dict[str, float]]] = []
    for layout, per_request in () if args.skip_loop else LOOPS:
        # A server of its own for each: on a shared one the curator of a later loop would still be
        # replaying the experience stream of the earlier ones while it is timed.
        with tempfile.TemporaryDirectory() as tmp:
            info = start_server(Path(tmp))
            try:
                n = 1000 if args.quick else 6000
                loops.append((layout, per_request, asyncio.run(bench_loop(info, n, 4, 64, layout, per_request))))
            finally:
                stop_server(info.pid)
    rows = [
        ("request/reply p50 (ms)", rr["typed_p50_ms"], rr["raw_p50_ms"], rr["typed_p50_ms"] / rr["raw_p50_ms"]),
        ("request/reply (req/s)", rr["typed_per_s"], rr["raw_per_s"], rr["raw_per_s"] / rr["typed_per_s"]),
        ("candidate->result hop (msg/s)", hop["typed_per_s"], hop["raw_per_s"], hop["raw_per_s"] / hop["typed_per_s"]),
    ]
    out = sys.stdout
    out.write(f"\n{'measure':<32} {'typed bus':>12} {'raw nats-py':>12} {'overhead':>9}\n")
    for name, typed, raw, ratio in rows:
        out.write(f"{name:<32} {typed:>12.2f} {raw:>12.2f} {ratio:>8.2f}x\n")
    if loops:
        out.write("\n" + loop_table(loops) + "\n")
        layout, per_request, best = max(loops, key=lambda run: run[2]["per_s"])
        out.write(f"\nthe fastest, layout {layout.value} with {per_request} per request, in detail:\n")
        out.write(describe(best) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
