"""Starting actors: one per process (``kfoundry actor``) or a whole run in one process.

``run_actors`` runs several actors on one event loop inside a ``TaskGroup`` and drains them all
when its stop event fires (SIGTERM/SIGINT in the CLI). ``build_actor`` makes one actor of a kind
from command-line options, so ``kfoundry actor KIND`` and ``kfoundry run`` share one recipe.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.base import Actor
from actors.errors import ConfigError
from schemas import ActorKind, DeviceChoice, ExpertConfig, ExpertKind

if TYPE_CHECKING:
    from actors.gpu_claim import GpuClaim


async def run_actors(actors: Sequence[Actor], stop: asyncio.Event) -> None:
    """Run ``actors`` until ``stop`` is set (or all of them stopped), then drain every one."""

    async def stopper() -> None:
        waiters = {asyncio.ensure_future(a.wait_stopped()) for a in actors}
        stop_wait = asyncio.ensure_future(stop.wait())
        try:
            pending: set[asyncio.Future[Any]] = {*waiters, stop_wait}
            while waiters & pending and stop_wait in pending:
                _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (*waiters, stop_wait):
                future.cancel()
            await asyncio.gather(*waiters, stop_wait, return_exceptions=True)
        for actor in actors:
            actor.request_stop("stop requested")

    async with asyncio.TaskGroup() as tg:
        for actor in actors:
            tg.create_task(actor.run(), name=actor.actor_id)
        tg.create_task(stopper(), name="stopper")


def add_actor_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``kfoundry actor`` and ``kfoundry run``."""
    p.add_argument("--device", choices=[d.value for d in DeviceChoice], default="auto", help="evaluation device")
    p.add_argument(
        "--runner", choices=["gpu", "noop"], default="gpu", help="evaluator runner: gpu_runner, or noop (benchmarks)"
    )
    p.add_argument("--noop-delay", type=float, default=0.0, help="seconds a noop evaluation takes")
    p.add_argument("--eval-concurrency", type=int, default=None, help="candidates one evaluator judges at once")
    p.add_argument(
        "--ack-wait", type=float, default=30.0, help="seconds before an unacknowledged candidate is redelivered"
    )
    p.add_argument("--spares", type=int, default=2, help="pre-warmed run processes per evaluator")
    p.add_argument(
        "--isolation",
        choices=["strict", "best-effort"],
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
    p.add_argument("--per-request", type=int, default=1, help="candidates an island asks of an expert at once")
    p.add_argument("--library-dir", type=Path, default=None, help="curator snapshot folder")
    p.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm", help="curator embedder")


def add_actor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from actors.cli import _add_nats

    p = sub.add_parser("actor", help="start one actor process that joins a run")
    p.add_argument("kind", choices=[k.value for k in ActorKind if k is not ActorKind.CONTROLLER])
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
    _add_nats(p, connect_timeout=None)
    p.set_defaults(func=cmd_actor)


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from actors.run import add_run_arguments, cmd_run

    p = sub.add_parser("run", help="run the whole loop on a KernelBench-format task")
    add_run_arguments(p)
    add_actor_options(p)
    p.set_defaults(func=cmd_run)


def default_expert_config(name: str) -> ExpertConfig:
    """The configuration of an expert with none stored: the offline template expert."""
    if name != "template" and not name.startswith("template"):
        raise ConfigError(
            f"no configuration stored for expert {name!r}; store one with `kfoundry expert set {name} --kind llm "
            "--base-url URL --model MODEL --api-key-env VAR`"
        )
    return ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role="template")


def isolation_mode(args: argparse.Namespace) -> str:
    """``--isolation``, or its default: strict when candidates may come from an LLM (any expert that
    is not a template, an LLM diagnoser, or an evaluator joining a run from outside), else best-effort."""
    chosen: str | None = getattr(args, "isolation", None)
    if chosen is not None:
        return chosen
    experts = getattr(args, "experts", None)
    if experts is None and getattr(args, "kind", None) == ActorKind.EVALUATOR.value:
        return "strict"  # the run's experts are not known here
    names = [e.strip() for e in (experts or "template").split(",") if e.strip()]
    llm = any(not n.startswith("template") for n in names) or getattr(args, "llm_diagnoser", None) is not None
    return "strict" if llm else "best-effort"


def build_actor(
    kind: ActorKind,
    args: argparse.Namespace,
    *,
    url: str,
    run_id: str | None,
    island: str | None = None,
    expert_config: ExpertConfig | None = None,
    actor_id: str | None = None,
    gpu_claim: GpuClaim | None = None,
    gpus_here: int = 1,
) -> Actor:
    """One actor of ``kind`` configured from command-line options.

    An evaluator with ``gpu_claim`` evaluates on that GPU alone, with its share of the machine
    (``gpus_here`` evaluators, one per GPU): the cores for compiles, the host memory for its plan."""
    actor = _build(kind, args, url, run_id, island, expert_config, actor_id, gpu_claim, gpus_here)
    wait_for_run: float | None = getattr(args, "wait_for_run", None)  # `kfoundry actor` only
    if wait_for_run is not None:
        actor.wait_for_run_s = wait_for_run
    return actor


