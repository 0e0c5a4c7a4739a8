"""Attention side by side on one GPU: eager, each SDPA backend, torch.compile, the template.

    python -m bench.attention_bench                                   # KernelBench's shapes and the whole sweep
    python -m bench.attention_bench --cases sweep --dims 64,128 --seqs 2048 --dtypes bfloat16 --causal yes
    python -m bench.attention_bench --best RUN_DIR --write-refs refs/ # and a kfoundry run's best_model.py
    TRITON_INTERPRET=1 python -m bench.attention_bench --device cpu --quick --no-compile --out /tmp/a.md

Cases (``bench.attention_cases``): KernelBench's L1-97 (SDPA, 32x32x512x1024 float32) and L3-43
MinGPT causal attention core (128x8x512x96 float32, explicit matmul-mask-softmax-matmul) as
published, and a sweep of head dims, sequence lengths, dtypes, causal or not (batch ``--tokens``/S,
heads ``--hidden``/D). Each case is a KernelBench-format reference written here (``--write-refs
DIR`` saves them, for ``kfoundry run``). Its rows, in one process on one device: eager (the
reference ``Model``, PyTorch's defaults), ``F.scaled_dot_product_attention`` with each backend
forced (math, efficient, flash, cuDNN; "n/a" with PyTorch's reason where one refuses the case),
``torch.compile`` (default mode), the template expert's first candidate (default parameters for this
GPU's model) and, with ``--best RUN_DIR``, the best model of the ``kfoundry run`` whose reference is
this case's (its ``report.json`` task id is the hash of the source). Each row: median ms (CUDA
events around each of ``--reps`` calls after ``--warmup``, the L2 flushed before each:
``bench.conv_bench.time_ms``), TFLOP/s (4*B*H*Sq*Sk*D, halved when causal), its share of the dense
peak of the dtype (fp32 CUDA-core peak for float32, 16-bit tensor-core peak otherwise), and its
error against float64 (relative L2 and max absolute, as conv_bench; the truth is the math path in
float64 on the same inputs, in chunks of batch-heads), also as a multiple of eager's own error. Rows
that would hold the whole score matrix (SDPA math; eager of the explicit form) are skipped over
``--max-gb``. An in-process measurement for ranking kernels, not the honest evaluator (``kfoundry
eval`` is). Prints each row as measured and the table last; writes it to ``--out`` (and JSON beside
it) after every case, so what is measured survives a timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import enum
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import CPU_FALLBACK, GpuModel, detect
from bench.attention_cases import DTYPES, Case, errors, kernelbench_cases, sweep_cases, truth_of
from bench.conv_bench import time_ms
from gpu_runner.sandboxed.reference import load_module
from schemas import source_fingerprint

SEED = 0
BACKENDS = (
    ("SDPA math", SDPBackend.MATH),
    ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("SDPA flash", SDPBackend.FLASH_ATTENTION),
    ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
)


class Status(enum.Enum):
    MEASURED = "measured"
    NA = "n/a"
    """The row does not apply (a backend refused, the template declined, skipped by a limit)."""
    FAILED = "failed"


@dataclass
class Row:
    """One row of the table; numbers are ``None`` where not measured."""

    case: str
    shape: str
    dtype: str
    causal: bool
    row: str
    status: Status
    note: str = ""
    ms: float | None = None
    tflops: float | None = None
    pct_peak: float | None = None
    rel_err: float | None = None
    max_err: float | None = None
    err_vs_eager: float | None = None
    setup_s: float | None = None


class NotApplicable(Exception):
    """A row that does not apply to the case, with the reason."""


def cpu_time_ms(fn: Callable[[], object], reps: int, warmup: int) -> float:
    """Median wall milliseconds of ``reps`` calls (no GPU: a check, not a speed)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@contextlib.contextmanager
