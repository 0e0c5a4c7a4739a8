"""Write the GEMM family's first candidate and its Hopper-class variants for one reference, to
evaluate each with ``kfoundry eval`` (on the GPU machine) and compare.

``python -m bench.gemm_variants REFERENCE.py OUT_DIR [--gpu H100|H200|A100]`` writes
``first.py`` (the GPU model's first configuration), ``no_split.py``, ``ieee.py``,
``persistent.py``, ``tma.py`` and ``persistent_tma.py``, and prints one line per file with the
parameters that differ from the first. Then, per file::

    kfoundry eval REFERENCE.py OUT_DIR/first.py --device cuda [--profile-counters]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import TABLE, detect


def main(argv: list[str] | None = None) -> int:
    """Render the variants; exit 2 when the reference is not a product the template covers."""
    parser = argparse.ArgumentParser(prog="python -m bench.gemm_variants", description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--gpu", choices=sorted(TABLE), help="target model (default: this machine's GPU)")
    args = parser.parse_args(argv)
    plan = analyse(args.reference.read_text())
    if not isinstance(plan, Plan) or "mm" not in plan.template.split("+"):
        sys.stderr.write(f"not a matrix product the template covers: {plan}\n")
        return 2
    hw = TABLE[args.gpu] if args.gpu else detect()
    first = default_params(plan, hw)
    variants = {
        "first": first,
        "no_split": first.with_changes(mm_split_k=1),
        "ieee": first.with_changes(mm_precision="ieee"),
        "persistent": first.with_changes(mm_persistent=True),
        "tma": first.with_changes(mm_tma=True),
        "persistent_tma": first.with_changes(mm_persistent=True, mm_tma=True),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    base = first.as_dict()
    for name, params in variants.items():
        (args.out / f"{name}.py").write_text(render(plan, params))
        diff = {k: v for k, v in params.as_dict().items() if v != base[k]}
        mm = {k: v for k, v in base.items() if k.startswith("mm_")} if name == "first" else diff
        sys.stdout.write(f"{name:16s} on {hw.name}: {mm}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