def _build(
    kind: ActorKind,
    args: argparse.Namespace,
    url: str,
    run_id: str | None,
    island: str | None,
    expert_config: ExpertConfig | None,
    actor_id: str | None,
    gpu_claim: GpuClaim | None,
    gpus_here: int,
) -> Actor:
    version = getattr(args, "version", None)
    concurrency = getattr(args, "concurrency", None)
    if kind is not ActorKind.EXPERT and kind is not ActorKind.CURATOR and not run_id:
        raise ConfigError(f"a {kind} actor needs --run RUN")
    if kind is ActorKind.EVALUATOR:
        from actors.evaluator import EvaluatorActor
        from actors.evaluator_process import EvaluatorProcess, child_argv, holds_secrets

        if getattr(args, "kind", None) is None and holds_secrets(os.environ):  # `kfoundry run` beside experts
            argv = child_argv(args, run_id or "", isolation_mode(args))
            return EvaluatorProcess(nats_url=url, run_id=run_id or "", argv=argv, actor_id=actor_id)
        from actors.runners import GpuRunner, NoopRunner, Runner

        runner: Runner
        if args.runner == "noop":
            runner = NoopRunner(args.noop_delay)
        else:
            sizing: dict[str, Any] = {}
            device = DeviceChoice(args.device)
            if gpu_claim is not None:
                from actors.gpus import compile_workers_per_gpu

                device = DeviceChoice.CUDA
                sizing = {
                    "claim": gpu_claim,
                    "compile_workers": compile_workers_per_gpu(gpus_here),
                    "host_memory_share": 1.0 / gpus_here,
                }
            eval_timeout = getattr(args, "eval_timeout", None)  # `kfoundry run` only; the spec's bound wins
            if eval_timeout is not None:
                sizing["timeout_s"] = eval_timeout
            runner = GpuRunner(device=device, spares=args.spares, isolation=isolation_mode(args), **sizing)
        return EvaluatorActor(
            nats_url=url,
            run_id=run_id or "",
            runner=runner,
            concurrency=args.eval_concurrency or concurrency or 2,
            ack_wait_s=args.ack_wait,
            actor_id=actor_id,
            version=version,
        )
    if kind is ActorKind.DIAGNOSER:
        from actors.diagnoser import DiagnoserActor, RuleDiagnose

        llm = None
        if expert_config is not None:
            from actors.diagnosis.llm_diagnoser import LLMDiagnoser

            llm = LLMDiagnoser(expert_config)
        return DiagnoserActor(
            nats_url=url,
            run_id=run_id or "",
            diagnose=RuleDiagnose(llm),
            concurrency=concurrency or 16,
            actor_id=actor_id,
            version=version,
        )
    if kind is ActorKind.EXPERT:
        from actors.expert import ExpertActor

        config = expert_config or default_expert_config(args.name)
        return ExpertActor(nats_url=url, config=config, concurrency=concurrency, actor_id=actor_id, version=version)
    if kind is ActorKind.ISLAND:
        from actors.island import IslandActor

        if not island:
            raise ConfigError("an island actor needs --island ID")
        more = {} if concurrency is None else {"feedback_concurrency": concurrency}
        return IslandActor(
            nats_url=url,
            run_id=run_id or "",
            island=island,
            actor_id=actor_id,
            per_request=args.per_request,
            version=version,
            **more,
        )
    if kind is ActorKind.MIGRATOR:
        from actors.migrator import MigratorActor

        if concurrency is not None:
            raise ConfigError(f"--concurrency {concurrency}: a migrator handles one island status at a time")
        return MigratorActor(nats_url=url, run_id=run_id or "", actor_id=actor_id, version=version)
    if kind is ActorKind.CURATOR:
        from actors.curator import CuratorActor

        more = {} if concurrency is None else {"concurrency": concurrency}
        return CuratorActor(
            nats_url=url,
            directory=args.library_dir,
            embedder=args.embedder,
            actor_id=actor_id,
            version=version,
            **more,
        )
    raise ConfigError(f"actor kind {kind} cannot be started on its own")


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
    from actors.gpu_claim import claim_gpu
    from actors.gpus import list_gpus, select_one

    gpus = list_gpus()
    if index is None and not gpus:
        return None, 1  # the CPU (auto), or a GPU nvidia-smi cannot list: as before
    return claim_gpu(select_one(index or 0, gpus), run_id=args.run or ""), len(gpus)


def cmd_actor(args: argparse.Namespace) -> int:
    from actors.cli import nats_url, run_async
    from actors.kv import get_expert_config
    from actors.logs import configure_logging

    configure_logging(level=args.log_level)
    kind = ActorKind(args.kind)
    if args.wait_for_run < 0:
        raise ConfigError(f"--wait-for-run must be >= 0 seconds, got {args.wait_for_run:g}")
    claim, gpus_here = hand_started_gpu(kind, args)  # before anything starts: a taken GPU is one line

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            config = None
            wanted = args.name if kind is ActorKind.EXPERT else args.llm_diagnoser
            if wanted and kind in (ActorKind.EXPERT, ActorKind.DIAGNOSER):
                from actors.bus import Bus

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
                args,
                url=url,
                run_id=args.run,
                island=args.island,
                expert_config=config,
                actor_id=args.actor_id,
                gpu_claim=claim,
                gpus_here=gpus_here,
            )
            if args.metrics_port:
                from actors.metrics import serve_metrics

                serve_metrics([actor], args.metrics_port)
            await run_actors([actor], stop)
        return 0

    return run_async(main)
