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
import asyncio
import faulthandler
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.commands.actor import add_actor_options
from actors.commands.controller import RunController
from actors.runtime.errors import ConfigError, RunIdTaken, TaskRefused, refusal_in
from actors.runtime.options import ALL_EXPERTS, RunOptions
from actors.runtime.process import add_nats_options, exit_promptly, nats_url, process_started_at, run_async, say
from gpu_runner.config import add_precision_option
from schemas import (
    Ablations,
    Budget,
    DeviceChoice,
    ExpertRef,
    KernelLanguage,
    MigrationPolicy,
    MigrationReason,
    PrecisionMode,
    RunSpec,
    Task,
    TorchOpsPolicy,
)
from schemas.task import missing_reference_names, parse_module

if TYPE_CHECKING:
    from actors.runtime.gpu_claim import GpuClaim
    from actors.runtime.gpus import Gpu


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kfoundry run`` and its options."""
    p = sub.add_parser("run", help="run the whole loop on a KernelBench-format task")
    add_run_arguments(p)
    add_actor_options(p)
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a TOML file of run options (`seconds = 900`, `no-migration = true`); flags given here win",
    )
    p.set_defaults(func=cmd_run, run_parser=p)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", type=Path, help="KernelBench-format reference (class Model, get_inputs, get_init_inputs)")
    p.add_argument("--islands", type=int, default=2, help="number of islands (default 2)")
    p.add_argument(
        "--inflight",
        type=int,
        default=None,
        help="candidates each island keeps in flight (default 2, more with several GPUs: enough to keep each busy)",
    )
    p.add_argument("--candidates", type=int, default=None, help="budget: candidates evaluated (default 16 cpu / 200)")
    p.add_argument("--seconds", type=float, default=None, help="budget: wall-clock seconds (default 600 / 1800)")
    p.add_argument("--tokens", type=int, default=None, help="budget: LLM tokens")
    p.add_argument(
        "--experts",
        nargs="?",
        const=ALL_EXPERTS,
        default=None,
        help="comma-separated expert names (default: template); with no value: the template expert plus every "
        "configured LLM expert (`kfoundry expert set`)",
    )
    p.add_argument("--language", choices=["triton", "cuda"], default="triton")
    p.add_argument("--migration", choices=["ring", "random"], default="ring")
    p.add_argument("--migration-interval", type=float, default=10.0, help="seconds between migrations")
    p.add_argument("--target-sol", type=float, default=0.9, help="stop at this fraction of speed-of-light")
    p.add_argument("--eval-timeout", type=float, default=180.0, help="bound on one candidate's evaluation")
    p.add_argument(
        "--evaluators",
        type=int,
        default=None,
        help="evaluator actors in this process on the CPU (default 1); on GPUs there is one per GPU (--gpus)",
    )
    p.add_argument(
        "--gpus",
        default=None,
        metavar="all|N|I,J",
        help="GPUs to evaluate on, one evaluator each: all (default: every visible GPU), the first N, or the "
        "listed indices (one alone: 3,)",
    )
    p.add_argument(
        "--torch-ops",
        choices=[p.value for p in TorchOpsPolicy],
        default=TorchOpsPolicy.FORBID.value,
        help="forbid (default): every op is a kernel; reference: a candidate may leave the reference's own ops "
        "to PyTorch (the report lists them)",
    )
    add_precision_option(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", default=None, help="run id (default: random)")
    p.add_argument("--run-dir", type=Path, default=None, help="where to write results (default runs/<run-id>)")
    p.add_argument("--seed-candidate", type=Path, action="append", default=[], help="a starting ModelNew file")
    ablate = p.add_argument_group("ablations", "turn one mechanism off, to measure what it earns (bench/ablation.py)")
    ablate.add_argument("--no-experience", action="store_true", help="islands retrieve no experiences")
    ablate.add_argument(
        "--uniform-experts", action="store_true", help="choose experts uniformly: no diagnosis routing, no credit"
    )
    ablate.add_argument("--no-migration", action="store_true", help="no elites move between islands")
    ablate.add_argument("--no-meta-prompt", action="store_true", help="LLM experts get no evolved meta-prompt")
    p.add_argument("--no-local-actors", action="store_true", help="start no actors here: only control the run")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics of this process's actors on this port (as `kfoundry actor` does)",
    )
    add_nats_options(p)


def check_task_source(path: Path) -> str:
    """Read a task file and check it is in KernelBench format, naming what is missing."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a task file (give the .py file of one task)")
    if not path.is_file():
        raise ConfigError(f"task file not found: {path}")
    source = path.read_text()
    try:
        tree = parse_module(source, str(path))
    except SyntaxError as exc:
        raise ConfigError(f"{path}: not valid Python: {exc}") from exc
    missing = missing_reference_names(tree)
    if missing:
        raise ConfigError(f"{path}: not a KernelBench-format task, missing {', '.join(missing)}")
    return source


