"""Time the convolution template's reduction orders and tile layouts side by side on one GPU.

With ``--sweep``, the first candidate in one TF32 pass (as precision parity admits) and tile shapes,
warps and stages around it instead.

For each KernelBench-format reference (a KernelBench checkout's convolution problems, say) it
renders the template expert's first candidate for this GPU and its variants in the orders of
``conv_taps_outer`` / ``conv_a_transposed`` / ``conv_precision``, loads each in this process
(``gpu_runner.sandboxed.reference.load_module``, as the worker loads candidates),
copies the reference's weights into it, checks its output against the reference's in IEEE fp32
(TF32 off) and times it with CUDA events against eager PyTorch (cuDNN in TF32, PyTorch's default),
mean of ``--reps`` calls after one warm-up. This is a quick in-process comparison of kernels, not
the honest evaluator (``kfoundry eval`` is): the numbers rank the variants.

    python -m bench.conv_orders KernelBench/level1/63_conv_standard_2D__square_input__square_kernel.py ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from actors.experts.template import Plan, TemplateParams, analyse, default_params, render
from actors.experts.template.errors import InvalidParams
from actors.experts.template.hardware import detect
from gpu_runner.sandboxed.reference import load_module

_VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("flat", {"conv_taps_outer": False}),
    ("taps", {"conv_taps_outer": True, "conv_a_transposed": False}),
    ("taps, rows fast", {"conv_taps_outer": True, "conv_a_transposed": True}),
    ("taps, rows fast, ieee", {"conv_taps_outer": True, "conv_a_transposed": True, "conv_precision": "ieee"}),
    ("taps, tf32x3", {"conv_taps_outer": True, "conv_a_transposed": False, "conv_precision": "tf32x3"}),
    ("fma", {"conv_precision": "fma"}),
)


def _tiles(bm: int, bn: int, bk: int, warps: int, stages: int, **more: object) -> tuple[str, dict[str, object]]:
    label = f"tf32 {'flat ' if more.get('conv_taps_outer') is False else ''}{bm}x{bn}x{bk} w{warps} s{stages}"
    label += " rows fast" if more.get("conv_a_transposed") else ""
    tiles = {"conv_block_m": bm, "conv_block_n": bn, "conv_block_k": bk, "conv_warps": warps, "conv_stages": stages}
    return label, {**tiles, **more}


_SWEEP: tuple[tuple[str, dict[str, object]], ...] = (
    _tiles(128, 64, 32, 4, 3),
    _tiles(128, 64, 32, 4, 4),
    _tiles(128, 128, 32, 4, 3),
    _tiles(128, 128, 32, 8, 3),
    _tiles(128, 128, 32, 8, 4),
    _tiles(256, 64, 32, 8, 3),
    _tiles(256, 128, 32, 8, 2),
    _tiles(256, 128, 32, 8, 3),
    _tiles(256, 128, 16, 8, 4),
    _tiles(128, 128, 64, 8, 2),
    _tiles(64, 128, 32, 4, 4),
)
"""``--sweep``: tile shapes, warps and stages in one TF32 pass (the first candidate's order unless
the label says flat), for choosing the first candidate's tiles on a GPU."""


def _layouts() -> tuple[tuple[str, dict[str, object]], ...]:
    rows: list[tuple[str, dict[str, object]]] = []
    tiles = ((128, 64, 32, 4, 3), (256, 64, 32, 8, 3), (128, 128, 32, 8, 3), (256, 128, 16, 8, 3))
    for bm, bn, bk, warps, stages in tiles:
        for label, more in (
            ("pre-rounded", {"conv_preround": True}),
            ("nhwc", {"conv_layout": "nhwc"}),
            ("nhwc pre-rounded", {"conv_layout": "nhwc", "conv_preround": True}),
        ):
            if label == "nhwc" and (bm, bn) != (128, 64):
                continue
            tile_label, changes = _tiles(bm, bn, bk, warps, stages, **more)
            rows.append((f"{tile_label} {label}", changes))
    return tuple(rows)


def _exact() -> tuple[tuple[str, dict[str, object]], ...]:
    rows: list[tuple[str, dict[str, object]]] = []
    for bm, bk, warps, stages, more in (
        (128, 16, 4, 4, ""), (128, 16, 4, 4, "nhwc"), (128, 16, 4, 3, "nhwc"), (128, 32, 4, 3, "nhwc"),
        (128, 32, 4, 4, "nhwc"), (128, 32, 4, 4, ""), (256, 16, 8, 4, ""), (64, 16, 4, 4, ""), (128, 16, 2, 4, ""),
        (128, 16, 4, 4, "rows fast"), (256, 16, 8, 4, "nhwc"),
    ):  # fmt: skip
        changes: dict[str, object] = {
            "conv_block_m": bm,
            "conv_block_k": bk,
            "conv_warps": warps,
            "conv_stages": stages,
        }
        if more == "nhwc":
            changes["conv_layout"] = "nhwc"
        elif more == "rows fast":
            changes["conv_a_transposed"] = True
        rows.append((f"tf32x3 flat {bm}xNx{bk} w{warps} s{stages} {more}".rstrip(), changes))
    return tuple(rows)


