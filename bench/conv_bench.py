"""Convolutions of the development subset side by side on one GPU: PyTorch, torch.compile, the template.

    python -m bench.conv_bench KERNELBENCH_ROOT                      # every level, max-autotune included
    python -m bench.conv_bench KB --levels 1 --problems 63,54 --no-autotune
    python -m bench.conv_bench KB --best /tmp/kf-kbench              # and each run's best_model.py

For every convolution problem of the development subset (``actors.kbench.problems.DEV_SUBSET``:
files whose source builds or calls a convolution), at its published size, on one GPU and in one
process, it times: eager PyTorch at its defaults (cuDNN in TF32), eager with TF32 off,
``torch.compile`` default and ``max-autotune``, the template expert's first candidate (under
precision parity: one TF32 pass where the reference runs cuDNN in TF32) and, with ``--best``, the
best model a ``kfoundry bench`` run left (``<best>/runs/level<L>_<NNN>/best_model.py``). Each row
gets its median time (CUDA events around each of ``--reps`` calls after ``--warmup`` calls, the L2
flushed before each), its TFLOP/s (the reference's FLOPs, ``torch.utils.flop_counter``), its share
of the GPU's dense TF32 and fp32 peaks (``actors.experts.template.hardware.detect``), and its
error against the float64 run of the same model on the same inputs (relative L2 and max absolute).
The candidates share the reference's weights (the same seed, the state copied where the names
match). This is an in-process measurement for ranking kernels, not the honest evaluator
(``kfoundry eval`` is). Prints each row as it is measured and the table last; writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import GpuModel, detect
from actors.experts.template.kernels.conv import cudnn_ieee_likely
from actors.kbench.errors import BenchError
from actors.kbench.problems import DEV_SUBSET, Problem, level_dir, list_problems, select
from gpu_runner.sandboxed.reference import load_module

CONV = re.compile(r"nn\.Conv(Transpose)?[123]d|F\.conv(_transpose)?[123]d|torch\.conv(_transpose)?[123]d")
"""A problem is a convolution problem when its source builds or calls one of these."""
SEED = 0


def conv_problems(root: Path, levels: list[int], spec: str | None) -> list[Problem]:
    """The development subset's convolution problems of ``levels`` (``spec``: only these numbers)."""
    picked: list[Problem] = []
    for level in levels:
        # Every development problem the checkout has, or exactly the ones asked for (missing: refused).
        chosen = select(root, level, spec) if spec else list(list_problems(level_dir(root, level), level).values())
        for problem in chosen:
            if problem.number in DEV_SUBSET[level] and CONV.search(problem.path.read_text(encoding="utf-8")):
                picked.append(problem)
    return sorted(picked, key=lambda p: (p.level, p.number))


