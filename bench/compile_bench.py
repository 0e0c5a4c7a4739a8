"""What the compile stage does for a template candidate, with and without shared kernels: how many
Triton functions it compiles and how long that takes, side by side in one run. No GPU needed.

    python -m bench.compile_bench KERNELBENCH_ROOT --level 3 --problems 9,19,15
    python -m bench.compile_bench KB --level 3 --problems 9 --processes 4 --out bench/results/compile_cpu.md

For each problem at its published size: the template expert's first candidate for ``--gpu``'s model
(TF32 where precision parity admits it), rendered three times: with a function per kernel, with
kernels of the same code sharing one ``triton.jit`` function (``actors/experts/template/share.py``),
and ("shared sizes", ``share_sizes``, the first candidate of a plan of 32 kernels or more) with
kernels that differ only in integer or fp32 constants sharing one too, the constants passed by their
launches (``const_args.py``). Each is compiled as the evaluator's compile stage compiles it
(``gpu_runner.sandboxed.compiling``: Triton's driver replaced by one naming ``--arch``, launches
turned into compile-only warm-ups, the forward run on CPU tensors of the task's shapes, the
kernels shared out over ``--processes`` forked processes), in a fresh process with an empty Triton
cache, at the task's shape and, where the model has a batch, at half that batch made odd (as a
held-out shape: the any-batch copies compile there). Each row: launch sites, Triton functions in
the file (helpers included), cubins written, and the wall time of the compile. Real compiles
(``ptxas``), so the times are this host's: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import lookup
from actors.experts.template.ir import KeepTorch
from actors.kbench.errors import BenchError
from actors.kbench.problems import select

CHILD = """
import json, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from gpu_runner.sandboxed.candidate import import_candidate
from gpu_runner.sandboxed.compiling import (
    _CompileOnlyDriver, _build_candidate, _compile_in_shares, _everywhere, _shaped_inputs,
)
from gpu_runner.sandboxed.hooks import CompileShare, LaunchLog, install_triton_hooks

candidate, reference, variants, processes, arch = sys.argv[1:6]
driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", int(arch), 32)))
kernels, share = [], CompileShare()
install_triton_hooks(LaunchLog(), compile_only=True, compiled=kernels, share=share)
shaped = _shaped_inputs(open(reference).read())
init = list(shaped.reference["get_init_inputs"]())
cand = _build_candidate(import_candidate(candidate)["ModelNew"], init, shaped.empty_params)
everywhere = lambda: _everywhere(cand, shaped.inputs, shaped.reference, json.loads(variants))
if int(processes) > 1:
    _compile_in_shares(everywhere, share, int(processes), kernels)
everywhere()
"""


@dataclass
class Row:
    problem: str
    form: str
    sites: int
    functions: int
    cubins: int = 0
    seconds: float = 0.0
    error: str = ""


def _compile(
    candidate: Path, reference: Path, variants: list[dict[str, int]], processes: int, arch: int
) -> tuple[int, float, str]:
    """Cubins written and wall seconds of one compile, in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="kf_compile_bench_") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "TRITON_DEFAULT_FP_FUSION": "1"}
        args = [str(candidate), str(reference), json.dumps(variants), str(processes), str(arch)]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, check=False, timeout=3600
        )
        seconds = time.perf_counter() - started
        cubins = sum(1 for _ in Path(cache).rglob("*.cubin"))
    last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    error = "" if done.returncode == 0 else last[:200]
    return cubins, seconds, error


