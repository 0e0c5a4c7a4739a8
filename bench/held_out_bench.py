"""What the held-out shapes cost: evaluations with and without them, side by side in one run.

    python bench/held_out_bench.py --device cpu                 # Triton's interpreter (a few minutes)
    python bench/held_out_bench.py --device cuda --repeat 8     # on the GPU machine

Per case (a task and a candidate) and setting (``held_out_shapes`` 0 and 3), one evaluation service
is started, the task prepared (the memory plan, where the shapes are derived, and the referee:
``prepare_s``) and the candidate evaluated ``--repeat`` times (each on a spare prepared for it: the
shapes' inputs and truths are part of that preparation). The settings alternate case by case, so a
drift of the host falls on both. Printed: the verdict and the held-out outcomes, ``prepare_s``, and
the median over the evaluations after the first (whose spare was prepared on its critical path) of
the evaluation's total (``total_s``), its run stage (``run_s``: trials, held-out calls, timing) and
the time its GPU window was held (``gpu_s``). The table goes to ``--out`` as well.

Cases: the quickstart task (a linear layer) with the template expert's first candidate (copies of
its kernels that take any batch: correct at the held-out batches), an elementwise task with the
template's candidate (run-time-sized copies of its kernels: correct at any shape), a softmax over
``(batch_size, dim)`` with the template's candidate (any batch and row length: copies of its
kernels that take every free size of the task), with a candidate correct at any shape and with one wrong at an odd batch
(``tests/gpu_runner``'s references and candidates).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from gpu_runner.config import EvalJob, RunnerConfig  # noqa: E402
from gpu_runner.errors import DeviceUnavailable  # noqa: E402
from gpu_runner.service import EvaluationService  # noqa: E402
from schemas import DeviceChoice, EvalResult, KernelLanguage  # noqa: E402

REFS = HERE / "tests" / "gpu_runner" / "references"
CANDS = HERE / "tests" / "gpu_runner" / "candidates"


@dataclass(frozen=True)
class Case:
    name: str
    task: Path
    candidate: Path | None
    """None: the template expert's first candidate for the task."""


CASES = (
    Case("quickstart, template (any batch)", HERE / "examples" / "quickstart.py", None),
    Case("swish + residual, template (any shape)", REFS / "swish_sized.py", None),
    Case("softmax, template (any sizes)", REFS / "softmax_sized.py", None),
    Case("softmax, any shape", REFS / "softmax_sized.py", CANDS / "softmax_any_shape.py"),
    Case("softmax, wrong at an odd batch", REFS / "softmax_sized.py", CANDS / "softmax_row_pairs.py"),
)


def template_candidate(task: str) -> str:
    from actors.experts.template.ir import Unsupported
    from actors.experts.template.params import TemplateParams
    from actors.experts.template.render import analyse, render

    plan = analyse(task)
    if isinstance(plan, Unsupported):
        raise SystemExit(f"the template expert declines the task: {plan}")
    return render(plan, TemplateParams())


def held_out_text(result: EvalResult) -> str:
    shapes = result.correctness.held_out if result.correctness else ()
    if not shapes:
        return "none"
    return ", ".join(f"{n} {o}" for o, n in sorted(Counter(s.outcome for s in shapes).items()))


async def measure(case: Case, shapes: int, device: str, repeat: int) -> dict[str, object]:
    task = case.task.read_text()
    source = case.candidate.read_text() if case.candidate else template_candidate(task)
    cfg = RunnerConfig(
        device=DeviceChoice(device),
        spares=1,
        compile_workers=2,
        timing_budget_s=0.3 if device == "cpu" else 2.0,
        held_out_shapes=shapes,
    )
    async with EvaluationService(cfg) as service:
        t0 = time.perf_counter()
        await service.prepare(task)
        prepare_s = time.perf_counter() - t0
        results = []
        for k in range(repeat):
            job = EvalJob(
                reference_source=task,
                candidate_source=source,
                language=KernelLanguage.TRITON,
                timeout_s=300.0,
                candidate_id=f"bench-{k}",
            )
            results.append(await service.evaluate(job))
    later = results[1:] or results

    def median(field: str) -> float:
        values = [getattr(r.stages, field) for r in later if getattr(r.stages, field) is not None]
        return statistics.median(values) if values else float("nan")

    return {
        "case": case.name,
        "shapes": shapes,
        "status": results[-1].status.value,
        "held_out": held_out_text(results[-1]),
        "prepare_s": prepare_s,
        "total_s": median("total_s"),
        "run_s": median("run_s"),
        "gpu_s": median("gpu_s"),
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| case | held-out shapes | verdict | held-out outcomes | prepare_s | total_s | run_s | gpu_s |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['shapes']} | {r['status']} | {r['held_out']} | {r['prepare_s']:.2f} "
            f"| {r['total_s']:.2f} | {r['run_s']:.2f} | {r['gpu_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> str:
    rows: list[dict[str, object]] = []
    for i, case in enumerate(CASES):
        order = (0, args.shapes) if i % 2 == 0 else (args.shapes, 0)
        for shapes in order:
            row = await measure(case, shapes, args.device, args.repeat)
            print(
                f"{row['case']}: {shapes} shapes, {row['status']}, held-out {row['held_out']}, "
                f"total {row['total_s']:.2f} s",
                file=sys.stderr,
            )
            rows.append(row)
    return table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeat", type=int, default=4, help="evaluations per case and setting (default 4)")
    parser.add_argument("--shapes", type=int, default=3, help="held-out shapes of the second setting (default 3)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.shapes < 1:
        parser.error("--repeat and --shapes must be at least 1")
    from gpu_runner.cli import _configure_logging

    _configure_logging(verbose=False)  # the evaluator's progress lines at warnings only
    try:
        text = asyncio.run(main_async(args))
    except DeviceUnavailable as exc:
        print(f"held_out_bench: {exc}", file=sys.stderr)
        return 2
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
