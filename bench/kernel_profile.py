"""Where a model's GPU time goes, per kind of kernel: eager PyTorch, torch.compile and the template's
candidates side by side, for whole models whose candidates launch a hundred kernels or more.

    python -m bench.kernel_profile KERNELBENCH_ROOT --level 3 --problems 19,9
    python -m bench.kernel_profile KB --level 3 --problems 46 --candidate old=/tmp/first_3_46.py
    python -m bench.kernel_profile KB --level 3 --problems 19 --compile --out bench/results/x.md

For each problem at its published size, in one process on one GPU: the reference (eager, at
PyTorch's defaults), ``torch.compile`` with ``--compile``, the template expert's first candidate
rendered here (the GPU model of this device, TF32 where precision parity admits it, as the expert
guesses) and every ``--candidate LABEL=PATH`` (a ``ModelNew`` file, e.g. a run's
``best_model.py``). Each row: the GPU time of one forward from the profiler (the sum of its kernels'
device time over ``--reps`` calls, launch gaps left out: the evaluator's timer sees them only where
the GPU waits for the host), the kernel launches per call, and the time by kind of kernel (the
template's ``_kf_<kind><index>[_in|_wr|_b]`` names grouped by kind, PyTorch's by their first
words), largest first; with ``--top`` the slowest single kernels too. The candidates share the
reference's seeded weights; the first output's error against the reference's is shown. An
in-process measurement to find the kernels that lose, not the honest evaluator (``kfoundry eval``).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from actors.kbench.errors import BenchError
from actors.kbench.problems import Problem, select
from gpu_runner.sandboxed.reference import load_module

SEED = 1
_TEMPLATE = re.compile(r"_kf_([a-z]+)\d*(_in|_wr|_b)?\b")


def kind_of(name: str) -> str:
    """The kind a kernel's name belongs to: ``conv``, ``conv_wr``, ``row``... for the template's
    kernels (``_kf_row61`` -> ``row``, ``_kf_conv81_wr`` -> ``conv_wr``); for others the name up to
    its template arguments, at most 48 characters."""
    m = _TEMPLATE.search(name)
    if m:
        return m.group(1) + (m.group(2) or "")
    return name.split("<")[0].replace("void ", "")[:48]


@dataclass
class Row:
    """One model's profile."""

    label: str
    gpu_ms: float = 0.0
    launches: float = 0.0
    kinds: dict[str, float] = field(default_factory=dict)
    top: list[tuple[str, float]] = field(default_factory=list)
    error: str = ""


