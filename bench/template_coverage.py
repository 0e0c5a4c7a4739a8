"""How much of a KernelBench checkout the template expert covers: generated or declined, and why.

For each problem of the chosen level (the development subset by default) it runs the expert's
analysis and rendering on the reference as published and prints one row: the template it would
use, or the decline with its reason. ``--check`` also shrinks the problem's module-level sizes in
memory (batch sizes to 2, other sizes above 32 divided by ``--factor``), renders the first
candidate for the shrunk reference and evaluates it through the real evaluator on the CPU
(``python -m gpu_runner ... --device cpu``, exactly ``kfoundry eval``), so every "generated"
row can be confirmed correct without a GPU. ``--check --device cuda`` evaluates the first
candidate at the published size on the GPU instead and prints its family, verdict and speedup
over eager. ``--torch-ops reference`` plans as ``kfoundry run --torch-ops reference`` does: ops
the templates do not cover stay the reference's own PyTorch calls between the kernels. Each
generated row also says at which shapes its first candidate's ``ModelNew`` runs: ``any shape``
(elementwise from end to end), ``any sizes`` (copies of its kernels take every free size of the
task at run time: the batch, image sizes, lengths), ``any batch`` (the batch alone) or ``fixed``
(the reference's shapes only; others are refused, naming the dimension).
Nothing of the checkout is copied anywhere but a temporary folder that is removed afterwards.

    python -m bench.template_coverage ~/kb/KernelBench --level 1
    python -m bench.template_coverage ~/kb/KernelBench --level 2 --check --problems 2 4 6
    python -m bench.template_coverage ~/kb/KernelBench --level 1 --check --device cuda
    python -m bench.template_coverage ~/kb/KernelBench --level 3 --check --torch-ops reference
"""

from __future__ import annotations

import argparse
import ast
import logging
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import structlog

from actors.experts.template import Plan, Unsupported, analyse, any_batch, any_size, any_sizes, default_params, render
from actors.experts.template.ir import KeepTorch
from actors.kbench.errors import ProblemSpecError
from actors.kbench.problems import DEV_SUBSET, parse_spec
from bench.template_bench import evaluate_cli

DEV = DEV_SUBSET
"""The development subset (the only problems that may be used for tuning)."""


@dataclass
class Row:
    """The outcome for one problem."""

    problem: str
    generated: bool
    detail: str
    check: str = ""
    shapes: str = ""
    """``any shape``, ``any batch`` or ``fixed``: the shapes the first candidate takes."""