def refusal_reasons(reasons: list[str]) -> Iterator[None]:
    """Collects PyTorch's warnings (why a backend was not used) into ``reasons``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = str(w.message).split("(Triggered internally")[0].strip()
        if text and not text.endswith("because:") and text not in reasons:
            reasons.append(text)


def _load(source: str, label: str, init: list[Any], ref: torch.nn.Module, device: str) -> torch.nn.Module:
    """A candidate file's ``ModelNew`` with the reference's state where the names match."""
    module = load_module(source, f"<{label}>", f"kf_attention_bench_{abs(hash(label))}")
    torch.manual_seed(SEED)
    new: torch.nn.Module = module["ModelNew"](*init).to(device)
    state = ref.state_dict()
    if set(new.state_dict()) == set(state):
        new.load_state_dict(state)
    return new


def bench_case(
    case: Case, args: argparse.Namespace, hw: GpuModel, best: dict[str, Path], flush: torch.Tensor | None
) -> list[Row]:
    """The rows of one case, in the table's order (``flush``: the L2 flush buffer on a GPU)."""
    dev = args.device
    ns = load_module(case.source, f"<{case.slug()}>", "kf_attention_bench_reference")
    init = list(ns["get_init_inputs"]())
    torch.manual_seed(SEED)
    model = ns["Model"](*init).to(dev).eval()
    torch.manual_seed(SEED + 1)
    with torch.device(dev):  # made where they are used: the published sizes are GBs
        inputs = [x.to(dev) for x in ns["get_inputs"]()]
    q, k, v = inputs
    truth = truth_of(inputs, case.causal)
    peak = (hw.fp32_tflops if case.dtype == "float32" else hw.bf16_tflops) if hw.is_gpu else None
    shape = f"{case.b}x{case.h}x{case.s}x{case.d}"
    rows: list[Row] = []
    eager_err: list[float] = []

    def row(
        label: str, make: Callable[[], Callable[[], object]], ctx: Callable[[], Any] = contextlib.nullcontext
    ) -> None:
        t0 = time.perf_counter()
        base = Row(case.name, shape, case.dtype, case.causal, label, Status.MEASURED)
        reasons: list[str] = []
        try:
            with torch.no_grad(), ctx():
                with refusal_reasons(reasons):
                    fn = make()
                    out = fn()
                rel, top = errors(cast(torch.Tensor, out), truth)
                del out
                ms = (
                    time_ms(fn, args.reps, args.warmup, flush)
                    if flush is not None
                    else cpu_time_ms(fn, args.reps, args.warmup)
                )
        except NotApplicable as exc:
            base.status, base.note = Status.NA, str(exc)
        except RuntimeError as exc:
            refused = "No available kernel" in str(exc) or "No viable backend" in str(exc)
            base.status = Status.NA if refused else Status.FAILED
            if refused:  # PyTorch's warnings say why (on a GPU); its error only that nothing ran
                why = "; ".join(reasons) or "refused: " + str(exc).split(". ")[0]
            else:
                why = f"{type(exc).__name__}: {exc}"
            base.note = why.replace("\n", " ")[:300]
        except Exception as exc:  # noqa: BLE001 - one row's failure is reported in its row
            base.status, base.note = Status.FAILED, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        else:
            tflops = case.flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
            base.ms, base.tflops, base.rel_err, base.max_err = ms, tflops, rel, top
            base.pct_peak = 100 * tflops / peak if peak else None
            if label.startswith("eager"):
                eager_err.append(rel)
            base.err_vs_eager = rel / eager_err[0] if eager_err and eager_err[0] > 0 else None
        base.setup_s = time.perf_counter() - t0
        rows.append(base)
        shown = f"{base.ms:.3f} ms, {base.tflops:.1f} TFLOP/s, rel err {base.rel_err:.1e}" if base.ms else ""
        print(f"{case.name} {shape} {case.dtype}{' causal' if case.causal else ''} | {label}: "
              f"{shown or f'{base.status.value}: {base.note}'}", flush=True)  # fmt: skip

    def within(limit_label: str) -> None:
        if case.scores_gb() > args.max_gb:
            raise NotApplicable(
                f"skipped: {limit_label} holds ~{case.scores_gb():.0f} GB of scores (--max-gb {args.max_gb:g})"
            )

    def eager() -> Callable[[], object]:
        if case.explicit:
            within("the explicit form")
        return lambda: model(*inputs)

    row("eager (the reference, PyTorch's defaults)", eager)
    for label, backend in BACKENDS:

        def forced(label: str = label) -> Callable[[], object]:
            if label == "SDPA math":
                within("the math path")
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

        row(label, forced, functools.partial(sdpa_kernel, backend))
    if args.compile:
        compiled = cast(Callable[..., object], torch.compile(model))
        row("torch.compile", lambda: lambda: compiled(*inputs))
    else:
        rows.append(Row(case.name, shape, case.dtype, case.causal, "torch.compile", Status.NA, "skipped: --no-compile"))

    def first() -> Callable[[], object]:
        if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise NotApplicable("on the CPU the Triton kernels need TRITON_INTERPRET=1")
        plan = analyse(case.source)
        if not isinstance(plan, Plan):
            raise NotApplicable(f"declined: {plan.detail}")
        new = _load(render(plan, default_params(plan, hw if hw.is_gpu else None)), "first", init, model, dev)
        return lambda: new(*inputs)

    row("template first candidate", first)
    run_dir = best.get(source_fingerprint(case.source))
    if run_dir is not None:
        text = (run_dir / "best_model.py").read_text(encoding="utf-8")
        row(
            f"run's best ({run_dir.name})",
            lambda: (lambda new: lambda: new(*inputs))(_load(text, "best", init, model, dev)),
        )
    torch._dynamo.reset()
    return rows


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "" if x is None else f"{x:{spec}}{suffix}"


