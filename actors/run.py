"""``kfoundry run``: the run controller.

It reads the task, starts (or joins) NATS, creates the run's stream and registers its
``RunSpec``, launches the actors of the run in this process (islands, experts, evaluators, a
diagnoser, a migrator, a curator), shows progress, enforces the run's budget, and at the end
writes the run directory: ``best_model.py`` (a standalone ``ModelNew``), ``report.json`` and
plots, and ``run.log`` (the JSON log of every actor of this process).

Actors started elsewhere with ``kfoundry actor KIND --run RUN`` join the same run; all of them
leave when the controller publishes ``RunEnd`` on ``kf.<run>.end``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import sys
import time
from pathlib import Path

from actors.errors import ConfigError
from schemas import (
    Budget,
    DeviceChoice,
    ExpertRef,
    KernelLanguage,
    MigrationPolicy,
    MigrationReason,
    RunSpec,
    Task,
    TorchOpsPolicy,
)
from schemas.task import missing_reference_names


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    from actors.cli import _add_nats

    p.add_argument("task", type=Path, help="KernelBench-format reference (class Model, get_inputs, get_init_inputs)")
    p.add_argument("--islands", type=int, default=2, help="number of islands (default 2)")
    p.add_argument("--inflight", type=int, default=2, help="candidates each island keeps in flight (default 2)")
    p.add_argument("--candidates", type=int, default=None, help="budget: candidates evaluated (default 16 cpu / 200)")
    p.add_argument("--seconds", type=float, default=None, help="budget: wall-clock seconds (default 600 / 1800)")
    p.add_argument("--tokens", type=int, default=None, help="budget: LLM tokens")
    p.add_argument("--experts", default=None, help="comma-separated expert names (default: template plus any LLM)")
    p.add_argument("--language", choices=["triton", "cuda"], default="triton")
    p.add_argument("--migration", choices=["ring", "random"], default="ring")
    p.add_argument("--migration-interval", type=float, default=10.0, help="seconds between migrations")
    p.add_argument("--target-sol", type=float, default=0.9, help="stop at this fraction of speed-of-light")
    p.add_argument("--eval-timeout", type=float, default=180.0, help="bound on one candidate's evaluation")
    p.add_argument(
        "--torch-ops",
        choices=[p.value for p in TorchOpsPolicy],
        default=TorchOpsPolicy.FORBID.value,
        help="forbid (default): every op is a kernel; reference: a candidate may leave the reference's own ops "
        "to PyTorch (the report lists them)",
    )
    p.add_argument("--evaluators", type=int, default=1, help="evaluator actors in this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", default=None, help="run id (default: random)")
    p.add_argument("--run-dir", type=Path, default=None, help="where to write results (default runs/<run-id>)")
    p.add_argument("--seed-candidate", type=Path, action="append", default=[], help="a starting ModelNew file")
    p.add_argument("--no-local-actors", action="store_true", help="start no actors here: only control the run")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--log-level", default="info")
    _add_nats(p)


def check_task_source(path: Path) -> str:
    """Read a task file and check it is in KernelBench format, naming what is missing."""
    if not path.is_file():
        raise ConfigError(f"task file not found: {path}")
    source = path.read_text()
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"{path}: not valid Python: {exc}") from exc
    missing = missing_reference_names(tree)
    if missing:
        raise ConfigError(f"{path}: not a KernelBench-format task, missing {', '.join(missing)}")
    return source


def build_spec(args: argparse.Namespace, source: str, device: DeviceChoice) -> RunSpec:
    """The run's spec from the command line, with defaults suited to the device."""
    on_cpu = device is DeviceChoice.CPU
    experts = [e.strip() for e in args.experts.split(",")] if args.experts else ["template"]
    budget = Budget(
        wall_s=args.seconds or (600.0 if on_cpu else 1800.0),
        candidates=args.candidates or (16 if on_cpu else 200),
        tokens=args.tokens,
    )
    kwargs = {"run_id": args.run_id} if args.run_id else {}
    return RunSpec(
        task=Task.from_source(args.task.stem, source),
        islands=args.islands,
        inflight_per_island=args.inflight,
        budget=budget,
        device=device,
        language=KernelLanguage(args.language),
        experts=tuple(ExpertRef(name=e) for e in experts),
        migration=MigrationPolicy(topology=MigrationReason(args.migration), interval_s=args.migration_interval),
        target_sol_fraction=args.target_sol,
        eval_timeout_s=args.eval_timeout,
        torch_ops=TorchOpsPolicy(args.torch_ops),
        seed=args.seed,
        **kwargs,
    )


def resolve_device(choice: str) -> DeviceChoice:
    """``auto`` becomes ``cuda`` when torch sees a GPU, else ``cpu``."""
    if choice != "auto":
        return DeviceChoice(choice)
    import torch

    return DeviceChoice.CUDA if torch.cuda.is_available() else DeviceChoice.CPU


def cmd_run(args: argparse.Namespace) -> int:
    from actors.cli import nats_url, run_async
    from actors.controller import RunController, refusal_in

    source = check_task_source(args.task)
    device = resolve_device(args.device)
    spec = build_spec(args, source, device)
    run_dir = args.run_dir or Path("runs") / spec.run_id
    run_dir.mkdir(parents=True, exist_ok=True)

    from actors.logs import configure_logging

    configure_logging(level=args.log_level, stream=open(run_dir / "run.log", "a"))  # noqa: SIM115
    seeds = [p.read_text() for p in args.seed_candidate]

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            controller = RunController(
                spec=spec, url=url, run_dir=run_dir, args=args, seeds=seeds, progress=None if args.quiet else sys.stderr
            )
            started = time.time()
            try:
                outcome = await controller.run(stop)
            except BaseExceptionGroup as group:  # a local actor refused the task: one line, exit 3
                refused = refusal_in(group)
                if refused is None:
                    raise
                raise refused from None
            sys.stdout.write(outcome.summary(time.time() - started) + "\n")
            return 0 if outcome.best_fitness is not None else 1

    return run_async(main)