def _flush_buffer() -> torch.Tensor:
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def time_ms(fn: Callable[[], object], reps: int, warmup: int, flush: torch.Tensor) -> float:
    """Median milliseconds of ``reps`` calls (CUDA events), the L2 flushed before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def _first_tensor(out: object) -> torch.Tensor:
    if isinstance(out, tuple | list):
        out = out[0]
    assert isinstance(out, torch.Tensor)
    return out


CHUNK = 1 << 26
"""Elements compared at a time: a whole float64 copy of L1-63's 8 GiB output and its difference
(32 GiB) beside the 16 GiB truth ran an 80 GB H100 out of memory."""


def errors(out: object, truth: torch.Tensor) -> tuple[float, float]:
    """Relative L2 and max absolute error of ``out`` against the float64 ``truth`` (in chunks)."""
    o, t = _first_tensor(out).reshape(-1), truth.reshape(-1)
    if o.numel() != t.numel():
        raise ValueError(f"output of {o.numel()} elements against a truth of {t.numel()}")
    squares, truth_squares, top = 0.0, 0.0, 0.0
    for start in range(0, t.numel(), CHUNK):
        tc = t[start : start + CHUNK]
        diff = o[start : start + CHUNK].double() - tc
        squares += float(diff.square().sum())
        truth_squares += float(tc.square().sum())
        top = max(top, float(diff.abs().max())) if diff.numel() else top
    norm, err = truth_squares**0.5, squares**0.5
    return err / norm if norm else err, top


def flops_of(model: torch.nn.Module, inputs: list[Any]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return int(counter.get_total_flops())


def _candidate(source: str, label: str, init: list[Any], ref: torch.nn.Module) -> torch.nn.Module:
    """A candidate file's ``ModelNew``, built with the reference's seed and given its weights where the names match."""
    module = load_module(source, f"<{label}>", f"kf_conv_bench_{abs(hash(label))}")
    torch.manual_seed(SEED)
    new: torch.nn.Module = module["ModelNew"](*init).cuda()
    state = ref.state_dict()
    if set(new.state_dict()) == set(state):
        new.load_state_dict(state)
    return new


def bench_problem(
    problem: Problem, hw: GpuModel, reps: int, warmup: int, autotune: bool, best: Path | None, flush: torch.Tensor
) -> list[dict[str, Any]]:
    """The rows of one problem (a row whose model fails carries the error instead of numbers)."""
    source = problem.path.read_text(encoding="utf-8")
    ns = load_module(source, str(problem.path), "kf_conv_bench_reference")
    init = list(ns["get_init_inputs"]())
    torch.manual_seed(SEED)
    # In training mode, as KernelBench and the evaluator run it (a batch norm then normalises by
    # the batch's statistics, as the candidates do); ``eval()`` here compared L2-52's candidates
    # with running statistics and reported an error of 4.6 for kernels the evaluator judged right.
    model = ns["Model"](*init).cuda()
    torch.manual_seed(SEED + 1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    with torch.no_grad():
        model64 = copy.deepcopy(model).double()
        truth = _first_tensor(model64(*[x.double() if isinstance(x, torch.Tensor) else x for x in inputs])).detach()
        del model64
        flops = flops_of(model, inputs)
    name = f"L{problem.level}-{problem.number} {problem.name}"
    rows: list[dict[str, Any]] = []

    def row(label: str, make: Callable[[], Callable[[], object]], tf32: bool = True) -> None:
        torch.backends.cudnn.allow_tf32 = tf32
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                fn = make()
                rel, top = errors(fn(), truth)
                ms = time_ms(fn, reps, warmup, flush)
        except Exception as exc:  # noqa: BLE001 - one row's failure is reported in its row
            rows.append({"problem": name, "row": label, "error": f"{type(exc).__name__}: {exc}"[:160]})
            print(f"{name} | {label}: {rows[-1]['error']}", flush=True)
            return
        finally:
            torch.backends.cudnn.allow_tf32 = True
        tflops = flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
        rows.append(
            {
                "problem": name,
                "row": label,
                "ms": ms,
                "tflops": tflops,
                "pct_tf32": 100 * tflops / hw.tf32_tflops,
                "pct_fp32": 100 * tflops / hw.fp32_tflops,
                "rel_err": rel,
                "max_err": top,
                "setup_s": time.perf_counter() - t0,
            }
        )
        print(f"{name} | {label}: {ms:.3f} ms, {tflops:.1f} TFLOP/s, rel err {rel:.1e}", flush=True)

    row("eager (TF32, PyTorch's default)", lambda: lambda: model(*inputs))
    row("eager, TF32 off", lambda: lambda: model(*inputs), tf32=False)
    compiled = cast(Callable[..., object], torch.compile(model))
    row("torch.compile", lambda: lambda: compiled(*inputs))
    if autotune:
        tuned = cast(Callable[..., object], torch.compile(model, mode="max-autotune"))
        row("torch.compile max-autotune", lambda: lambda: tuned(*inputs))
    plan = analyse(source)
    if isinstance(plan, Plan):
        # The expert's first candidate: TF32 where PyTorch allows it, unless cuDNN probably runs the
        # reference in IEEE fp32 (few input channels), where the evaluator would refuse TF32.
        tf32 = torch.backends.cudnn.allow_tf32 and not cudnn_ieee_likely(plan)
        first = render(plan, default_params(plan, hw, tf32=tf32))
        row("template first candidate", lambda: _callable(first, "first", init, model, inputs))
    else:
        rows.append({"problem": name, "row": "template first candidate", "error": f"declined: {plan}"[:160]})
    if best is not None:
        path = best / "runs" / f"level{problem.level}_{problem.number:03d}" / "best_model.py"
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            row("run's best", lambda: _callable(text, f"best {name}", init, model, inputs))
        else:
            rows.append({"problem": name, "row": "run's best", "error": f"no {path}"})
    torch._dynamo.reset()  # the models go with this frame; the caller empties the cache
    return rows


def _callable(
    source: str, label: str, init: list[Any], ref: torch.nn.Module, inputs: list[Any]
) -> Callable[[], object]:
    new = _candidate(source, label, init, ref)
    return lambda: new(*inputs)


def table(rows: list[dict[str, Any]], device: str) -> str:
    lines = [
        f"# Development convolutions on {device}: time, TFLOP/s, share of the dense peaks, error against float64",
        "",
        "| problem | row | ms | TFLOP/s | % TF32 peak | % fp32 peak | rel. L2 error | max abs error "
        "| vs eager | vs compile |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[str, dict[str, float]] = {}
    for r in rows:
        if "ms" in r and r["row"].startswith(("eager (TF32", "torch.compile")) and "max-autotune" not in r["row"]:
            base.setdefault(r["problem"], {})["eager" if r["row"].startswith("eager") else "compile"] = r["ms"]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['problem']} | {r['row']} | {r['error']} | | | | | | | |")
            continue
        b = base.get(r["problem"], {})
        vs = [f"{b[k] / r['ms']:.2f}x" if k in b and r["ms"] > 0 else "" for k in ("eager", "compile")]
        lines.append(
            f"| {r['problem']} | {r['row']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['pct_tf32']:.1f} | "
            f"{r['pct_fp32']:.1f} | {r['rel_err']:.1e} | {r['max_err']:.1e} | {vs[0]} | {vs[1]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_bench", description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a KernelBench checkout (level1/ ... or KernelBench/level1/ ...)")
    parser.add_argument("--levels", default="1,2,3", help="comma-separated levels (default 1,2,3)")
    parser.add_argument("--problems", default=None, help="only these problem numbers (with one level)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-autotune", dest="autotune", action="store_false", help="skip torch.compile max-autotune")
    parser.add_argument(
        "--best", type=Path, default=None, help="a kfoundry bench folder: time each run's best_model.py"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/conv_bench.md"))
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels {args.levels!r}: comma-separated integers")
    if any(level not in DEV_SUBSET for level in levels):
        parser.error(f"--levels {args.levels}: the development subset has levels {sorted(DEV_SUBSET)}")
    if args.problems and len(levels) != 1:
        parser.error("--problems needs exactly one --levels")
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        sys.stderr.write("conv_bench: needs a CUDA GPU\n")
        return 1
    try:
        problems = conv_problems(args.root, levels, args.problems)
    except BenchError as exc:
        parser.error(str(exc))
    if not problems:
        parser.error("no convolution problem of the development subset was selected")
    hw = detect()
    device = torch.cuda.get_device_name()
    peaks = f"dense peaks TF32 {hw.tf32_tflops:g}, fp32 {hw.fp32_tflops:g} TFLOP/s"
    print(f"{device}: {len(problems)} convolution problems; {peaks}")
    flush = _flush_buffer()
    rows: list[dict[str, Any]] = []
    for i, problem in enumerate(problems, 1):
        print(f"[{i}/{len(problems)}] L{problem.level}-{problem.number} {problem.name}", flush=True)
        rows += bench_problem(problem, hw, args.reps, args.warmup, args.autotune, args.best, flush)
        torch.cuda.empty_cache()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table(rows, device), encoding="utf-8")  # what is measured so far survives a timeout
    print(table(rows, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
