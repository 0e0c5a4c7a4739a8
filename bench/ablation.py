"""What each search mechanism earns: the same problems, the same budget, one mechanism off at a time.

For every problem it runs ``kfoundry run`` once with everything on (``all-on``) and once per
ablation switch (``--no-experience``, ``--uniform-experts``, ``--no-migration``,
``--no-meta-prompt``), each as its own process (``actors.kbench.runner``), with the same seed,
budget and options, and prints one row per (problem, variant): status, best speedup over eager and
over ``torch.compile``, time to the first correct candidate, candidates evaluated; then one line
per variant with the geometric-mean best speedup over the problems where it found a correct
kernel, its median time to first correct and its candidates. ``ablation.json`` and
``ablation.md`` go into ``--out``.

    python bench/ablation.py --task examples/quickstart.py --seconds 60 --out ablation-cpu
    python bench/ablation.py --kernelbench ~/KernelBench/KernelBench --level 1 --problems dev --seconds 600

The mechanisms are stochastic: compare over several problems (and seeds, ``--seed``) before
concluding; a single row is an anecdote. On the CPU, timings are interpreter timings, not speedups.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from actors.kbench.problems import Problem, select
from actors.kbench.results import ProblemResult, ProblemStatus
from actors.kbench.runner import RunOptions, run_problem

ALL_ON = "all-on"
SWITCHES = ("--no-experience", "--uniform-experts", "--no-migration", "--no-meta-prompt")


class VariantSummary(BaseModel):
    """One variant over every problem of the bench."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: str
    problems: int
    correct: int
    geomean_speedup: float | None = None
    """Geometric mean of the best speedups over eager, over the problems with a correct kernel."""
    median_first_correct_s: float | None = None
    candidates: int = 0


class AblationRow(BaseModel):
    """One problem under one variant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: str
    result: ProblemResult


def summarise(rows: list[AblationRow]) -> list[VariantSummary]:
    """Per variant (in first-seen order): correct share, geometric-mean speedup, time to first correct."""
    out = []
    for variant in dict.fromkeys(r.variant for r in rows):
        mine = [r.result for r in rows if r.variant == variant]
        good = [r for r in mine if r.status is ProblemStatus.CORRECT]
        speedups = [r.speedup_vs_eager for r in good if r.speedup_vs_eager is not None and r.speedup_vs_eager > 0]
        firsts = [r.first_correct_s for r in good if r.first_correct_s is not None]
        out.append(
            VariantSummary(
                variant=variant,
                problems=len(mine),
                correct=len(good),
                geomean_speedup=math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None,
                median_first_correct_s=statistics.median(firsts) if firsts else None,
                candidates=sum(r.evaluated or 0 for r in mine),
            )
        )
    return out


def _x(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None else "-"


def _s(value: float | None) -> str:
    return f"{value:.0f} s" if value is not None else "-"


def render(rows: list[AblationRow], *, on_cpu: bool) -> str:
    """The Markdown tables: per (problem, variant), then per variant."""
    lines = [
        "| problem | variant | status | vs eager | vs torch.compile | first correct | candidates |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        r = row.result
        evaluated = r.evaluated if r.evaluated is not None else "-"
        lines.append(
            f"| {r.name} | {row.variant} | {r.status.value} | {_x(r.speedup_vs_eager)} | "
            f"{_x(r.speedup_vs_compiled)} | {_s(r.first_correct_s)} | {evaluated} |"
        )
    lines += [
        "",
        "| variant | correct | geomean vs eager (correct only) | median first correct | candidates |",
        "|---|---|---|---|---|",
    ]
    for v in summarise(rows):
        lines.append(
            f"| {v.variant} | {v.correct}/{v.problems} | {_x(v.geomean_speedup)} | "
            f"{_s(v.median_first_correct_s)} | {v.candidates} |"
        )
    if on_cpu:
        lines += ["", "Timed on the CPU (Triton's interpreter): the speedups are not speedups; compare the rest."]
    return "\n".join(lines) + "\n"


def _problems(args: argparse.Namespace) -> list[Problem]:
    if args.kernelbench is not None:
        return select(args.kernelbench, args.level, args.problems)
    if not args.task:
        raise SystemExit("ablation: give --task FILE (repeatable) or --kernelbench DIR --level N")
    return [Problem(level=0, number=i + 1, path=Path(p).resolve()) for i, p in enumerate(args.task)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench/ablation.py")
    p.add_argument("--task", action="append", default=[], help="a KernelBench-format task file (repeatable)")
    p.add_argument("--kernelbench", type=Path, help="a KernelBench checkout (KernelBench/ folder with levelN)")
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--problems", default="dev", help="problem numbers (1,2,5-9), dev or all")
    p.add_argument("--seconds", type=float, default=120.0, help="wall-clock budget of every run")
    p.add_argument("--candidates", type=int, default=None, help="candidate budget of every run")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--switches",
        default=",".join(s.removeprefix("--") for s in SWITCHES),
        help="comma-separated switches to compare, e.g. no-experience,no-migration (default: all four)",
    )
    p.add_argument("--run-arg", action="append", default=[], help="one more `kfoundry run` argument (repeatable)")
    p.add_argument("--out", type=Path, default=Path("ablation"))
    args = p.parse_args(argv)
    switches = ["--" + s.strip().lstrip("-") for s in args.switches.split(",") if s.strip()]
    unknown = [s for s in switches if s not in SWITCHES]
    if unknown:
        p.error(f"unknown switch(es) {', '.join(unknown)}; known: {', '.join(SWITCHES)}")
    common = ["--seed", str(args.seed), *args.run_arg]
    if args.candidates is not None:
        common += ["--candidates", str(args.candidates)]
    problems = _problems(args)
    rows: list[AblationRow] = []
    stop = threading.Event()
    args.out.mkdir(parents=True, exist_ok=True)
    for problem in problems:
        for variant in (ALL_ON, *switches):
            extra = common if variant == ALL_ON else [*common, variant]
            opts = RunOptions(device=args.device, seconds=args.seconds, run_args=tuple(extra))
            result = run_problem(problem, args.out / variant.lstrip("-"), opts, stop)
            rows.append(AblationRow(variant=variant, result=result))
            sys.stdout.write(
                f"{problem.name} {variant}: {result.status.value}, {_x(result.speedup_vs_eager)} vs eager, "
                f"first correct {_s(result.first_correct_s)}, {result.evaluated} evaluated\n"
            )
            sys.stdout.flush()
    table = render(rows, on_cpu=args.device == "cpu")
    (args.out / "ablation.md").write_text(table)
    (args.out / "ablation.json").write_text(
        json.dumps(
            {
                "rows": [r.model_dump(mode="json") for r in rows],
                "variants": [v.model_dump(mode="json") for v in summarise(rows)],
            },
            indent=2,
        )
    )
    sys.stdout.write("\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
