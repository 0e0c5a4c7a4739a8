"""Building and running actors: one per process (``kfoundry actor``) or a whole run in one process.

``build_actor`` makes one actor of a kind from typed ``ActorOptions``, so ``kfoundry actor KIND``
and ``kfoundry run`` share one recipe. ``run_actors`` runs several actors on one event loop inside
a ``TaskGroup`` and drains them all when its stop event fires (SIGTERM/SIGINT in the CLI).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actors.base import Actor
from actors.errors import ConfigError
from actors.options import ActorOptions, RunnerKind, isolation_mode
from schemas import ActorKind, DeviceChoice, ExpertConfig, ExpertKind, Role

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


def default_expert_config(name: str) -> ExpertConfig:
    """The configuration of an expert with none stored: the offline template expert."""
    if name != "template" and not name.startswith("template"):
        raise ConfigError(
            f"no configuration stored for expert {name!r}; store one with `kfoundry expert set {name} --kind llm "
            "--base-url URL --model MODEL --api-key-env VAR`"
        )
    return ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)


def build_actor(
    kind: ActorKind,
    options: ActorOptions,
    *,
    url: str,
    run_id: str | None,
    island: str | None = None,
    expert_config: ExpertConfig | None = None,
    actor_id: str | None = None,
    gpu_claim: GpuClaim | None = None,
    gpus_here: int = 1,
) -> Actor:
    """One actor of ``kind`` configured by ``options``.

    An evaluator with ``gpu_claim`` evaluates on that GPU alone, with its share of the machine
    (``gpus_here`` evaluators, one per GPU): the cores for compiles, the host memory for its plan."""
    actor = _build(kind, options, url, run_id, island, expert_config, actor_id, gpu_claim, gpus_here)
    if options.wait_for_run_s is not None:
        actor.wait_for_run_s = options.wait_for_run_s
    return actor


def _build(
    kind: ActorKind,
    options: ActorOptions,
    url: str,
    run_id: str | None,
    island: str | None,
    expert_config: ExpertConfig | None,
    actor_id: str | None,
    gpu_claim: GpuClaim | None,
    gpus_here: int,
) -> Actor:
    version, concurrency = options.version, options.concurrency
    if kind is not ActorKind.EXPERT and kind is not ActorKind.CURATOR and not run_id:
        raise ConfigError(f"a {kind} actor needs --run RUN")
    if kind is ActorKind.EVALUATOR:
        from actors.evaluator import EvaluatorActor
        from actors.evaluator_process import EvaluatorProcess, child_argv, holds_secrets

        if options.hosts_the_run and holds_secrets(os.environ):  # `kfoundry run` beside its experts
            argv = child_argv(options, run_id or "", isolation_mode(options))
            return EvaluatorProcess(nats_url=url, run_id=run_id or "", argv=argv, actor_id=actor_id)
        from actors.runners import GpuRunner, NoopRunner, Runner

        runner: Runner
        if options.runner is RunnerKind.NOOP:
            runner = NoopRunner(options.noop_delay_s)
        else:
            sizing: dict[str, Any] = {}
            device = options.device
            if gpu_claim is not None:
                from actors.gpus import compile_workers_per_gpu

                device = DeviceChoice.CUDA
                sizing = {
                    "claim": gpu_claim,
                    "compile_workers": compile_workers_per_gpu(gpus_here),
                    "host_memory_share": 1.0 / gpus_here,
                }
            if options.eval_timeout_s is not None:  # `kfoundry run`'s; each evaluation gets the spec's bound too
                sizing["timeout_s"] = options.eval_timeout_s
            runner = GpuRunner(device=device, spares=options.spares, isolation=isolation_mode(options), **sizing)
        return EvaluatorActor(
            nats_url=url,
            run_id=run_id or "",
            runner=runner,
            concurrency=options.eval_concurrency or concurrency or 2,
            ack_wait_s=options.ack_wait_s,
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

        config = expert_config or default_expert_config(options.expert_name)
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
            per_request=options.per_request,
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
            directory=options.library_dir,
            embedder=options.embedder.value,
            actor_id=actor_id,
            version=version,
            **more,
        )
    raise ConfigError(f"actor kind {kind} cannot be started on its own")
