"""Building and running actors: one per process (``kfoundry actor``) or a whole run in one process.

``build_actor`` makes one actor of a kind from typed ``ActorOptions`` through the registry of
kinds (``actors.kinds.registry``), so ``kfoundry actor KIND`` and ``kfoundry run`` share one recipe.
``run_actors`` runs several actors on one event loop inside a ``TaskGroup`` and drains them all
when its stop event fires (SIGTERM/SIGINT in the CLI).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actors.kinds.registry import BuildContext, actor_kind_entry
from actors.runtime.base import Actor
from actors.runtime.errors import ConfigError
from actors.runtime.options import ActorOptions, RunOptions
from schemas import ActorKind, ExpertConfig, RunSpec

if TYPE_CHECKING:
    from actors.runtime.gpu_claim import GpuClaim


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
    entry = actor_kind_entry(kind)
    if entry.needs_run and not run_id:
        raise ConfigError(f"a {kind} actor needs --run RUN")
    context = BuildContext(options, url, run_id, island, expert_config, actor_id, gpu_claim, gpus_here)
    actor = entry.build(context)
    if options.wait_for_run_s is not None:
        actor.wait_for_run_s = options.wait_for_run_s
    return actor


def local_evaluators(spec: RunSpec, options: RunOptions, url: str, gpu_claims: Sequence[GpuClaim]) -> list[Actor]:
    """The evaluators ``kfoundry run`` starts in its own process: one per claimed GPU, else
    ``options.evaluators``."""
    run_id, a = spec.run_id, options.actors
    if gpu_claims:
        n = len(gpu_claims)
        return [
            build_actor(ActorKind.EVALUATOR, a, url=url, run_id=run_id, gpu_claim=c, gpus_here=n) for c in gpu_claims
        ]
    return [build_actor(ActorKind.EVALUATOR, a, url=url, run_id=run_id) for _ in range(options.evaluators or 1)]


def run_local_actors(
    spec: RunSpec,
    options: RunOptions,
    url: str,
    expert_configs: Sequence[ExpertConfig],
    llm_diagnoser: ExpertConfig | None,
    gpu_claims: Sequence[GpuClaim],
    evaluators: Sequence[Actor] | None = None,
) -> list[Actor]:
    """The actors ``kfoundry run`` starts in its own process: a curator, the run's experts, its
    evaluators (``evaluators``, built and perhaps started earlier, else :func:`local_evaluators`),
    a diagnoser, a migrator when islands exchange elites, and the islands."""
    run_id, a = spec.run_id, options.actors
    actors: list[Actor] = [build_actor(ActorKind.CURATOR, a, url=url, run_id=None)]
    actors += [build_actor(ActorKind.EXPERT, a, url=url, run_id=None, expert_config=c) for c in expert_configs]
    actors += evaluators if evaluators is not None else local_evaluators(spec, options, url, gpu_claims)
    actors.append(build_actor(ActorKind.DIAGNOSER, a, url=url, run_id=run_id, expert_config=llm_diagnoser))
    if spec.islands > 1 and not spec.ablations.no_migration:
        actors.append(build_actor(ActorKind.MIGRATOR, a, url=url, run_id=run_id))
    actors += [build_actor(ActorKind.ISLAND, a, url=url, run_id=run_id, island=i) for i in spec.island_names()]
    return actors
