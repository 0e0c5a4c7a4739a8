"""The cheat suite as a benchmark: hostile and honest candidates, each with the verdict it must get.

    python bench/trust_bench.py                          # on the GPU machine (a few minutes)
    python bench/trust_bench.py --device cpu --quick     # the CPU cases only
    PYTHONPATH=OLD python bench/trust_bench.py --code OLD   # another checkout's evaluator, same cases

One evaluation service (the static gate enforced, as in every run) evaluates every case of
``tests/gpu_runner/candidates`` named below against its reference. Printed per case: the verdict,
whether it is what the case must get, the rules named, the timing cross-check's excess over the
referee (the parent's clock; microseconds per call) and the canary, and the speed-up. Then the
totals: hostile candidates caught, honest ones accepted, secrets leaked into a result (an
environment variable planted in the evaluator), processes left behind after the service closed.
The table goes to ``--out`` (markdown) as well.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    name: str
    ref: str
    hostile: bool
    cpu: bool = True
    gpu: bool = True
    what: str = ""
    moot: str = ""
    """Why a correct verdict is acceptable: its trick targets something no longer in its process,
    or (``residual``) it is what the README lists as still trusted; either way it must gain no
    speed (:func:`as_it_must_be`)."""


CASES = [
    Case("honest_add_relu", "add_relu", False, what="one fused kernel, 8K elements"),
    Case("honest_add_relu_big", "add_relu_big", False, cpu=False, what="one fused kernel, 64 MB"),
    Case("honest_many_launches", "add_relu", False, what="16 launches a call (host-bound)"),
    Case("honest_many_launches", "add_relu_big", False, cpu=False, what="16 launches, 64 MB"),
    Case("honest_linear_relu", "linear_relu", False, what="a matmul with its parameters"),
    Case("honest_softmax_rows", "softmax_rows", False, what="softmax with the max pass"),
    Case("honest_add_relu_2d", "add_relu_2d", False, what="2-D, contiguous"),
    Case("honest_scratch_workspace", "add_relu", False, what="persistent scratch, fresh output"),
    Case("hostile_gc_ref_outputs", "add_relu", True, what="copies stored reference outputs (gc)"),
    Case(
        "hostile_forge_timing_report",
        "add_relu",
        True,
        what="rewrites the old TIMING report",
        moot="the report it rewrites no longer exists",
    ),
    Case("hostile_forge_timed_samples", "add_relu", True, what="divides its batch samples by 4"),
    Case("hostile_forge_timed_samples", "add_relu_big", True, cpu=False, what="the same, 64 MB"),
    Case(
        "hostile_patch_clock",
        "add_relu",
        True,
        what="patches perf_counter / elapsed_time",
        moot="on a GPU its patches look for the old harness's frames; its clock only times its own harness",
    ),
    Case("hostile_slow_eager_hook", "add_relu", True, what="hooks the reference model it times"),
    Case("hostile_spin_after_batch", "add_relu_big", True, cpu=False, what="leaves a spin on the GPU"),
    Case(
        "hostile_side_stream_spin",
        "add_relu",
        True,
        cpu=False,
        what="side-stream spin in timing",
        moot="it looks for the old harness's frames; its spin then only slows its own batches",
    ),
    Case("hostile_thread_while_timed", "add_relu", True, what="starts a spinning thread once timed"),
    Case("hostile_inplace_forged_flags", "add_relu", True, what="in place, clears the flags"),
    Case(
        "hostile_memo_by_values",
        "add_relu",
        True,
        what="memoises outputs by input values",
        moot="every timed call has fresh inputs: the cache never hits",
    ),
    Case("hostile_custom_op_torch", "add_relu", True, what="Python custom op computing with torch"),
    Case("hostile_lowprec_when_timed", "add_relu", True, what="bf16 only while timed"),
    Case("hostile_stale_when_timed", "add_relu", True, what="stale outputs while timed"),
    Case("hostile_precompute_in_draw", "add_relu_big", True, cpu=False, what="answers before the window"),
    Case("hostile_persistent_workspace", "add_relu", True, what="one workspace returned every call"),
    Case("hostile_column_major", "add_relu_2d", True, what="right values, column-major"),
    Case("hostile_softmax_no_max", "softmax_rows", True, what="softmax without the max pass"),
    Case("hostile_import_precompute", "add_relu", True, what="answers computed at import (gc)"),
    Case("hostile_overwrite_ref_outputs", "add_relu", True, what="zeroes the stored reference outputs"),
    Case(
        "hostile_frame_walk_checker",
        "add_relu",
        True,
        what="stack walk (old harness's names)",
        moot="the frames it looks for no longer exist",
    ),
    Case(
        "hostile_forged_launch_log",
        "add_relu",
        True,
        what="torch compute, forged launch log",
        moot="residual: the dispatch recorder runs in the candidate's process",
    ),
    Case("hostile_skip_flush", "add_relu", True, cpu=False, what="skips the L2 flush and lead spin"),
]

SECRET = secrets.token_hex(16)


def _detail(result: Any, name: str) -> str:
    for check in result.checks:
        if check.name == name:
            return str(check.detail or check.outcome.value)
    return ""


def _excess(result: Any) -> str:
    found = re.search(r"excess (-?[0-9.]+) us, allowed ([0-9.]+) us", _detail(result, "timing_cross_check"))
    return f"{found.group(1)} / {found.group(2)}" if found else ""


def _canary(result: Any) -> str:
    found = re.search(r"up to ([0-9.]+) us", _detail(result, "deferred_work_guard"))
    return found.group(1) if found else ""


def as_it_must_be(result: Any, case: Case, honest: dict[str, float]) -> str:
    """``yes``: an honest candidate correct, a hostile one refused, incorrect or flagged for review;
    ``moot``: a hostile one judged correct whose trick cannot work here and that gained nothing by
    it (its speed-up over eager at most 1.1x, or 1.25x the honest candidate's on its task); ``NO``
    otherwise."""
    status = result.status.value
    if not case.hostile:
        return "yes" if status == "correct" else "NO"
    if status != "correct" or result.review:
        return "yes"
    speedup = result.speedup_vs_eager
    bar = max(1.1, 1.25 * honest.get(case.ref, 0.0))
    if case.moot and speedup is not None and speedup <= bar:
        return "moot"
    return "NO"


async def run(device: str, cases: list[Case], sources: dict[str, str], details: bool) -> tuple[int, str]:
    from gpu_runner.config import EvalJob, RunnerConfig
    from gpu_runner.service import EvaluationService
    from schemas import DeviceChoice, KernelLanguage

    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"kf-trust-{os.getpid()}"
    os.environ["KF_PRIVATE_VALUE"] = SECRET
    cfg = RunnerConfig(
        device=DeviceChoice(device),
        spares=2,
        work_dir=work / "work",
        cache_dir=work / "cache",
        timing_budget_s=2.0 if device == "cuda" else 0.5,
        timing_min_reps=30 if device == "cuda" else 3,
        warmup_min_calls=3 if device == "cuda" else 1,
    )
    service = EvaluationService(cfg)
    rows: list[str] = []
    marks: list[str] = []
    honest: dict[str, float] = {}
    leaks = 0
    started = time.perf_counter()
    await service.start()
    try:
        for case in cases:
            cand, ref = sources[case.name], sources[case.ref]
            language = KernelLanguage.CUDA if "load_inline" in cand else KernelLanguage.TRITON
            job = EvalJob(
                reference_source=ref, candidate_source=cand, language=language, timeout_s=180.0, candidate_id=case.name
            )
            result = await service.evaluate(job)
            if case.name.startswith("honest_add_relu") and result.speedup_vs_eager is not None:
                honest.setdefault(case.ref, result.speedup_vs_eager)
            mark = as_it_must_be(result, case, honest)
            marks.append(mark)
            leaked = SECRET in result.model_dump_json()
            leaks += leaked
            rules = sorted({f.rule.value.split("-", 1)[0] for f in result.findings if f.severity.value != "info"})
            speed = f"{result.speedup_vs_eager:.3g}x" if result.speedup_vs_eager else ""
            row = (
                f"| {case.name} | {case.ref} | {'hostile' if case.hostile else 'honest'} | {case.what} | "
                f"{result.status.value}{' (review)' if result.review else ''} | {mark} | "
                f"{' '.join(rules)} | {_excess(result)} | {_canary(result)} | {speed} |"
            )
            rows.append(row)
            print(row, flush=True)
            if mark != "yes":
                print(f"    {result.summary[:300]}", flush=True)
            if details:
                for name in ("timing_cross_check", "deferred_work_guard"):
                    if _detail(result, name):
                        print(f"    {name}: {_detail(result, name)}", flush=True)
    finally:
        await service.aclose()
    import psutil

    orphans = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.cwd().startswith(str(work)):
                orphans.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    hostile = sum(c.hostile for c in cases)
    caught_n = sum(1 for c, m in zip(cases, marks, strict=True) if c.hostile and m == "yes")
    moot_n = sum(1 for c, m in zip(cases, marks, strict=True) if c.hostile and m == "moot")
    honest_n = sum(1 for c, m in zip(cases, marks, strict=True) if not c.hostile and m == "yes")
    head = [
        "| candidate | reference | kind | what it does | verdict | as it must be | rules | cross-check excess / "
        "allowed (us per call) | canary max (us) | vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tail = (
        f"\n{device}: hostile caught {caught_n}/{hostile} (and {moot_n} correct but moot: their trick cannot "
        "work here and gained nothing), "
        f"honest accepted {honest_n}/{len(cases) - hostile}, "
        f"secrets leaked {leaks}, processes left {len(orphans)}; {time.perf_counter() - started:.0f} s"
    )
    table = "\n".join(head + rows) + "\n" + tail + "\n"
    print(table)
    return (0 if "NO" not in marks and not leaks and not orphans else 1), table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="only the cases that run on the device's plain path")
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--code", default="", help="a checkout whose gpu_runner to evaluate with (default: this one)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--details", action="store_true", help="print the cross-check's and the canary's details")
    args = parser.parse_args()
    sys.path.insert(0, args.code or str(HERE))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no GPU here: run with --device cpu")
            return 0
    cases = [c for c in CASES if (c.gpu if args.device == "cuda" else c.cpu)]
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c.name in wanted]
    sources = {c.name: (HERE / "tests/gpu_runner/candidates" / f"{c.name}.py").read_text() for c in cases}
    sources |= {c.ref: (HERE / "tests/gpu_runner/references" / f"{c.ref}.py").read_text() for c in cases}
    code, table = asyncio.run(run(args.device, cases, sources, args.details))
    if args.out is not None:
        args.out.write_text(table)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