def _module_int(source: str, name: str) -> int | None:
    """The value of the module-level ``name = <int>`` of a reference, if it is one."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Constant) and type(value.value) is int:
                return value.value
    return None


FORMS = {
    "apart": ("one function per kernel", False, False),
    "shared": ("shared", True, False),
    "sizes": ("shared sizes", True, True),
}
"""``--forms`` name → (row label, ``render``'s ``shared``, ``share_sizes``)."""


def measure(
    path: Path,
    gpu: str,
    processes: int,
    arch: int,
    workdir: Path,
    forms: tuple[str, ...] = tuple(FORMS),
    held_out: bool = True,
) -> list[Row]:
    """The forms of one problem's first candidate, compiled one after the other."""
    source = path.read_text(encoding="utf-8")
    plan = analyse(source)
    if not isinstance(plan, Plan):  # as the expert does: data movement may stay PyTorch under any policy
        plan = analyse(source, KeepTorch.LAYOUT)
    if not isinstance(plan, Plan):
        return [Row(path.stem, "declined", 0, 0, error=plan.detail[:200])]
    hw = lookup(gpu)
    params = default_params(plan, hw, tf32=True)
    variants: list[dict[str, int]] = []
    batch = _module_int(source, plan.batch_name) if plan.batch and plan.batch_name else None
    if held_out and batch is not None and batch > 1:
        variants.append({plan.batch_name: max(1, batch // 2) | 1})
    reference = workdir / f"ref_{path.stem}.py"
    reference.write_text(source, encoding="utf-8")
    rows = []
    for k, (form, shared, sizes) in enumerate(FORMS[f] for f in forms):
        text = render(plan, params.with_changes(share_sizes=sizes), hw=hw, shared=shared)
        candidate = workdir / f"cand_{path.stem}_{k}.py"
        candidate.write_text(text, encoding="utf-8")
        row = Row(
            path.stem,
            form,
            len(re.findall(r"^_L_kf\w+ = _KfLaunch", text, re.M)),
            text.count("@triton.jit"),
        )
        row.cubins, row.seconds, row.error = _compile(candidate, reference, variants, processes, arch)
        print(
            f"  {form:24s} functions {row.functions:4d} cubins {row.cubins:4d} {row.seconds:7.1f} s {row.error}",
            flush=True,
        )
        rows.append(row)
    return rows


def table(rows: list[Row], processes: int, arch: int, gpu: str, held_out: bool = True) -> str:
    where = "the task's shape, and a held-out batch where the model has one" if held_out else "the task's shape only"
    lines = [
        f"Compile stage for sm_{arch} on this host's CPU, {processes} process(es), first candidates for "
        f"the {gpu} model ({where}):",
        "",
        "| problem | form | launch sites | functions | cubins | compile (s) | vs the problem's first form |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    base: dict[str, float] = {}
    for r in rows:
        first = r.problem not in base
        if first:
            base[r.problem] = r.seconds
        ratio = f"{base[r.problem] / r.seconds:.2f}x" if not first and r.seconds and base[r.problem] else ""
        ratio = r.error or ratio
        cells = [r.problem, r.form, r.sites, r.functions, r.cubins, f"{r.seconds:.1f}", ratio]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a KernelBench checkout (holding level1, level2, ...)")
    parser.add_argument("--level", type=int, choices=(1, 2, 3), default=3)
    parser.add_argument("--problems", default="dev", help="'dev', 'all' or numbers: 9,19,15")
    parser.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="the GPU model the candidates are rendered for")
    parser.add_argument("--arch", type=int, default=90, help="the compute capability compiled for (90: Hopper)")
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="compile processes (the stage's share of cores)"
    )
    parser.add_argument(
        "--forms", default=",".join(FORMS), help=f"which renderings, comma-separated (default: {','.join(FORMS)})"
    )
    parser.add_argument(
        "--no-held-out",
        action="store_true",
        help="compile at the task's shape only (a run's first candidates: before the held-out shapes are known)",
    )
    parser.add_argument("--out", type=Path, help="append the table to this file")
    args = parser.parse_args(argv)
    forms = tuple(f.strip() for f in args.forms.split(",") if f.strip())
    if not forms or any(f not in FORMS for f in forms):
        parser.error(f"--forms {args.forms}: choose among {', '.join(FORMS)}")
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: use 1 or more")
    if lookup(args.gpu) is None:
        parser.error(f"--gpu {args.gpu!r}: no model of that GPU (actors/experts/template/hardware.py)")
    try:
        problems = select(args.root, args.level, args.problems)
    except BenchError as exc:
        parser.error(str(exc))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kf_compile_bench_") as work:
        for problem in problems:
            print(f"{problem.path.stem}:", flush=True)
            rows.extend(
                measure(problem.path, args.gpu, args.processes, args.arch, Path(work), forms, not args.no_held_out)
            )
    text = table(rows, args.processes, args.arch, args.gpu, held_out=not args.no_held_out)
    print("\n" + text)
    if args.out:
        with args.out.open("a", encoding="utf-8") as out:
            out.write("\n" + text)
    return 1 if any(r.error for r in rows if r.form != "declined") else 0


if __name__ == "__main__":
    raise SystemExit(main())