def _shrunk(value: int, batch: bool, factor: int, above: int) -> int:
    if batch:
        return min(value, 2)
    return max(min(8, above), value // factor) if value > above else value


def _int_expr(node: ast.expr) -> int | None:
    """The value of an integer constant expression (``8192 * 2``, ``2 ** 16``), or ``None``."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv | ast.Pow):
        a, b = _int_expr(node.left), _int_expr(node.right)
        if a is None or b is None or (isinstance(node.op, ast.FloorDiv) and b == 0):
            return None
        if isinstance(node.op, ast.Pow) and not 0 <= b <= 64:
            return None
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if isinstance(node.op, ast.FloorDiv):
            return a // b
        return a**b if isinstance(node.op, ast.Pow) else ops[type(node.op)]
    return None


def shrink_sizes(source: str, factor: int, above: int = 32) -> str:
    """The problem with its module-level sizes shrunk in memory: batch sizes to at most 2, every
    other integer above ``above`` (a number or a constant expression such as ``8192 * 2``, alone,
    in a tuple, or in a chained assignment) divided by ``factor`` (at least ``min(8, above)``)."""
    tree = ast.parse(source)
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign):
            continue
        names = [
            n.id for t in stmt.targets for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name)
        ]
        batch = any("batch" in n.lower() for n in names)
        value = stmt.value
        number = _int_expr(value)
        if number is not None:
            stmt.value = ast.Constant(_shrunk(number, batch, factor, above))
        elif isinstance(value, ast.Tuple):
            ints = [_int_expr(e) for e in value.elts]
            if all(v is not None for v in ints):
                value.elts = [ast.Constant(_shrunk(int(v or 0), batch, factor, above)) for v in ints]
    return ast.unparse(tree) + "\n"


def problem_files(root: Path, level: int, numbers: tuple[int, ...]) -> list[Path]:
    """The files of ``level`` whose leading number is in ``numbers``, in that order."""
    folder = root / f"level{level}"
    by_number = {int(p.name.split("_", 1)[0]): p for p in folder.glob("*.py") if p.name.split("_", 1)[0].isdigit()}
    missing = [n for n in numbers if n not in by_number]
    if missing:
        raise SystemExit(f"{folder} has no problems numbered {missing}")
    return [by_number[n] for n in numbers]


def _plan(source: str, torch_ops: str) -> Plan | Unsupported:
    plan = analyse(source)
    if not isinstance(plan, Plan):  # as the expert does: data movement may stay PyTorch under any policy
        return analyse(source, KeepTorch.ALL if torch_ops == "reference" else KeepTorch.LAYOUT)
    return plan


@dataclass
class Pending:
    """A generated problem whose first candidate is still to be evaluated."""

    row: Row
    reference: Path
    candidate: str


def cover(path: Path, args: argparse.Namespace, workdir: Path) -> Row | Pending:
    """Analyse one problem; with ``args.check`` return what to evaluate (see ``check``)."""
    source = path.read_text(encoding="utf-8")
    plan = _plan(source, args.torch_ops)
    if not isinstance(plan, Plan):
        return Row(path.stem, False, plan.detail)
    try:
        first = render(plan, default_params(plan))
    except Exception as exc:  # noqa: BLE001 - a rendering failure is this row's finding
        return Row(path.stem, False, f"render failed: {type(exc).__name__}: {exc}")
    row = Row(path.stem, True, plan.template, shapes=shapes_taken(first))
    if not args.check:
        return row
    on_gpu = args.device == "cuda"
    small = source if on_gpu else shrink_sizes(source, args.factor, args.above)
    small_plan = plan if on_gpu else _plan(small, args.torch_ops)
    if not isinstance(small_plan, Plan):
        row.check = f"not checked: the shrunk problem is declined ({small_plan.detail})"
        return row
    reference = workdir / f"ref_{path.stem}.py"
    reference.write_text(small, encoding="utf-8")
    return Pending(row, reference, render(small_plan, default_params(small_plan)))


def shapes_taken(rendered: str) -> str:
    """At which shapes a rendered ``ModelNew`` runs (see the module's doc)."""
    if f"def {any_size.METHOD}(self" in rendered:
        return "any shape"
    if f"def {any_sizes.METHOD}(self" in rendered:
        return "any sizes"
    if f"def {any_batch.METHOD}(self" in rendered:
        return "any batch"
    return "fixed"


def check(pending: Pending, args: argparse.Namespace, workdir: Path) -> Row:
    """Evaluate a pending problem's first candidate in a fresh evaluator process."""
    row = pending.row
    outcome = evaluate_cli(
        pending.reference, pending.candidate, args.device, args.timeout, workdir, "first", args.torch_ops
    )
    row.check = outcome.status if outcome.status == "correct" else f"{outcome.status}: {outcome.summary}"
    if outcome.speedup_vs_eager is not None:
        row.check += f", {outcome.speedup_vs_eager:.2f}x eager"
        if outcome.speedup_vs_compiled is not None:
            row.check += f", {outcome.speedup_vs_compiled:.2f}x torch.compile"
        if args.jobs > 1:
            row.check += " (timed beside other evaluations)"
    return row


def _print(row: Row) -> None:
    verdict = "generated" if row.generated else "declined"
    extra = f" | check: {row.check}" if row.check else ""
    shapes = f"{row.shapes:9s} " if row.generated else " " * 10
    print(f"{row.problem:70s} {verdict:9s} {shapes}{row.detail[:160]}{extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Print one line per problem and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a KernelBench checkout (holding level1, level2, ...)")
    parser.add_argument("--level", type=int, choices=sorted(DEV), required=True)
    parser.add_argument(
        "--problems", nargs="*", default=["dev"], help="'dev' (default), 'all' or problem numbers: 1,2,5-9 (or 1 2 5)"
    )
    parser.add_argument("--check", action="store_true", help="evaluate the first candidate (see --device)")
    parser.add_argument("--factor", type=int, default=32, help="divide sizes above 32 by this for --check")
    parser.add_argument("--above", type=int, default=32, help="for --check: shrink sizes above this")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on one evaluation")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="for --check: cpu (shrunk sizes, Triton interpreter) or cuda (published sizes, timed)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="for --check: evaluations at once (above 1, speedups are timed beside each other and marked so)",
    )
    parser.add_argument(
        "--torch-ops", choices=["forbid", "reference"], default="forbid", help="the run policy to plan and judge under"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    root = args.root.expanduser()
    try:  # as kfoundry bench reads them: 1,2,5-9, dev or all (several words are joined)
        numbers = parse_spec(",".join(args.problems), args.level)
    except ProblemSpecError as exc:
        parser.error(str(exc))
    if not numbers:  # all
        numbers = tuple(sorted(int(p.name.split("_", 1)[0]) for p in (root / f"level{args.level}").glob("[0-9]*.py")))
    rows: list[Row] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-coverage-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = []
        for path in problem_files(root, args.level, numbers):
            item = cover(path, args, Path(tmp))
            if isinstance(item, Pending):
                rows.append(item.row)
                futures.append(pool.submit(check, item, args, Path(tmp)))
            else:
                rows.append(item)
                _print(item)
        for future in as_completed(futures):
            _print(future.result())
    if args.jobs > 1 and args.check:
        print("\nin problem order:")
        for row in rows:
            _print(row)
    done = sum(r.generated for r in rows)
    checked = sum(r.check.startswith("correct") for r in rows)
    summary = f"\nlevel {args.level}: generated {done}/{len(rows)}"
    taken = {kind: sum(r.shapes == kind for r in rows) for kind in ("any shape", "any sizes", "any batch", "fixed")}
    summary += " (" + ", ".join(f"{kind} {n}" for kind, n in taken.items()) + ")"
    if args.check:
        summary += f", correct on {args.device} {checked}/{done}"
    print(summary + f" ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
