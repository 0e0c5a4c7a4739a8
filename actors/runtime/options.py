"""The typed options of the actors a process starts and of the run it controls (no argparse below
the commands: ``build_actor`` and ``RunController`` take these).

``ActorOptions`` holds what ``kfoundry actor`` and ``kfoundry run`` say about the actors they
build; ``RunOptions`` adds what only the run controller reads. Both are validated when made and
name the bad value; ``from_args`` is the one place a command's ``argparse.Namespace`` becomes them.
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.runtime.errors import ConfigError
from gpu_runner.config import IsolationMode
from schemas import DeviceChoice

ALL_EXPERTS = "+llm"
"""``--experts`` given with no value: the template expert plus every configured LLM expert (the
controller adds those from the ``kf_experts`` bucket when it registers the run)."""


class RunnerKind(enum.StrEnum):
    """What an evaluator judges candidates with."""

    GPU = "gpu"
    """``gpu_runner``: the honest, sandboxed evaluation (on a GPU, or on the CPU when told)."""
    NOOP = "noop"
    """Nothing is evaluated: for measuring the fabric (benchmarks, bus tests)."""


class EmbedderKind(enum.StrEnum):
    """How the curator embeds experiences."""

    MINILM = "minilm"
    HASHING = "hashing"


@dataclass(frozen=True)
class ActorOptions:
    """How this process configures the actors it builds (``actors.commands.launch.build_actor``)."""

    device: DeviceChoice = DeviceChoice.AUTO
    """Evaluators: where candidates run."""
    runner: RunnerKind = RunnerKind.GPU
    """Evaluators: what judges candidates."""
    noop_delay_s: float = 0.0
    """Evaluators with the no-op runner: seconds one evaluation takes."""
    eval_concurrency: int | None = None
    """Evaluators: candidates judged at once (``None``: ``concurrency``, else
    :func:`actors.runtime.gpus.evaluator_sizing`)."""
    eval_timeout_s: float | None = None
    """Evaluators: the runner's bound on one evaluation where the run's spec gives none (``None``:
    the runner's default). ``kfoundry run`` sets it to the run's ``--eval-timeout``."""
    ack_wait_s: float = 30.0
    """Evaluators: seconds before an unacknowledged candidate is redelivered."""
    spares: int | None = None
    """Evaluators: pre-warmed run processes (``None``: :func:`actors.runtime.gpus.evaluator_sizing`)."""
    host_memory_share: float | None = None
    """Evaluators: share of the host's available memory their memory plans may use, split between
    the evaluators of this process's GPUs (``None``: all of it)."""
    isolation: IsolationMode | None = None
    """Evaluators: the sandbox policy (``None``: :func:`isolation_mode` decides)."""
    llm_diagnoser: str | None = None
    """Diagnosers: the stored expert configuration whose LLM refines diagnoses."""
    per_request: int = 1
    """Islands: candidates asked of an expert at once."""
    library_dir: Path | None = None
    """Curators: the snapshot folder (``None``: under ``KFOUNDRY_HOME``)."""
    embedder: EmbedderKind = EmbedderKind.MINILM
    """Curators: how experiences are embedded."""
    version: str | None = None
    """Every kind: the semantic version announced (for hot swaps); ``None``: the kind's own."""
    concurrency: int | None = None
    """Every kind that handles messages side by side: how many at once (``None``: the kind's default)."""
    expert_name: str = "template"
    """Experts started by hand: the expert served."""
    wait_for_run_s: float | None = None
    """Actors started by hand: how long to wait for the run to be registered (``None``: the default)."""
    log_level: str = "info"
    """Logging level of the process (and of an evaluator started as its own process)."""
    run_experts: tuple[str, ...] | None = None
    """The run's expert names when this process hosts the run (``kfoundry run``); ``None`` for an
    actor started by hand, which does not know them."""

    def __post_init__(self) -> None:
        checks = {
            "--noop-delay": (self.noop_delay_s, self.noop_delay_s >= 0),
            "--eval-concurrency": (self.eval_concurrency, self.eval_concurrency is None or self.eval_concurrency >= 1),
            "--eval-timeout": (self.eval_timeout_s, self.eval_timeout_s is None or self.eval_timeout_s > 0),
            "--ack-wait": (self.ack_wait_s, self.ack_wait_s > 0),
            "--spares": (self.spares, self.spares is None or self.spares >= 0),
            "--host-memory-share": (
                self.host_memory_share,
                self.host_memory_share is None or 0 < self.host_memory_share <= 1,
            ),
            "--per-request": (self.per_request, self.per_request >= 1),
            "--concurrency": (self.concurrency, self.concurrency is None or self.concurrency >= 1),
            "--wait-for-run": (self.wait_for_run_s, self.wait_for_run_s is None or self.wait_for_run_s >= 0),
        }
        for option, (value, ok) in checks.items():
            if not ok:
                raise ConfigError(f"{option} {value}: out of range")

    @property
    def hosts_the_run(self) -> bool:
        """Whether this process hosts the whole run (``kfoundry run``), not one hand-started actor."""
        return self.run_experts is not None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ActorOptions:
        """The options of ``kfoundry actor`` or ``kfoundry run`` (absent ones keep their defaults)."""

        def get(name: str, default: Any = None) -> Any:
            return getattr(args, name, default)

        run_experts = None
        if get("command") == "run":
            named = get("experts") or "template"
            run_experts = tuple(e.strip() for e in str(named).split(",") if e.strip())
        isolation = get("isolation")
        library_dir = get("library_dir")
        return cls(
            device=DeviceChoice(get("device", DeviceChoice.AUTO.value)),
            runner=RunnerKind(get("runner", RunnerKind.GPU.value)),
            noop_delay_s=float(get("noop_delay", 0.0)),
            eval_concurrency=get("eval_concurrency"),
            eval_timeout_s=get("eval_timeout"),
            ack_wait_s=float(get("ack_wait", 30.0)),
            spares=None if get("spares") is None else int(get("spares")),
            host_memory_share=None if get("host_memory_share") is None else float(get("host_memory_share")),
            isolation=None if isolation is None else IsolationMode(isolation),
            llm_diagnoser=get("llm_diagnoser"),
            per_request=int(get("per_request", 1)),
            library_dir=None if library_dir is None else Path(str(library_dir)),
            embedder=EmbedderKind(get("embedder", EmbedderKind.MINILM.value)),
            version=get("version"),
            concurrency=get("concurrency"),
            expert_name=str(get("name", "template")),
            wait_for_run_s=get("wait_for_run"),
            log_level=str(get("log_level", "info")),
            run_experts=run_experts,
        )


def isolation_mode(options: ActorOptions) -> IsolationMode:
    """``--isolation``, or its default: strict when candidates may come from an LLM (any expert that
    is not a template, an LLM diagnoser, or an evaluator joining a run from outside), else best-effort."""
    if options.isolation is not None:
        return options.isolation
    if options.run_experts is None:
        return IsolationMode.STRICT  # the run's experts are not known here
    llm = any(not n.startswith("template") for n in options.run_experts) or options.llm_diagnoser is not None
    return IsolationMode.STRICT if llm else IsolationMode.BEST_EFFORT


@dataclass(frozen=True)
class RunOptions:
    """What ``kfoundry run`` tells its controller beyond the ``RunSpec``."""

    actors: ActorOptions = field(default_factory=ActorOptions)
    """How the run's local actors are configured."""
    evaluators: int | None = None
    """Local evaluators on the CPU (``None``: 1); on GPUs there is one per claimed GPU."""
    local_actors: bool = True
    """Whether this process starts the run's actors (``--no-local-actors``: it only controls)."""
    all_llm_experts: bool = False
    """``--experts`` with no value: every configured LLM expert joins the run."""
    connect_timeout_s: float | None = 5.0
    """Give up on an unreachable NATS server after this long (``None``: keep trying)."""
    metrics_port: int | None = None
    """``--metrics-port``: the local actors' Prometheus ``/metrics`` is served there."""

    def __post_init__(self) -> None:
        if self.evaluators is not None and self.evaluators < 1:
            raise ConfigError(f"--evaluators must be >= 1, got {self.evaluators}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """The options of ``kfoundry run``."""
        return cls(
            actors=ActorOptions.from_args(args),
            evaluators=getattr(args, "evaluators", None),
            local_actors=not getattr(args, "no_local_actors", False),
            all_llm_experts=getattr(args, "experts", None) == ALL_EXPERTS,
            connect_timeout_s=getattr(args, "connect_timeout", 5.0),
            metrics_port=getattr(args, "metrics_port", None),
        )
