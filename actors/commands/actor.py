"""``kfoundry actor KIND``: one actor process that joins a run (the command; ``actors.commands.launch``
builds the actor).

Its options shared with ``kfoundry run`` (``add_actor_options``) become typed ``ActorOptions``
here, the one place an ``argparse.Namespace`` of an actor command is read.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from actors.commands.launch import build_actor, run_actors
from actors.kinds.registry import ACTOR_KINDS
from actors.runtime.errors import ConfigError
from actors.runtime.options import ActorOptions, EmbedderKind, RunnerKind
from actors.runtime.process import add_nats_options, nats_url, run_async
from gpu_runner.config import IsolationMode
from schemas import ActorKind, DeviceChoice

if TYPE_CHECKING:
    from actors.runtime.gpu_claim import GpuClaim


def add_actor_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``kfoundry actor`` and ``kfoundry run``."""
    p.add_argument("--device", choices=[d.value for d in DeviceChoice], default="auto", help="evaluation device")
    p.add_argument(
        "--runner",
        choices=[r.value for r in RunnerKind],
        default=RunnerKind.GPU.value,
        help="evaluator runner: gpu_runner, or noop (benchmarks)",
    )
    p.add_argument("--noop-delay", type=float, default=0.0, help="seconds a noop evaluation takes")
    p.add_argument(
        "--eval-concurrency",
        type=int,
        default=None,
        help="candidates one evaluator judges at once (default 4 on a GPU with 8 or more cores of its own, else 2)",
    )
    p.add_argument(
        "--ack-wait", type=float, default=30.0, help="seconds before an unacknowledged candidate is redelivered"
    )
    p.add_argument(
        "--spares",
        type=int,
        default=None,
        help="pre-warmed run processes per evaluator (default 3 on a GPU with 8 or more cores of its own, else 2; "
        "the memory plan keeps those that fit)",
    )
    p.add_argument(
        "--host-memory-share",
        type=float,
        default=None,
        metavar="F",
        help="share of this host's available memory the evaluators plan with, in (0, 1] (default 1; split "
        "evenly between the evaluators of this process's GPUs); `kfoundry bench --parallel N` gives each run 1/N",
    )
    p.add_argument(
        "--isolation",
        choices=[m.value for m in IsolationMode],
        default=None,
        help="strict: refuse to run candidates unless every sandbox layer holds here; best-effort: run them with "
        "a warning (default: strict for `actor evaluator` and whenever an LLM expert or diagnoser is configured)",
    )
    p.add_argument(
        "--llm-diagnoser",
        metavar="EXPERT",
        default=None,
        help="refine diagnoses with the LLM endpoint of this stored expert configuration",
    )
    p.add_argument(
        "--confine-task",
        action="store_true",
        help="import the task file confined in this process's run controller and template experts too, as "
        "the evaluator does (namespaces, no network, a read-only view); refused where this machine cannot "
        "(same as KF_CONFINE_TASK=1)",
    )
    p.add_argument("--per-request", type=int, default=1, help="candidates an island asks of an expert at once")
    p.add_argument("--library-dir", type=Path, default=None, help="curator snapshot folder")
    p.add_argument(
        "--embedder",
        choices=[e.value for e in EmbedderKind],
        default=EmbedderKind.MINILM.value,
        help="curator embedder",
    )


def add_actor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("actor", help="start one actor process that joins a run")
    p.add_argument("kind", choices=[k.value for k in ACTOR_KINDS])
    p.add_argument("--run", help="run to join (all kinds except expert and curator)")
    p.add_argument("--island", help="island id (island actors)")
    p.add_argument("--name", default="template", help="expert name (expert actors)")
    p.add_argument("--id", dest="actor_id", help="actor id (default: kind plus random suffix)")
    p.add_argument("--version", default=None, help="semantic version the actor announces (for hot swaps)")
    p.add_argument("--concurrency", type=int, default=None, help="messages handled at once")
    p.add_argument("--log-level", default="info")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    p.add_argument(
        "--wait-for-run",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="wait this long for the run to be registered (default 600; 0: fail at once)",
    )
    p.add_argument(
        "--gpu",
        type=int,
        default=None,
        metavar="K",
        help="evaluator actors: evaluate on GPU K alone (numbered as CUDA numbers this machine's visible GPUs); "
        "claims it so no second evaluator times candidates there",
    )
    add_actor_options(p)
    add_nats_options(p, connect_timeout=None)
    p.set_defaults(func=cmd_actor, parser=p)