def build_spec(
    args: argparse.Namespace,
    source: str,
    device: DeviceChoice,
    *,
    evaluators: int = 1,
    started_at: float | None = None,
) -> RunSpec:
    """The run's spec from the command line, with defaults suited to the device and to the number
    of local evaluators (each island keeps enough in flight to keep every GPU busy). ``started_at``:
    when the run's clock started (``kfoundry run``: its process's start); default now."""
    on_cpu = device is DeviceChoice.CPU
    named = args.experts if args.experts and args.experts != ALL_EXPERTS else None
    experts = [e.strip() for e in named.split(",")] if named else ["template"]
    for flag, value in (("--seconds", args.seconds), ("--candidates", args.candidates), ("--tokens", args.tokens)):
        if value is not None and value <= 0:  # 0 was taken as "the default" before
            raise ConfigError(f"{flag} must be > 0, got {value:g}")
    budget = Budget(
        wall_s=args.seconds if args.seconds is not None else (600.0 if on_cpu else 1800.0),
        candidates=args.candidates if args.candidates is not None else (16 if on_cpu else 200),
        tokens=args.tokens,
    )
    kwargs: dict[str, Any] = {"run_id": args.run_id} if args.run_id else {}
    if started_at is not None:
        kwargs["created_at"] = started_at
    from actors.runtime.gpus import compile_workers_per_gpu, evaluator_sizing

    eval_concurrency = (
        getattr(args, "eval_concurrency", None)
        or evaluator_sizing(device is DeviceChoice.CUDA, compile_workers_per_gpu(evaluators))[0]
    )
    return RunSpec(
        task=Task.from_source(args.task.stem, source),
        islands=args.islands,
        inflight_per_island=args.inflight or default_inflight(args.islands, evaluators, eval_concurrency),
        budget=budget,
        device=device,
        language=KernelLanguage(args.language),
        experts=tuple(ExpertRef(name=e) for e in experts),
        migration=MigrationPolicy(topology=MigrationReason(args.migration), interval_s=args.migration_interval),
        ablations=Ablations(
            no_experience=getattr(args, "no_experience", False),
            uniform_experts=getattr(args, "uniform_experts", False),
            no_migration=getattr(args, "no_migration", False),
            no_meta_prompt=getattr(args, "no_meta_prompt", False),
        ),
        target_sol_fraction=args.target_sol,
        eval_timeout_s=args.eval_timeout,
        torch_ops=TorchOpsPolicy(args.torch_ops),
        precision=PrecisionMode(args.precision),
        seed=args.seed,
        **kwargs,
    )


def require_cuda(device: DeviceChoice, local: bool, gpus_listed: bool = False) -> None:
    """``--device cuda`` where this process's evaluators would run (``local``) and torch sees no
    CUDA device: one line (it was a 59-line traceback from the evaluator, exit status 1).

    Where ``nvidia-smi`` listed GPUs (``gpus_listed``) and the installed torch is a CUDA build, that
    is taken as enough without importing torch here: the import (4.7 s on an H200 host) held up
    everything after it, the evaluator's start included; the evaluator's own workers then find
    the device, or say why not."""
    if device is not DeviceChoice.CUDA or not local:
        return
    if gpus_listed and torch_cuda_build() is True:
        return
    import torch

    if not torch.cuda.is_available():
        why = "a CPU-only torch build" if torch.version.cuda is None else "no GPU or driver it can use"
        raise ConfigError(f"--device cuda: torch here sees no CUDA device ({why}); use --device cpu or auto")


