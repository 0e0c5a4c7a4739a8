"""Benchmark the template expert's kernels on the example tasks, through the honest evaluator.

For every ``examples/tasks/*.py`` (and ``examples/quickstart.py``) it renders the template
expert's first candidate (default parameters) and a few mutants, evaluates each through the
honest evaluator, and prints one row per task: template, best speedup vs eager and vs
``torch.compile`` among correct candidates, the first candidate's speedups, and the verdicts.

``--via service`` (default) keeps one ``gpu_runner`` ``EvaluationService`` for the whole run
(warm worker processes, ``prepare`` once per task) and gives every task an equal share of the
time budget: its first candidate always, mutants while its share lasts. ``--via cli`` runs
``python -m gpu_runner REFERENCE CANDIDATE --device DEV --json`` per candidate (exactly
``kfoundry eval``; a fresh evaluator each time), breadth first until the budget is spent.

    python -m bench.template_bench --device cuda --out bench/results/template_h100   # <= 8 min
    python -m bench.template_bench --device cpu --quick                               # CPU check

``--tasks`` takes any KernelBench-format files (a KernelBench checkout's problems too); on CUDA the
first candidate is planned for this machine's GPU model, as the template expert plans it, and
``--also NAME=VALUE`` adds that change of the first candidate as one more candidate per task.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import structlog
import torch

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, render
from actors.experts.template.hardware import GpuModel, detect
from actors.experts.template.params import SPACE
from schemas import DeviceChoice, DiagnosisCategory, EvalResult, KernelLanguage

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    """One evaluated candidate."""

    label: str
    status: str
    speedup_vs_eager: float | None
    speedup_vs_compiled: float | None
    summary: str
    wall_s: float


@dataclass
class TaskRow:
    """Everything measured for one task."""

    task: str
    template: str
    outcomes: list[Outcome] = field(default_factory=list)
    pending: list[tuple[str, str]] = field(default_factory=list)
    """(label, candidate source) not evaluated yet, in order."""

    def best(self) -> Outcome | None:
        """The correct candidate with the largest speedup over eager."""
        correct = [o for o in self.outcomes if o.status == "correct" and o.speedup_vs_eager is not None]
        return max(correct, key=lambda o: o.speedup_vs_eager or 0.0, default=None)


def shrink(source: str, factor: int) -> str:
    """The task with every module-level integer size above 32 divided by ``factor`` (for CPU runs)."""
    tree = ast.parse(source)
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Constant)
            and type(stmt.value.value) is int
            and stmt.value.value > 32
        ):
            stmt.value = ast.Constant(max(8, stmt.value.value // factor))
    return ast.unparse(tree) + "\n"


def variants(
    plan: Plan,
    count: int,
    seed: int,
    hw: GpuModel | None = None,
    also: Sequence[dict[str, object]] = (),
) -> list[tuple[str, TemplateParams]]:
    """The first candidate (for the GPU model ``hw`` where given), the default with each of
    ``also``'s changes that applies, then mutants up to ``count`` candidates, steered by the
    template's kind."""
    first = default_params(plan, hw)
    chosen: list[tuple[str, TemplateParams]] = [("default", first)]
    for changes in also:
        other = first.with_changes(**changes)
        if other != first and other not in {p for _, p in chosen}:
            chosen.append(("also:" + ",".join(f"{k}={v}" for k, v in changes.items()), other))
    if "mm" in plan.template.split("+"):
        chosen.append(("tf32x3", first.with_changes(mm_precision="tf32x3")))
        diagnosis = DiagnosisCategory.SLOW_COMPUTE_BOUND
    else:
        diagnosis = DiagnosisCategory.SLOW_MEMORY_BOUND
    rng = np.random.default_rng(seed)
    seen = {p for _, p in chosen}
    count = max(count, len(chosen))
    for i in range(16 * count):
        if len(chosen) >= count:
            break
        child = mutate(plan, first, rng, diagnosis=diagnosis if i % 2 == 0 else None)
        if child not in seen:
            seen.add(child)
            changed = [k for k, v in child.as_dict().items() if v != first.as_dict()[k]]
            chosen.append(("mut:" + ",".join(changed), child))
    return chosen[:count]


