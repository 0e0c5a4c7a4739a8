"""The registry of actor kinds: how each kind is built from ``ActorOptions`` (``build_actor``).

Adding a kind: its module (an ``Actor`` subclass), its ``ActorKind`` member, and one builder here
registered in ``ACTOR_KINDS``; ``kfoundry actor`` offers every registered kind. Builders import
their actor's module when called, so a process loads only the kinds it starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.runtime.errors import ConfigError
from actors.runtime.options import ActorOptions, RunnerKind, isolation_mode
from schemas import ActorKind, DeviceChoice, ExpertConfig, ExpertKind, Role

if TYPE_CHECKING:
    from actors.runtime.base import Actor
    from actors.runtime.gpu_claim import GpuClaim


@dataclass(frozen=True)
class BuildContext:
    """Everything a builder may use besides the options: where and for whom the actor works."""

    options: ActorOptions
    url: str
    run_id: str | None
    island: str | None = None
    expert_config: ExpertConfig | None = None
    """The expert an expert actor serves, or the LLM endpoint a diagnoser refines with."""
    actor_id: str | None = None
    gpu_claim: GpuClaim | None = None
    gpus_here: int = 1

    @property
    def run(self) -> str:
        """The run id, which this kind needs (a clear error without one)."""
        if not self.run_id:
            raise ConfigError("this actor kind needs --run RUN")
        return self.run_id


@dataclass(frozen=True)
class ActorKindEntry:
    """How one kind is built."""

    build: Callable[[BuildContext], Actor]
    needs_run: bool = True
    """Whether the kind works for one run (all but experts and the curator, which serve many)."""


def default_expert_config(name: str) -> ExpertConfig:
    """The configuration of an expert with none stored: the offline template expert."""
    if name != "template" and not name.startswith("template"):
        raise ConfigError(
            f"no configuration stored for expert {name!r}; store one with `kfoundry expert set {name} --kind llm "
            "--base-url URL --model MODEL --api-key-env VAR`"
        )
    return ExpertConfig(name=name, kind=ExpertKind.TEMPLATE, role=Role.TEMPLATE)


def _evaluator(ctx: BuildContext) -> Actor:
    from actors.kinds.evaluator import EvaluatorActor
    from actors.kinds.evaluator_process import EvaluatorProcess, child_argv, holds_secrets

    options = ctx.options
    if options.hosts_the_run and holds_secrets(os.environ):  # `kfoundry run` beside its experts
        argv = child_argv(options, ctx.run, isolation_mode(options))
        return EvaluatorProcess(nats_url=ctx.url, run_id=ctx.run, argv=argv, actor_id=ctx.actor_id)
    from actors.kinds.evaluator_runners import GpuRunner, NoopRunner, Runner
    from actors.runtime.gpus import compile_workers_per_gpu, evaluator_sizing

    on_gpu = ctx.gpu_claim is not None or options.device is DeviceChoice.CUDA
    concurrency, spares = evaluator_sizing(on_gpu, compile_workers_per_gpu(ctx.gpus_here))
    concurrency = options.eval_concurrency or options.concurrency or concurrency
    runner: Runner
    if options.runner is RunnerKind.NOOP:
        runner = NoopRunner(options.noop_delay_s)
    else:
        share = 1.0 if options.host_memory_share is None else options.host_memory_share
        sizing: dict[str, Any] = {"host_memory_share": share}
        device = options.device
        if ctx.gpu_claim is not None:
            device = DeviceChoice.CUDA
            sizing = {
                "claim": ctx.gpu_claim,
                "compile_workers": compile_workers_per_gpu(ctx.gpus_here),
                "host_memory_share": share / ctx.gpus_here,
            }
        if options.eval_timeout_s is not None:  # `kfoundry run`'s; each evaluation gets the spec's bound too
            sizing["timeout_s"] = options.eval_timeout_s
        runner = GpuRunner(
            device=device,
            spares=spares if options.spares is None else options.spares,
            isolation=isolation_mode(options),
            # it judges ``concurrency`` at once; the look-ahead it takes beyond waits for its turn
            max_running=concurrency,
            **sizing,
        )
    return EvaluatorActor(
        nats_url=ctx.url,
        run_id=ctx.run,
        runner=runner,
        concurrency=concurrency,
        ack_wait_s=options.ack_wait_s,
        actor_id=ctx.actor_id,
        version=options.version,
    )


def _diagnoser(ctx: BuildContext) -> Actor:
    from actors.kinds.diagnoser import DiagnoserActor, RuleDiagnose

    llm = None
    if ctx.expert_config is not None:
        from actors.diagnosis.llm_diagnoser import LLMDiagnoser

        llm = LLMDiagnoser(ctx.expert_config)
    return DiagnoserActor(
        nats_url=ctx.url,
        run_id=ctx.run,
        diagnose=RuleDiagnose(llm),
        concurrency=ctx.options.concurrency or 16,
        actor_id=ctx.actor_id,
        version=ctx.options.version,
    )


def _expert(ctx: BuildContext) -> Actor:
    from actors.kinds.expert import ExpertActor

    config = ctx.expert_config or default_expert_config(ctx.options.expert_name)
    return ExpertActor(
        nats_url=ctx.url,
        config=config,
        concurrency=ctx.options.concurrency,
        actor_id=ctx.actor_id,
        version=ctx.options.version,
    )


def _island(ctx: BuildContext) -> Actor:
    from actors.kinds.island import IslandActor

    if not ctx.island:
        raise ConfigError("an island actor needs --island ID")
    concurrency = ctx.options.concurrency
    more = {} if concurrency is None else {"feedback_concurrency": concurrency}
    return IslandActor(
        nats_url=ctx.url,
        run_id=ctx.run,
        island=ctx.island,
        actor_id=ctx.actor_id,
        per_request=ctx.options.per_request,
        version=ctx.options.version,
        **more,
    )


def _migrator(ctx: BuildContext) -> Actor:
    from actors.kinds.migrator import MigratorActor

    if ctx.options.concurrency is not None:
        raise ConfigError(f"--concurrency {ctx.options.concurrency}: a migrator handles one island status at a time")
    return MigratorActor(nats_url=ctx.url, run_id=ctx.run, actor_id=ctx.actor_id, version=ctx.options.version)


def _curator(ctx: BuildContext) -> Actor:
    from actors.kinds.curator import CuratorActor

    concurrency = ctx.options.concurrency
    more = {} if concurrency is None else {"concurrency": concurrency}
    return CuratorActor(
        nats_url=ctx.url,
        directory=ctx.options.library_dir,
        embedder=ctx.options.embedder.value,
        actor_id=ctx.actor_id,
        version=ctx.options.version,
        **more,
    )


ACTOR_KINDS: dict[ActorKind, ActorKindEntry] = {
    ActorKind.EVALUATOR: ActorKindEntry(_evaluator),
    ActorKind.DIAGNOSER: ActorKindEntry(_diagnoser),
    ActorKind.EXPERT: ActorKindEntry(_expert, needs_run=False),
    ActorKind.ISLAND: ActorKindEntry(_island),
    ActorKind.MIGRATOR: ActorKindEntry(_migrator),
    ActorKind.CURATOR: ActorKindEntry(_curator, needs_run=False),
}
"""Every kind a process can start on its own (the controller is ``kfoundry run`` itself)."""


def actor_kind_entry(kind: ActorKind, registry: dict[ActorKind, ActorKindEntry] = ACTOR_KINDS) -> ActorKindEntry:
    """The registered entry of ``kind``; a clear error for a kind nobody registered."""
    entry = registry.get(kind)
    if entry is None:
        known = ", ".join(k.value for k in registry)
        raise ConfigError(f"actor kind {kind} cannot be started on its own (kinds: {known})")
    return entry