def torch_cuda_build() -> bool | None:
    """Whether the installed torch is built for CUDA, read from its ``version.py`` without importing
    it (``None``: not found or not readable)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\b[^=]*=\s*(.+)$", text, re.MULTILINE)
    if found is None:
        return None
    return found.group(1).strip() not in ("None", "")


def resolve_device(choice: str) -> DeviceChoice:
    """``auto`` becomes ``cuda`` when torch sees a GPU, else ``cpu``."""
    if choice != "auto":
        return DeviceChoice(choice)
    import torch

    return DeviceChoice.CUDA if torch.cuda.is_available() else DeviceChoice.CPU


def run_gpus(args: argparse.Namespace, device: DeviceChoice) -> list[Gpu]:
    """The GPUs the run's local evaluators use, one evaluator each.

    On the CPU, with no local actors, or with the noop runner: none (``--evaluators`` evaluators,
    not pinned). On CUDA: ``--gpus`` (default all visible); where ``nvidia-smi`` lists no GPU
    although torch sees one, one evaluator as before, not pinned, unless ``--gpus`` was given."""
    from actors.runtime.gpus import list_gpus, parse_selection, select_gpus

    chosen: str | None = args.gpus
    if chosen is not None and args.device == DeviceChoice.CPU.value:
        raise ConfigError(f"--gpus {chosen} and --device cpu: the CPU evaluates alone; drop one")
    selection = parse_selection(chosen) if chosen is not None else None
    if args.evaluators is not None and args.evaluators < 1:
        raise ConfigError(f"--evaluators must be >= 1, got {args.evaluators}")
    if args.no_local_actors or args.runner != "gpu" or (device is DeviceChoice.CPU and selection is None):
        return []
    visible = list_gpus()
    if device is DeviceChoice.CPU and visible:  # --device auto chose the CPU: torch cannot use the GPUs
        raise ConfigError(
            f"--gpus {chosen}: nvidia-smi lists {len(visible)} GPU(s) but torch here sees no CUDA device "
            "(a CPU-only torch build, or a driver it cannot use)"
        )
    if selection is None and not visible:
        return []
    if args.evaluators is not None:
        raise ConfigError(
            f"--evaluators {args.evaluators}: on GPUs there is one evaluator per GPU; choose them with --gpus"
        )
    return select_gpus(selection or parse_selection("all"), visible)


def claim_all(gpus: list[Gpu], run_id: str) -> list[GpuClaim]:
    """Claim every GPU of ``gpus`` for this run (all or none: a taken one is a one-line error)."""
    from actors.runtime.gpu_claim import claim_gpu

    claims: list[GpuClaim] = []
    try:
        for gpu in gpus:
            claims.append(claim_gpu(gpu, run_id=run_id))
    except BaseException:
        for claim in claims:
            claim.release()
        raise
    return claims


def default_inflight(islands: int, evaluators: int, concurrency: int = 2) -> int:
    """Candidates each island keeps in flight by default: twice what the evaluators judge at once
    (compiles then overlap runs), shared by the islands; 2 at least (one evaluator, two islands: 2)."""
    return max(2, -(-2 * evaluators * concurrency // max(1, islands)))


def cmd_run(args: argparse.Namespace) -> int:
    options = RunOptions.from_args(args)
    source = check_task_source(args.task)
    device = resolve_device(args.device)
    gpus = run_gpus(args, device)
    # The wall budget counts from this process's start, as its user timed it: the imports and the
    # NATS server's start before the spec (1-8 s on a 2-core host) were outside it before.
    spec = build_spec(args, source, device, evaluators=len(gpus) or 1, started_at=process_started_at())
    run_dir = args.run_dir or Path("runs") / spec.run_id
    if (run_dir / "report.json").exists():  # another run's results: never written over
        raise ConfigError(f"{run_dir} holds the results of an earlier run (report.json); choose another --run-dir")
    claims = claim_all(gpus, spec.run_id)
    try:  # what can still refuse the run before it starts: the claims go back with a one-line error
        require_cuda(device, local=not args.no_local_actors and args.runner == "gpu", gpus_listed=bool(gpus))
        if args.metrics_port is not None:  # bound before anything starts: a taken port is one line at once
            from actors.runtime.metrics import start_metrics_server

            start_metrics_server(args.metrics_port)
    except ConfigError:
        for claim in claims:
            claim.release()
        raise
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)

    from actors.runtime.logs import configure_logging

    configure_logging(level=args.log_level, stream=open(run_dir / "run.log", "a"))  # noqa: SIM115
    # SIGUSR1 prints every thread's stack to stderr: how a stuck run is diagnosed (kfoundry bench
    # sends it before stopping a run that overran its budget).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    seeds = [p.read_text() for p in args.seed_candidate]

    async def main(stop: asyncio.Event, url: str) -> int:
        controller = RunController(
            spec=spec,
            url=url,
            run_dir=run_dir,
            options=options,
            seeds=seeds,
            progress=None if args.quiet else sys.stderr,
            gpu_claims=claims,
        )
        try:
            outcome = await controller.run(stop)
        except BaseExceptionGroup as group:  # a local actor refused the task: one line, exit 3 (2: the task's fault)
            refused = refusal_in(group)
            if refused is None:
                raise
            raise refused from None
        sys.stdout.write(outcome.summary(time.time() - spec.created_at) + "\n")
        from actors.report import isolation_warning

        warning = isolation_warning(run_dir / "report.json")
        if warning is not None:
            sys.stdout.write(warning + "\n")
        return outcome.exit_code

    # The embedded server is released once the event loop is gone: a run that failed (a task
    # that does not work, say) leaves its actors' connections to be closed while the loop winds
    # down, and a release inside the loop, which waits without yielding, found them still open
    # and left the server running.
    def refused_at_once(exc: BaseException) -> int | None:
        """A refused task's line is said as soon as the run knows it, not after the event loop's
        teardown (which then cannot hold the exit: :func:`run_async`)."""
        if not isinstance(exc, TaskRefused):
            return None
        say(f"kfoundry: {exc}", sys.stderr)
        exc.said = True
        return exc.exit_code

    try:
        with nats_url(args.nats) as url:
            code = run_async(lambda stop: main(stop, url), on_error=refused_at_once)
    except BaseException as exc:
        if created and _is_run_id_taken(exc):  # nothing of this run was written but its log's first lines
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if getattr(args, "own_process", False):  # `kfoundry run` itself, not `main([...])` called in a process
        # The results are written, the summary said and the server released: the interpreter's own
        # teardown (1.6 s on a 2-core host, torch and the MiniLM model loaded) would only hold the exit.
        exit_promptly(code)
    return code


def _is_run_id_taken(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_run_id_taken(inner) for inner in exc.exceptions)
    return isinstance(exc, RunIdTaken)