def _outcome(label: str, result: EvalResult | dict[str, object], wall: float) -> Outcome:
    data = result.model_dump(mode="json") if isinstance(result, EvalResult) else result

    def number(key: str) -> float | None:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) else None

    return Outcome(
        label,
        str(data.get("status")),
        number("speedup_vs_eager"),
        number("speedup_vs_compiled"),
        str(data.get("summary", ""))[:200],
        wall,
    )


def evaluate_cli(
    reference: Path, candidate: str, device: str, timeout: float, workdir: Path, label: str, torch_ops: str = "forbid"
) -> Outcome:
    """One ``python -m gpu_runner`` evaluation (a fresh evaluator process) under the run policy ``torch_ops``."""
    path = workdir / f"cand_{reference.stem}_{len(list(workdir.glob('cand_*')))}.py"
    path.write_text(candidate, encoding="utf-8")
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "gpu_runner", str(reference), str(path), "--device", device, "--json"]
    cmd += ["--timeout", str(timeout), "--torch-ops", torch_ops]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(label, "bench_timeout", None, None, "gpu_runner did not finish", time.perf_counter() - started)
    wall = time.perf_counter() - started
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout)[-300:].replace("\n", " ")
        return Outcome(label, f"runner_exit_{proc.returncode}", None, None, tail, wall)
    return _outcome(label, result, wall)


def _log(started: float, row: TaskRow, outcome: Outcome) -> None:
    print(
        f"[{time.perf_counter() - started:6.1f}s] {row.task:32s} {outcome.label:40s} {outcome.status:14s} "
        f"eager {_fmt(outcome.speedup_vs_eager)} compile {_fmt(outcome.speedup_vs_compiled)} "
        f"({outcome.wall_s:.1f}s)",
        flush=True,
    )


def run_cli(
    rows: list[TaskRow], refs: dict[str, Path], args: argparse.Namespace, started: float, workdir: Path
) -> None:
    """Breadth first through ``python -m gpu_runner`` until the budget is spent."""
    while any(r.pending for r in rows):
        for row in rows:
            if not row.pending:
                continue
            if time.perf_counter() - started > args.budget_s:
                row.pending.clear()
                continue
            label, candidate = row.pending.pop(0)
            outcome = evaluate_cli(refs[row.task], candidate, args.device, args.timeout, workdir, label)
            row.outcomes.append(outcome)
            _log(started, row, outcome)


async def run_service(rows: list[TaskRow], refs: dict[str, Path], args: argparse.Namespace, started: float) -> None:
    """One warm ``EvaluationService``; each task gets an equal share of the remaining budget."""
    from gpu_runner.config import EvalJob, RunnerConfig
    from gpu_runner.service import EvaluationService

    service = EvaluationService(RunnerConfig(device=DeviceChoice(args.device), spares=2))
    await service.start()
    try:
        todo = [r for r in rows if r.pending]
        for i, row in enumerate(todo):
            share = (args.budget_s - (time.perf_counter() - started)) / (len(todo) - i)
            task_started = time.perf_counter()
            reference = refs[row.task].read_text(encoding="utf-8")
            await service.prepare(reference)
            while row.pending:
                spent = time.perf_counter() - task_started
                if row.outcomes and (spent > share or time.perf_counter() - started > args.budget_s):
                    row.pending.clear()
                    break
                label, candidate = row.pending.pop(0)
                t0 = time.perf_counter()
                job = EvalJob(
                    reference_source=reference,
                    candidate_source=candidate,
                    language=KernelLanguage.TRITON,
                    timeout_s=args.timeout,
                    task_id=service.task_id(reference),
                    candidate_id=f"{row.task}-{len(row.outcomes)}",
                )
                outcome = _outcome(label, await service.evaluate(job), time.perf_counter() - t0)
                row.outcomes.append(outcome)
                _log(started, row, outcome)
    finally:
        await service.aclose()