_KIND_OPTIONS: dict[str, tuple[str, frozenset[ActorKind]]] = {
    "device": ("--device", frozenset({ActorKind.EVALUATOR})),
    "runner": ("--runner", frozenset({ActorKind.EVALUATOR})),
    "noop_delay": ("--noop-delay", frozenset({ActorKind.EVALUATOR})),
    "eval_concurrency": ("--eval-concurrency", frozenset({ActorKind.EVALUATOR})),
    "ack_wait": ("--ack-wait", frozenset({ActorKind.EVALUATOR})),
    "spares": ("--spares", frozenset({ActorKind.EVALUATOR})),
    "host_memory_share": ("--host-memory-share", frozenset({ActorKind.EVALUATOR})),
    "isolation": ("--isolation", frozenset({ActorKind.EVALUATOR})),
    "gpu": ("--gpu", frozenset({ActorKind.EVALUATOR})),
    "llm_diagnoser": ("--llm-diagnoser", frozenset({ActorKind.DIAGNOSER})),
    "confine_task": ("--confine-task", frozenset({ActorKind.EXPERT})),
    "island": ("--island", frozenset({ActorKind.ISLAND})),
    "per_request": ("--per-request", frozenset({ActorKind.ISLAND})),
    "name": ("--name", frozenset({ActorKind.EXPERT})),
    "library_dir": ("--library-dir", frozenset({ActorKind.CURATOR})),
    "embedder": ("--embedder", frozenset({ActorKind.CURATOR})),
}
"""Options of ``kfoundry actor`` that only some kinds read: given to another kind, they would be
ignored without a word (``actor expert --device cuda --island i0`` started an expert)."""


def check_kind_options(kind: ActorKind, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse, in one line, options given that ``kind`` does not read (compared with their defaults)."""
    foreign = [
        flag
        for dest, (flag, kinds) in _KIND_OPTIONS.items()
        if kind not in kinds and getattr(args, dest, None) != parser.get_default(dest)
    ]
    if foreign:
        readers = sorted({k.value for dest, (flag, kinds) in _KIND_OPTIONS.items() if flag in foreign for k in kinds})
        raise ConfigError(
            f"{', '.join(foreign)}: not an option of {kind.value} actors (read by {' and '.join(readers)} actors)"
        )


def hand_started_gpu(kind: ActorKind, args: argparse.Namespace) -> tuple[GpuClaim | None, int]:
    """The GPU a hand-started evaluator claims, and how many GPUs share this machine (one
    evaluator each is assumed: compile workers are the cores shared between them).

    ``--gpu K`` claims GPU K. Without it, an evaluator on CUDA claims the GPU it would use anyway
    (the first visible one), so it cannot share a GPU with another evaluator unnoticed."""
    index: int | None = getattr(args, "gpu", None)
    if kind is not ActorKind.EVALUATOR:
        if index is not None:
            raise ConfigError(f"--gpu {index}: only evaluator actors use a GPU")
        return None, 1
    if index is not None and args.device == DeviceChoice.CPU.value:
        raise ConfigError(f"--gpu {index} and --device cpu: the CPU has no GPU index; drop one")
    if index is not None and args.runner != "gpu":
        raise ConfigError(f"--gpu {index}: the {args.runner} runner uses no GPU")
    if args.runner != "gpu" or args.device == DeviceChoice.CPU.value:
        return None, 1
    from actors.runtime.gpu_claim import claim_gpu
    from actors.runtime.gpus import list_gpus, select_one

    gpus = list_gpus()
    if index is None and not gpus:
        return None, 1  # the CPU (auto), or a GPU nvidia-smi cannot list: as before
    return claim_gpu(select_one(index or 0, gpus), run_id=args.run or ""), len(gpus)


def cmd_actor(args: argparse.Namespace) -> int:
    from actors.runtime.kv import get_expert_config
    from actors.runtime.logs import configure_logging

    configure_logging(level=args.log_level)
    kind = ActorKind(args.kind)
    check_kind_options(kind, args, args.parser)
    if args.wait_for_run < 0:
        raise ConfigError(f"--wait-for-run must be >= 0 seconds, got {args.wait_for_run:g}")
    options = ActorOptions.from_args(args)
    claim, gpus_here = hand_started_gpu(kind, args)  # before anything starts: a taken GPU is one line

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            config = None
            wanted = args.name if kind is ActorKind.EXPERT else args.llm_diagnoser
            if wanted and kind in (ActorKind.EXPERT, ActorKind.DIAGNOSER):
                from actors.runtime.bus import Bus

                probe = await Bus.connect(
                    url,
                    name="kfoundry-actor-config",
                    actor_id="kfoundry-actor-config",
                    connect_timeout=args.connect_timeout,
                    stop=stop,
                )
                try:
                    config = await get_expert_config(probe, wanted)
                finally:
                    await probe.close()
                if config is None and kind is ActorKind.DIAGNOSER:
                    raise ConfigError(f"--llm-diagnoser {wanted}: no expert configuration stored under that name")
            actor = build_actor(
                kind,
                options,
                url=url,
                run_id=args.run,
                island=args.island,
                expert_config=config,
                actor_id=args.actor_id,
                gpu_claim=claim,
                gpus_here=gpus_here,
            )
            if args.metrics_port:
                from actors.runtime.metrics import serve_metrics

                serve_metrics([actor], args.metrics_port)
            from actors.runtime.log_ship import shipping_logs

            async with shipping_logs(url, run=args.run, actor=actor.actor_id):  # for `kfoundry logs RUN`
                await run_actors([actor], stop)
        return 0

    return run_async(main)