_EXACT = _exact()
"""``--sweep exact``: three TF32 passes (``tf32x3``, an exact task's precision) in the flat order,
from the model's layout or a channels-last copy (``nhwc``), gathered rows fast or not, in tiles
around the first candidate's (its channel tile, N, kept)."""

_LAYOUT = _layouts()
"""``--sweep layout``: the input copied channels-last (``conv_layout``) and the operands rounded to
TF32 once before the loop (``conv_preround``), in the tiles around the first candidate's."""


def _ms(fn: Callable[..., Any], args: list[Any], reps: int) -> float:
    fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / reps


def bench(path: Path, reps: int, sweep: str | None = None) -> list[str]:
    """One table row per variant of the reference at ``path``."""
    source = path.read_text(encoding="utf-8")
    plan = analyse(source)
    if not isinstance(plan, Plan) or "conv" not in plan.template.split("+"):
        return [f"| {path.stem} | not a convolution the template covers | | | |"]
    ref = load_module(source, str(path), "kf_conv_orders_reference")
    torch.manual_seed(0)
    model = ref["Model"](*ref["get_init_inputs"]()).cuda()
    inputs = [x.cuda() if torch.is_tensor(x) else x for x in ref["get_inputs"]()]
    rows: list[str] = []
    with torch.no_grad():
        eager = _ms(model, inputs, reps)
        torch.backends.cudnn.allow_tf32 = False
        want = model(*inputs)
        torch.backends.cudnn.allow_tf32 = True
        first = default_params(plan, detect(), tf32=sweep not in (None, "exact"))
        variants: list[tuple[str, TemplateParams]] = [("first", first)]
        listed = {"tiles": _SWEEP, "layout": _LAYOUT, "exact": _EXACT}.get(sweep or "", _VARIANTS)
        for label, changes in listed:
            if sweep == "exact":
                changes = {"conv_precision": "tf32x3", "conv_taps_outer": False, **changes}
            elif sweep:
                changes = {"conv_precision": "tf32", "conv_taps_outer": True, **changes}
            try:
                variants.append((label, first.with_changes(**changes)))
            except InvalidParams as exc:  # e.g. fma's tile too large for its warps
                rows.append(f"| {path.stem} | {label} | invalid: {exc} | | |")
        for i, (label, params) in enumerate(variants):
            conv = {k[5:]: v for k, v in params.as_dict().items() if k.startswith("conv_")}
            try:
                module = load_module(render(plan, params), f"<{path.stem} candidate {i}>", f"kf_conv_orders_{i}")
                new = module["ModelNew"](*ref["get_init_inputs"]()).cuda()
                new.load_state_dict(model.state_dict())
                err = float((new(*inputs) - want).abs().max())
                ms = _ms(new, inputs, reps)
            except Exception as exc:  # noqa: BLE001 - a variant that fails to build or run is a row, not the end
                rows.append(f"| {path.stem} | {label} | failed: {type(exc).__name__}: {str(exc)[:120]} | | {conv} |")
                continue
            timing = f"{ms:.3f} ({eager / ms:.2f}x of eager {eager:.3f})"
            rows.append(f"| {path.stem} | {label} | {timing} | {err:.1e} | {conv} |")
            del module, new
    del model, inputs, want
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_orders", description=__doc__.splitlines()[0])
    parser.add_argument("references", nargs="+", type=Path)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="tiles",
        choices=("tiles", "layout", "exact"),
        help="instead of the orders, in TF32: tile shapes, warps and stages (tiles, the default), or "
        "the channels-last input and operands rounded before the loop (layout); or in three TF32 "
        "passes, the exact rule's precision: the flat order's gathers and tiles (exact)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.stderr.write("conv_orders: needs a CUDA GPU\n")
        return 2
    print(f"{torch.cuda.get_device_name()}: ms per call (mean of {args.reps}), max |error| against IEEE fp32 eager")
    print("| problem | variant | ms | max error | conv parameters |")
    print("|---|---|---|---|---|")
    for path in args.references:
        for row in bench(path, args.reps, args.sweep):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