def table(rows: list[Row], heading: str) -> str:
    lines = [
        heading,
        "",
        "| case | B x H x S x D | dtype | causal | row | ms | TFLOP/s | % peak | rel. L2 error | max abs error "
        "| err / eager's | vs eager | vs compile |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple[str, str, str, bool], dict[str, float]] = {}
    for r in rows:
        key = (r.case, r.shape, r.dtype, r.causal)
        if r.ms is not None and r.row.startswith(("eager", "torch.compile")):
            base.setdefault(key, {})["eager" if r.row.startswith("eager") else "compile"] = r.ms
    for r in rows:
        head = f"| {r.case} | {r.shape} | {r.dtype} | {'yes' if r.causal else 'no'} | {r.row} |"
        if r.ms is None:
            lines.append(f"{head} {r.status.value}: {r.note.replace('|', '/')} | | | | | | | | |")
            continue
        b = base.get((r.case, r.shape, r.dtype, r.causal), {})
        vs = [f"{b[k] / r.ms:.2f}x" if k in b and r.ms > 0 else "" for k in ("eager", "compile")]
        lines.append(
            f"{head} {r.ms:.3f} | {_fmt(r.tflops, '.1f')} | {_fmt(r.pct_peak, '.1f')} | {_fmt(r.rel_err, '.1e')} | "
            f"{_fmt(r.max_err, '.1e')} | {_fmt(r.err_vs_eager, '.2f', 'x')} | {vs[0]} | {vs[1]} |"
        )
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers")
    return values


def _dtypes(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in DTYPES]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated, each one of {', '.join(DTYPES)}")
    return values


def _runs(paths: list[Path], parser: argparse.ArgumentParser) -> dict[str, Path]:
    """Run directories by the task id of their reference (``report.json``), each with a ``best_model.py``."""
    found: dict[str, Path] = {}
    for path in paths:
        try:
            task_id = json.loads((path / "report.json").read_text(encoding="utf-8"))["task_id"]
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--best {path}: no report.json with a task_id ({type(exc).__name__}: {exc})")
        if not (path / "best_model.py").is_file():
            parser.error(f"--best {path}: no best_model.py (the run found no correct candidate)")
        found[str(task_id)] = path
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attention_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", choices=["kernelbench", "sweep", "all"], default="all")
    parser.add_argument("--dims", type=_ints, default=None, help="sweep head dims (default 64,128,256,1024)")
    parser.add_argument("--seqs", type=_ints, default=None, help="sweep sequence lengths (default 512,2048,8192)")
    parser.add_argument("--dtypes", type=_dtypes, default=list(DTYPES), help="sweep dtypes (default all three)")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both", help="sweep: causal, not, both")
    parser.add_argument("--tokens", type=int, default=16384, help="sweep: batch x sequence length (default 16384)")
    parser.add_argument("--hidden", type=int, default=2048, help="sweep: heads x head dim (default 2048)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a check on the CPU, not a speed)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per row (default 20, 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-gb", type=float, default=16.0, help="skip rows that hold more score matrix (GB)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    parser.add_argument("--best", type=Path, action="append", default=[], help="a kfoundry run directory (repeatable)")
    parser.add_argument("--write-refs", type=Path, default=None, help="save each case's reference here (<slug>.py)")
    parser.add_argument("--out", type=Path, default=None, help="markdown table (and .json beside it); "
                        "default bench/results/attention_bench.md, none with --quick")  # fmt: skip
    args = parser.parse_args(argv)
    args.reps = args.reps if args.reps is not None else 3 if args.quick else 20
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.stderr.write("attention_bench: needs a CUDA GPU (a check here: --device cpu --quick)\n")
        return 1
    best = _runs(args.best, parser)
    causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    dims = args.dims or ([16, 64] if args.quick else [64, 128, 256, 1024])
    seqs = args.seqs or ([40] if args.quick else [512, 2048, 8192])
    cases = kernelbench_cases(args.quick) if args.cases in ("kernelbench", "all") else []
    if args.cases in ("sweep", "all"):
        cases += sweep_cases(dims, seqs, args.dtypes, causal, args.tokens, args.hidden, args.quick)
    unmatched = set(best) - {source_fingerprint(c.source) for c in cases}
    for task_id in sorted(unmatched):
        print(f"--best {best[task_id]}: its reference is none of the selected cases (see --write-refs)", flush=True)
    out = args.out or (None if args.quick else Path("bench/results/attention_bench.md"))
    if args.write_refs is not None:
        args.write_refs.mkdir(parents=True, exist_ok=True)
        for case in cases:
            (args.write_refs / f"{case.slug()}.py").write_text(case.source, encoding="utf-8")
    hw = detect() if args.device == "cuda" else CPU_FALLBACK
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    meta = {
        "device": device,
        "torch": torch.__version__,
        "commit": commit.stdout.strip() or None,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.attention_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "peaks_tflops": {"fp32": hw.fp32_tflops, "bf16": hw.bf16_tflops} if hw.is_gpu else None,
    }
    timing = (
        f"Time (median of {args.reps} calls after {args.warmup}, CUDA events, L2 flushed before each)"
        if args.device == "cuda"
        else f"Wall time (median of {args.reps} calls; the CPU and Triton's interpreter: a check, not a speed)"
    )
    heading = (
        f"# Attention side by side on {device} ({meta['date']}, torch {meta['torch']}, at {meta['commit']}: "
        f"`{meta['command']}`)\n\n{timing}, TFLOP/s "
        "(4·B·H·S²·D, halved when causal), share of the dtype's dense peak, error against the float64 math path."
    )
    print(f"{device}: {len(cases)} cases", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if args.device == "cuda" else None
    rows: list[Row] = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name} {case.b}x{case.h}x{case.s}x{case.d} {case.dtype}", flush=True)
        rows += bench_case(case, args, hw, best, flush)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        if out is not None:  # what is measured so far survives a timeout
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(table(rows, heading), encoding="utf-8")
            done = [
                {**asdict(c), "source": None, "slug": c.slug(), "task_id": source_fingerprint(c.source)}
                for c in cases[:i]
            ]
            payload = {**meta, "cases": done, "rows": [asdict(r) for r in rows]}
            out.with_suffix(".json").write_text(
                json.dumps(payload, indent=1, default=lambda s: s.value), encoding="utf-8"
            )
    print(table(rows, heading))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