def _fmt(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def table(rows: list[TaskRow]) -> str:
    """The results as a Markdown table."""
    head = "| task | template | best vs eager | best vs compile | first vs eager | first vs compile | verdicts | best |"
    lines = [head, "|" + "---|" * 8]
    for row in rows:
        best = row.best()
        first = row.outcomes[0] if row.outcomes else None
        verdicts: dict[str, int] = {}
        for o in row.outcomes:
            verdicts[o.status] = verdicts.get(o.status, 0) + 1
        status = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())) or "not run"
        lines.append(
            f"| {row.task} | {row.template} | {_fmt(best.speedup_vs_eager if best else None)} | "
            f"{_fmt(best.speedup_vs_compiled if best else None)} | "
            f"{_fmt(first.speedup_vs_eager if first else None)} | "
            f"{_fmt(first.speedup_vs_compiled if first else None)} | "
            f"{status} | {best.label if best else '-'} |"
        )
    return "\n".join(lines)


def _changes(text: str) -> dict[str, object]:
    """``NAME=VALUE[,NAME=VALUE]`` as template parameter changes, each value one of its space's."""
    changes: dict[str, object] = {}
    for item in text.split(","):
        name, _, raw = item.partition("=")
        allowed = SPACE.get(name.strip())
        if allowed is None:
            raise argparse.ArgumentTypeError(f"unknown template parameter {name.strip()!r}")
        match = [v for v in allowed if str(v).lower() == raw.strip().lower()]
        if not match:
            raise argparse.ArgumentTypeError(f"{name.strip()}={raw.strip()}: one of {list(allowed)}")
        changes[name.strip()] = match[0]
    return changes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="shrink the tasks' sizes (for a CPU run)")
    parser.add_argument("--variants", type=int, default=4, help="candidates per task (first + mutants)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting evaluations after this")
    parser.add_argument("--timeout", type=float, default=120.0, help="bound on one evaluation")
    parser.add_argument("--tasks", nargs="*", default=None, help="task files (default: all examples)")
    parser.add_argument("--out", type=Path, default=None, help="write JSON and Markdown results here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--via", choices=["service", "cli"], default="service", help="how to reach gpu_runner")
    parser.add_argument(
        "--also",
        action="append",
        type=_changes,
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="one more candidate per task: the first with these parameters changed (repeatable), "
        "e.g. --also conv_taps_outer=false",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "template_bench: no CUDA GPU here (torch.cuda.is_available() is False); "
            "for a CPU check: python bench/template_bench.py --device cpu --quick"
        )
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    started = time.perf_counter()
    files = [Path(t) for t in args.tasks] if args.tasks else sorted((ROOT / "examples" / "tasks").glob("*.py"))
    if not args.tasks:
        files.append(ROOT / "examples" / "quickstart.py")
    if args.quick:
        args.variants = min(args.variants, 2)
    hw = detect() if args.device == "cuda" else None  # the model the template expert plans with
    rows: list[TaskRow] = []
    with tempfile.TemporaryDirectory(prefix="kf-template-bench-") as tmp:
        workdir = Path(tmp)
        references: dict[str, Path] = {}
        for file in files:
            source = file.read_text(encoding="utf-8")
            if args.quick and file.name != "quickstart.py":
                source = shrink(source, 16)
            reference = workdir / f"ref_{file.stem}.py"
            reference.write_text(source, encoding="utf-8")
            references[file.stem] = reference
            plan = analyse(source)
            if not isinstance(plan, Plan):
                rows.append(TaskRow(file.stem, f"declined: {plan.detail}"))
                continue
            row = TaskRow(file.stem, plan.template)
            chosen = variants(plan, args.variants, args.seed, hw, args.also)
            row.pending = [(label, render(plan, p)) for label, p in chosen]
            rows.append(row)
        if args.via == "cli":
            run_cli(rows, references, args, started, workdir)
        else:
            asyncio.run(run_service(rows, references, args, started))
    rendered = table(rows)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        dumped = [asdict(r) for r in rows]
        for item in dumped:
            item.pop("pending", None)
        payload = {"device": args.device, "quick": args.quick, "rows": dumped}
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=2), encoding="utf-8")
        args.out.with_suffix(".md").write_text(rendered + "\n", encoding="utf-8")
    print(
        f"\ntemplate expert benchmark ({args.device}{', quick' if args.quick else ''}), "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(rendered)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
