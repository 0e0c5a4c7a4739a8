"""Which kernel of a template candidate computes differently here: launch-by-launch checksums.

A candidate that is right under the Triton interpreter (CPU) and wrong on a GPU has a kernel the
compiler got wrong, or one whose result depends on the order its programs run in. This script
renders the template's first candidate for a KernelBench-format reference (every launch through
``triton.jit``, no shared buffer, so each launch's arguments are its own tensors), runs its
forward once on the reference's seeded inputs and records, after every launch, checksums of each
tensor argument (sum, absolute sum, a position-weighted sum, NaN count). Record once under the
interpreter and once on the GPU, then compare: the first launch whose outputs differ while its
inputs agree is the kernel to look at.

    TRITON_INTERPRET=1 python -m bench.launch_diff REF.py --record cpu.json
    python -m bench.launch_diff REF.py --record gpu.json --against cpu.json

``--set NAME=VALUE`` overrides a module-level size of the reference (e.g. ``batch_size=2``, so
the interpreter's run stays short; both recordings need the same), ``--hardware H200`` renders
with that GPU model's first parameters (the interpreter's recording must use the same).
Found this way (2026-12-02): KernelBench L3-22's 5x5 stride-2 depthwise convolution, launch 50 of
60, the first of its launches to differ on an H200.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Checksum = list[float] | None
Record = tuple[str, list[Checksum]]

TOLERANCE = 1e-4
"""A checksum differs when it moves by more than this share of the argument's absolute sum."""


def checksum(t: Any) -> Checksum:
    """Sum, absolute sum, a position-weighted sum (weights -3..3 by index mod 7) and NaN count of a
    tensor; None for anything else."""
    import torch

    if not isinstance(t, torch.Tensor):
        return None
    d = t.detach().double().flatten()
    w = (torch.arange(d.numel(), device=d.device, dtype=torch.float64) % 7) - 3
    finite = torch.nan_to_num(d, nan=0.0)
    return [float(finite.sum()), float(finite.abs().sum()), float((finite * w).sum()), float(torch.isnan(d).sum())]


def with_sizes(source: str, sets: list[str]) -> str:
    """The reference with module-level ``NAME = <int>`` lines replaced per ``NAME=VALUE``."""
    for item in sets:
        name, _, value = item.partition("=")
        if not name.isidentifier() or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"--set wants NAME=INTEGER, got {item!r}")
        source, count = re.subn(rf"^{name}\s*=\s*-?\d+\s*$", f"{name} = {int(value)}", source, flags=re.M)
        if count == 0:
            raise SystemExit(f"--set {name}: the reference has no module-level line '{name} = <integer>'")
    return source


class _Recorded:
    """Stands in for one ``triton.jit`` kernel of the candidate's module: launches it and records."""

    def __init__(self, name: str, fn: Any, records: list[Record], sync: Callable[[], None]) -> None:
        self.name, self.fn, self.records, self.sync = name, fn, records, sync

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self.fn[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            result = launch(*args, **kwargs)
            self.sync()
            self.records.append((self.name, [checksum(a) for a in args]))
            return result

        return run


def record(reference: str, hardware: str | None, seed: int = 0) -> list[Record]:
    """Every launch of the template's first candidate for ``reference`` with its arguments'
    checksums after it, on CUDA where there is one (else the interpreter must be on)."""
    import torch

    from actors.experts.template import Plan, analyse, default_params, render
    from actors.experts.template.hardware import lookup
    from gpu_runner.sandboxed.reference import load_module

    plan = analyse(reference)
    if not isinstance(plan, Plan):
        raise SystemExit(f"the template declines this reference: {plan}")
    hw = lookup(hardware) if hardware else None
    if hardware and hw is None:
        raise SystemExit(f"--hardware {hardware}: not a known GPU model")
    candidate = render(plan, default_params(plan, hw), direct=False, arena=False)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    records: list[Record] = []
    # as the evaluator loads them (its linecache entry lets triton.jit read a kernel's source)
    ref = load_module(reference, "<kf_diff_reference>", "kf_diff_reference")
    cand = load_module(candidate, "<kf_diff_candidate>", "kf_diff_candidate")
    for name, value in list(cand.items()):
        if name.startswith("_kf_") and hasattr(value, "arg_names"):
            cand[name] = _Recorded(name, value, records, sync)
    init = list(ref["get_init_inputs"]())
    torch.manual_seed(seed)
    inputs = list(ref["get_inputs"]())
    torch.manual_seed(seed + 1)
    model = cand["ModelNew"](*init).to("cuda" if cuda else "cpu")
    with torch.no_grad():
        model(*[x.to("cuda") if cuda and isinstance(x, torch.Tensor) else x for x in inputs])
    return records


def compare(mine: list[Record], theirs: list[Record]) -> list[str]:
    """One line per launch: ``ok`` or the arguments whose checksums differ; the first launch that
    differs is marked. Raises SystemExit if the two runs launched different kernels."""
    if [n for n, _ in mine] != [n for n, _ in theirs]:
        raise SystemExit("the two recordings launched different kernels: render them with the same settings")
    lines: list[str] = []
    first = True
    for i, ((name, a), (_, b)) in enumerate(zip(mine, theirs, strict=True)):
        bad = []
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            if x is None or y is None:
                continue
            scale = max(x[1], y[1], 1e-30)
            moved = max(abs(x[0] - y[0]), abs(x[2] - y[2])) / scale
            if moved > TOLERANCE or x[3] != y[3]:
                bad.append(f"arg {j} moved {moved:.2e}" + (f", NaNs {x[3]:.0f} vs {y[3]:.0f}" if x[3] != y[3] else ""))
        mark = "  <- first difference" if bad and first else ""
        first = first and not bad
        lines.append(f"{i:4d} {name}: " + ("ok" if not bad else "; ".join(bad)) + mark)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="a KernelBench-format reference file")
    parser.add_argument("--record", type=Path, required=True, help="write this run's checksums here (JSON)")
    parser.add_argument("--against", type=Path, help="compare with an earlier recording")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a module-level size")
    parser.add_argument("--hardware", help="render with this GPU model's first parameters (H200, H100, A100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.reference.is_file():
        parser.error(f"{args.reference}: no such file")
    records = record(with_sizes(args.reference.read_text(), args.set), args.hardware, args.seed)
    args.record.write_text(json.dumps(records))
    print(f"{len(records)} launches recorded in {args.record}")
    if args.against is not None:
        theirs = [(n, c) for n, c in json.loads(args.against.read_text())]
        lines = compare(records, theirs)
        print("\n".join(lines))
        return 1 if any("first difference" in line for line in lines) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
