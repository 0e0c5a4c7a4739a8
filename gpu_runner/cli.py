"""``kfoundry eval`` / ``python -m gpu_runner``: one honest evaluation from the command line.

``REFERENCE.py CANDIDATE.py [--device cpu|cuda|auto] [--timeout SECONDS] [--isolation strict|best-effort]
[--profile-counters] [--json]``. With
``--json`` stdout carries exactly one JSON object (the :class:`schemas.EvalResult`); logs go to
stderr. Exit status 0 whenever an evaluation completed, whatever its verdict; 2 for bad
arguments, unreadable files, a device that is not there or a task that does not work; 3 when the
task is refused on this machine (too large, or ``--isolation strict`` without a layer), as
``kfoundry run`` says them; 1 when the evaluator itself could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import structlog

from gpu_runner.config import EvalJob, IsolationMode, RunnerConfig, add_precision_option
from gpu_runner.counters_step import with_counters
from gpu_runner.errors import DeviceUnavailable, InvalidReference, IsolationUnavailable, RunnerError, TaskTooLarge
from gpu_runner.probe import validate_reference
from gpu_runner.service import EvaluationService
from schemas import CheckOutcome, DeviceChoice, EvalResult, KernelLanguage, TorchOpsPolicy


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kfoundry eval", description="Evaluate a candidate kernel (ModelNew) against a KernelBench reference."
    )
    parser.add_argument("reference", type=Path, help="reference file: Model, get_inputs, get_init_inputs")
    parser.add_argument("candidate", type=Path, help="candidate file: ModelNew with Triton or CUDA/C++ kernels")
    parser.add_argument("--device", choices=[d.value for d in DeviceChoice], default="auto")
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="the candidate's own time in seconds: its compile, import, trials and timing (the evaluator's "
        "start-up, the reference's preparation and queueing never count)",
    )
    parser.add_argument(
        "--isolation",
        choices=[m.value for m in IsolationMode],
        default=IsolationMode.BEST_EFFORT.value,
        help="strict: refuse to run the candidate unless every confinement layer holds here; "
        "best-effort (default): run it with the layers that hold (the result names them)",
    )
    parser.add_argument(
        "--torch-ops",
        choices=[p.value for p in TorchOpsPolicy],
        default=TorchOpsPolicy.FORBID.value,
        help="forbid (default): every compute op must be the candidate's kernel; reference: the reference's own "
        "ops may stay in PyTorch",
    )
    add_precision_option(parser)
    parser.add_argument(
        "--profile-counters",
        action="store_true",
        help="on a GPU with Nsight Compute (ncu) on PATH, profile a correct candidate short of speed-of-light "
        "(DRAM and SM throughput, occupancy, warp stalls) in the worker's confinement; slow (seconds to minutes)",
    )
    parser.add_argument(
        "--held-out-shapes",
        type=int,
        default=3,
        metavar="N",
        help="also call the candidate at up to N other input shapes the reference accepts, drawn from the task's "
        "module-level sizes or its DYNAMIC_DIMS (default 3; 0: none); wrong outputs at one make it incorrect",
    )
    parser.add_argument("--json", action="store_true", help="print the EvalResult as one JSON object")
    parser.add_argument("--verbose", action="store_true", help="log progress to stderr")
    return parser


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written (not the stream of the first call)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _configure_logging(verbose: bool) -> None:
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        cache_logger_on_first_use=False,
    )


def _language(source: str) -> KernelLanguage:
    return KernelLanguage.CUDA if "load_inline" in source else KernelLanguage.TRITON


async def _evaluate(
    reference: str,
    candidate: str,
    device: str,
    timeout: float,
    isolation: str,
    torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID,
    profile_counters: bool = False,
    precision: str = "reference",
    held_out_shapes: int = 3,
) -> EvalResult:
    validate_reference(reference)
    config = RunnerConfig(
        device=DeviceChoice(device),
        spares=1,
        compile_workers=2,
        timing_budget_s=3.0,
        isolation=IsolationMode(isolation),
        held_out_shapes=held_out_shapes,
    )
    service = EvaluationService(config)
    try:
        await service.start()
        await service.prepare(reference)
        job = EvalJob(
            reference_source=reference,
            candidate_source=candidate,
            language=_language(candidate),
            timeout_s=timeout,
            task_id=service.task_id(reference),
            candidate_id="cli",
            torch_ops=torch_ops,
            precision=precision,
        )
        result = await service.evaluate(job)
        if profile_counters:
            result = await with_counters(result, reference, candidate, service.iso)
        return result
    finally:
        await service.aclose()


def summary_text(result: EvalResult) -> str:
    """A readable account of a result."""
    lines = [f"{result.status.value.upper()}: {result.summary}"]
    if result.device is not None:
        d = result.device
        lines.append(
            f"device: {d.kind.value} {d.name} (torch {d.torch}, triton {d.triton}"
            f"{', interpreter' if d.triton_interpreter else ''})"
        )
    if result.correctness is not None:
        c = result.correctness
        lines.append(
            f"correctness: {c.passed_trials}/{c.trials} trials, atol={c.atol:g} rtol={c.rtol:g}, "
            f"max abs err {c.max_abs_err}, err vs fp64 {c.err_vs_fp64} (eager {c.ref_err_vs_fp64})"
        )
        for shape in c.held_out:
            lines.append(
                f"held-out shape {shape.shape}: {shape.outcome}"
                + (f" ({shape.detail})" if shape.detail else "")
                + (f", {speed}" if (speed := shape.speed_text()) else "")
            )
        if not c.held_out and c.held_out_note:
            lines.append(f"held-out shapes: {c.held_out_note}")
    if result.timing is not None:
        t = result.timing
        lines.append(
            f"candidate: median {t.median_ms:.4f} ms (p10 {t.p10_ms:.4f}, p90 {t.p90_ms:.4f}, "
            f"{t.reps} reps, median known to {_pct(t.median_rel_stderr)}, {t.timer.value})"
        )
    if result.baselines is not None:
        for name, stats in (("eager", result.baselines.eager), ("torch.compile", result.baselines.compiled)):
            if stats is not None:
                earlier = f", {stats.earlier_reps} in earlier sessions of the task" if stats.earlier_reps else ""
                lines.append(f"{name}: median {stats.median_ms:.4f} ms ({stats.reps} reps{earlier})")
    if result.speedup_vs_eager is not None:
        lines.append(
            f"speedup vs eager {result.speedup_vs_eager:.3f}x"
            + (f", vs torch.compile {result.speedup_vs_compiled:.3f}x" if result.speedup_vs_compiled else "")
        )
    if result.sol is not None and result.sol.fraction is not None:
        lines.append(
            f"speed of light: {result.sol.bound_ms:.4f} ms ({result.sol.limiter}), {result.sol.fraction:.1%} reached"
        )
    lines.extend(_time_lines(result))
    for f in result.findings:
        where = f" line {f.line}" if f.line else ""
        lines.append(f"finding {f.rule.value} [{f.severity.value}]{where}: {f.message}")
    for chk in result.checks:
        if chk.outcome is not CheckOutcome.PASSED:
            lines.append(f"check {chk.name}: {chk.outcome.value}" + (f" ({chk.detail})" if chk.detail else ""))
    if result.torch_ops:
        lines.append(f"left to PyTorch (the reference's own ops): {', '.join(result.torch_ops)}")
    lines.extend(f"review: {r}" for r in result.review)
    return "\n".join(lines) + "\n"


def _time_lines(result: EvalResult, top: int = 5) -> list[str]:
    """Where the reference's time goes (its ops by family and the largest, from the referee) and
    the candidate's (its own kernels, timed in its process)."""
    lines: list[str] = []
    ref = result.baselines.profile if result.baselines is not None else None
    if ref is not None and ref.families:
        shares = ", ".join(f"{f.family.value} {f.share:.0%}" for f in ref.families[:top])
        lines.append(f"reference's time by family: {shares} ({ref.timer}, {ref.ops_us:.0f} us of ops per forward)")
        ops = ", ".join(f"{o.op.split('::')[-1]} in {o.module or 'forward'} {o.share:.0%}" for o in ref.ops[:top])
        lines.append(f"reference's largest ops: {ops}")
    kernels = result.profile.kernel_times if result.profile is not None else ()
    if kernels:
        total = sum(k.time_us for k in kernels) or 1.0
        listed = ", ".join(
            f"{k.name} x{k.launches} {k.time_us:.0f} us ({k.time_us / total:.0%})" for k in kernels[:top]
        )
        timer = result.profile.kernel_timer if result.profile is not None else None
        lines.append(f"candidate's kernels: {listed} ({timer})")
    return lines


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.2%}"