def profile(fn: Callable[[], object], reps: int) -> Row:
    """The device time of ``fn`` per call, by kind of kernel."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    kinds: collections.Counter[str] = collections.Counter()
    for e in events:
        kinds[kind_of(e.key)] += e.self_device_time_total / reps / 1e3
    top = sorted(events, key=lambda e: -e.self_device_time_total)
    return Row(
        label="",
        gpu_ms=sum(kinds.values()),
        launches=sum(e.count for e in events) / reps,
        kinds=dict(kinds.most_common()),
        top=[(e.key[:60], e.self_device_time_total / reps / 1e3) for e in top],
    )


def _first_candidate(source: str) -> str | None:
    from actors.experts.template import Plan, analyse, default_params, render
    from actors.experts.template.hardware import detect
    from actors.experts.template.kernels.conv import cudnn_ieee_likely

    plan = analyse(source)
    if not isinstance(plan, Plan):
        return None
    tf32 = torch.backends.cudnn.allow_tf32 and not cudnn_ieee_likely(plan)
    return render(plan, default_params(plan, detect(), tf32=tf32))


def _first_tensor(out: Any) -> torch.Tensor:
    while isinstance(out, tuple | list):
        out = out[0]
    assert isinstance(out, torch.Tensor)
    return out


def _caller(model: Any, inputs: list[Any]) -> Callable[[], object]:
    def call() -> object:
        return model(*inputs)

    return call


def bench_problem(problem: Problem, candidates: dict[str, str], with_compile: bool, reps: int) -> list[Row]:
    """The rows of one problem (``candidates``: label -> ``ModelNew`` source)."""
    source = problem.path.read_text(encoding="utf-8")
    ref = load_module(source, str(problem.path), f"kf_profile_ref_{problem.level}_{problem.number}")
    init = list(ref["get_init_inputs"]())
    torch.manual_seed(SEED)
    model = ref["Model"](*init).cuda()
    torch.manual_seed(SEED + 1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref["get_inputs"]()]
    rows: list[Row] = []
    with torch.no_grad():
        want = _first_tensor(model(*inputs))
        made: list[tuple[str, Callable[[], object]]] = [("eager", _caller(model, inputs))]
        if with_compile:
            made.append(("torch.compile", _caller(torch.compile(model), inputs)))
        first = _first_candidate(source)
        sources = {**({"template first candidate": first} if first else {}), **candidates}
        for label, text in sources.items():
            try:
                ns = load_module(text, f"<{label}>", f"kf_profile_cand_{abs(hash(label))}")
                torch.manual_seed(SEED)
                cand = ns["ModelNew"](*init).cuda()
                got = _first_tensor(cand(*inputs))
                err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
                made.append((f"{label} (max err {err:.1e})", _caller(cand, inputs)))
            except Exception as exc:  # noqa: BLE001 - a candidate that fails is a row saying so
                rows.append(Row(label=label, error=f"{type(exc).__name__}: {str(exc)[:160]}"))
        for label, fn in made:
            row = profile(fn, reps)
            row.label = label
            rows.append(row)
            print(f"  {label}: {row.gpu_ms:.3f} ms of kernels, {row.launches:.0f} launches", flush=True)
    return rows


def table(results: list[tuple[Problem, list[Row]]], device: str, kinds: int, top: int) -> str:
    lines = [
        f"# Kernel time by kind, {device}",
        "",
        "| problem | model | kernels (ms) | launches | by kind (ms), largest first |",
        "|---|---|---:|---:|---|",
    ]
    for problem, rows in results:
        for row in rows:
            if row.error:
                lines.append(f"| {problem.name} | {row.label} | – | – | failed: {row.error} |")
                continue
            by_kind = ", ".join(f"{k} {v:.3f}" for k, v in list(row.kinds.items())[:kinds])
            lines.append(f"| {problem.name} | {row.label} | {row.gpu_ms:.3f} | {row.launches:.0f} | {by_kind} |")
    if top:
        lines += ["", "Slowest kernels:", ""]
        for problem, rows in results:
            for row in rows:
                if not row.error:
                    worst = "; ".join(f"`{n}` {t:.4f}" for n, t in row.top[:top])
                    lines.append(f"- {problem.name}, {row.label}: {worst}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_profile", description=__doc__.split("\n")[0])
    parser.add_argument("kernelbench", type=Path, help="a KernelBench checkout (its KernelBench/ folder or the root)")
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--problems", default="dev", help="numbers, ranges or dev (default: dev)")
    parser.add_argument("--candidate", action="append", default=[], metavar="LABEL=PATH", help="a ModelNew file")
    parser.add_argument("--compile", action="store_true", help="profile torch.compile too (minutes per model)")
    parser.add_argument("--reps", type=int, default=5, help="calls profiled (default 5)")
    parser.add_argument("--kinds", type=int, default=8, help="kinds shown per row (default 8)")
    parser.add_argument("--top", type=int, default=0, help="also list the N slowest kernels of each row")
    parser.add_argument("--out", type=Path, help="write the table here too")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.kernel_profile needs a CUDA GPU (it profiles device time)", file=sys.stderr)
        return 2
    candidates: dict[str, str] = {}
    for spec in args.candidate:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            print(f"--candidate {spec!r}: give LABEL=PATH of an existing file", file=sys.stderr)
            return 2
        candidates[label] = Path(path).read_text(encoding="utf-8")
    try:
        problems = select(args.kernelbench, args.level, args.problems)
    except BenchError as exc:
        print(f"bench.kernel_profile: {exc}", file=sys.stderr)
        return 2
    results = []
    for i, problem in enumerate(problems, 1):
        print(f"[{i}/{len(problems)}] level {problem.level} {problem.name}", flush=True)
        results.append((problem, bench_problem(problem, candidates, args.compile, args.reps)))
    text = table(results, torch.cuda.get_device_name(0), args.kinds, args.top)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