def main(argv: list[str] | None = None) -> int:
    """Run one evaluation; see the module docstring for the exit status."""
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    if not args.timeout > 0:
        sys.stderr.write("kfoundry eval: error: --timeout must be a positive number of seconds\n")
        return 2
    if args.held_out_shapes < 0:
        sys.stderr.write(f"kfoundry eval: error: --held-out-shapes must be >= 0, got {args.held_out_shapes}\n")
        return 2
    sources = []
    for path in (args.reference, args.candidate):
        if path.is_dir():  # as `kfoundry run` names it
            sys.stderr.write(
                f"kfoundry eval: error: {path} is a directory, not a task file (give the .py file of one task)\n"
            )
            return 2
        try:
            sources.append(path.read_text())
        except OSError as exc:
            sys.stderr.write(f"kfoundry eval: error: cannot read {path}: {exc.strerror or exc}\n")
            return 2
    try:
        result = asyncio.run(
            _evaluate(
                sources[0],
                sources[1],
                args.device,
                args.timeout,
                args.isolation,
                TorchOpsPolicy(args.torch_ops),
                args.profile_counters,
                args.precision,
                args.held_out_shapes,
            )
        )
    except InvalidReference as exc:  # the task's own fault: one line (the traceback with --verbose), as `run` says it
        sys.stderr.write(f"kfoundry eval: error: the task does not work: {exc.one_line()}\n")
        if args.verbose and exc.detail:
            sys.stderr.write(exc.detail.rstrip() + "\n")
        return 2
    except DeviceUnavailable as exc:  # a bad option, as `kfoundry run --device cuda` says it
        sys.stderr.write(f"kfoundry eval: error: {exc}\n")
        return 2
    except (TaskTooLarge, IsolationUnavailable) as exc:  # refused on this machine: `run`'s status too
        sys.stderr.write(f"kfoundry eval: error: {exc}\n")
        return 3
    except RunnerError as exc:
        sys.stderr.write(f"kfoundry eval: error: {exc}\n")
        return 1
    sys.stdout.write(result.model_dump_json() + "\n" if args.json else summary_text(result))
    return 0
