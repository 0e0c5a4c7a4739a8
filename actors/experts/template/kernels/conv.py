"""Convolution kernels (``emit_conv``): implicit GEMMs over output positions x output channels,
the reduction over input channels x taps in ``tl.dot`` (ieee, three TF32 passes, or one where
precision parity admits the reference's own TF32), or outer products in ``fma`` for narrow ones.

The ``conv_*`` parameters are shared by every convolution of a plan: they are chosen from the one
with the most products (:func:`_heaviest_conv`)."""

from __future__ import annotations

import math

from actors.experts.template.emit_conv import ConvWriter, outer_products
from actors.experts.template.emit_mm import element_size
from actors.experts.template.emit_row import next_pow2
from actors.experts.template.fuse import Kernel, KernelKind, Schedule, schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import ConvSpec, Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.params import TemplateParams

_TILING = (
    "conv_block_m", "conv_block_n", "conv_block_k", "conv_warps", "conv_stages", "conv_precision", "conv_taps_outer",
    "conv_a_transposed", "conv_layout", "conv_preround",
)  # fmt: skip


def _defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    return _conv_defaults(plan, sched)


def _fit(hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values) -> dict[str, object]:
    # As for products: cuDNN runs fp32 convolutions in TF32 (PyTorch's default), while a
    # candidate must be fp32-accurate; the first convolutions of the level-1 development
    # subset on an H200, in ieee fp32 (no tensor cores), ran at 0.11-0.13x of eager. A plan
    # of narrow ones keeps the fma that ``_conv_defaults`` chose, and forward convolutions
    # of several taps walked taps outside keep ieee (``_forward_taps_ieee``).
    wide = hw.tf32x3_pays and element_size(plan.nodes[kernel.mm].dtype) == 4 and not _convs_all_narrow(plan, sched)
    if wide and tf32:
        # The reference's own precision (cuDNN's TF32), admitted by precision parity: one
        # tensor-core pass instead of three, in the tiles that suit it (``_tf32_conv_tiles``).
        return {"conv_precision": "tf32", **_tf32_conv_tiles(plan, sched)}
    if wide and not _forward_taps_ieee(plan, sched):
        if _taps_outer_pays(plan, sched):
            return {"conv_precision": "tf32x3"}
        return {"conv_precision": "tf32x3", **_flat_tf32x3(plan, sched)}
    return {}


def _flat_tf32x3(plan: Plan, sched: Schedule) -> dict[str, object]:
    """The flat order's steps in three TF32 passes (convolutions of 2 to 15 input channels, judged
    at exact precision where cuDNN computes them in IEEE fp32): 16 of (input channel, tap) per
    step, 4 stages, 4 warps, or 2 for 4 input channels or fewer or a channel tile of 32 or fewer.

    On an H200 (``python -m bench.conv_orders --sweep exact``, 2026-12-02, published sizes, whole
    candidates), against the earlier 32 per step, 8 warps (4 below 8192 tile elements) and 2
    stages: KernelBench L2-67 2.83 ms against 4.25, L2-73 0.90 against 1.47, L2-92 1.89 against
    2.47 (4 warps; 2 warps ran 1.21-1.77x slower); L1-54 (3 channels) 1.86 against 3.80, L2-6
    (3 channels, 16 output channels) 0.40 against 0.66, L2-21 (32 output channels) 2.59 against
    2.82 (2 warps; 4 ran 1.10-1.30x slower). Gathering the tile rows fast (``conv_a_transposed``)
    and reading a channels-last copy (``conv_layout``) each gained on one of the six (rows fast
    L1-54 by 2%; channels-last L2-21, 2.44 ms against 2.84) and lost up to 1.18x and 1.09x on the
    others (4 warps, 4 stages): the search may still choose them."""
    conv = _heaviest_conv(plan, sched)
    narrow = _cin_per_group(plan, conv) <= 4 or _cout_per_group(plan, conv) <= 32  # the channel tile's
    return {"conv_block_k": 16, "conv_warps": 2 if narrow else 4, "conv_stages": 4}


def _relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    return _conv_relevant(plan, kernel.mm, params)


def _cout_per_group(plan: Plan, conv: int) -> int:
    node = plan.nodes[conv]
    return int(node.shape[1]) // ConvSpec.from_attrs(node.attrs).groups


def _convs_all_narrow(plan: Plan, sched: Schedule) -> bool:
    """Whether every convolution of the plan has fewer than 16 output channels per group (the
    ``conv_*`` parameters are shared by all of them: a depthwise convolution followed by a
    pointwise one keeps ``tl.dot``, which the pointwise one needs)."""
    convs = _convs(sched)
    return bool(convs) and all(_cout_per_group(plan, c) < 16 for c in convs)


def _convs(sched: Schedule) -> list[int]:
    """The plan's convolution nodes, one per convolution kernel."""
    return [k.mm for k in sched.kernels if k.kind is KernelKind.CONV]


def _cin_per_group(plan: Plan, conv: int) -> int:
    node = plan.nodes[conv]
    return int(plan.nodes[node.tensor_args()[0]].shape[1]) // ConvSpec.from_attrs(node.attrs).groups


def _heaviest_conv(plan: Plan, sched: Schedule) -> int:
    """The plan's convolution with the most products (the ``conv_*`` parameters are shared)."""
    return max(_convs(sched), key=lambda c: plan.nodes[c].numel * _conv_reduction(plan, c))


def _taps_outer_pays(plan: Plan, sched: Schedule) -> bool:
    """Every convolution has one input channel per group or 16 at least: walking taps outside,
    a tap's positions are worked out per row, not per element, and no tile of channels is mostly
    padding (for 2 to 15 channels the flat index packs channels x taps)."""
    return all(_cin_per_group(plan, c) == 1 or _cin_per_group(plan, c) >= 16 for c in _convs(sched))


def cudnn_ieee_likely(plan: Plan) -> bool:
    """Whether cuDNN probably computes the plan's convolutions in IEEE fp32 even at PyTorch's
    defaults (TF32 allowed): those of 2 to 15 input channels per group hold most of their products.
    On an H200 with PyTorch 2.11, such KernelBench convolutions (L1-54, L2-6, 21, 67, 73, 92) erred
    at the defaults exactly as in IEEE fp32 (``kfoundry bench``'s precision column; the profiles of
    L2-21 and 73 show cuDNN's fp32 FFMA kernels), so precision parity granted no TF32; those of 16
    channels and more (L1-57, 63, 67, L2-4, 52, L3-8) erred as TF32 does. A whole model's output
    carries the TF32 error of its wide convolutions: ResNet-18 (L3-9), whose heaviest single
    convolution is its 3-channel stem (6% of the products), started in three passes at 0.15x eager
    on an H100 when the heaviest one decided. Only the experts' first guess: the evaluator measures it."""
    sched = schedule(plan, TemplateParams())
    convs = _convs(sched)
    work = {c: plan.nodes[c].numel * _conv_reduction(plan, c) for c in convs}
    narrow = sum(w for c, w in work.items() if 1 < _cin_per_group(plan, c) < 16)
    return bool(convs) and 2 * narrow > sum(work.values())


def _forward_taps_ieee(plan: Plan, sched: Schedule) -> bool:
    """The heaviest convolution is a forward one of several taps, walked taps outside: its dot
    runs in ieee. On an H200 (``bench/conv_orders.py``) that ran L1-63, L1-67 and L2-4 at 15.8,
    4.84 and 15.0 ms, against 48.7, 13.8 and 40.9 ms in tf32x3 and 46.9, 15.4 and 46.0 ms in the
    flat order; transposed convolutions (L1-57) ran fastest taps outside in tf32x3 (12.8 ms,
    against 33.1 ms in ieee with ``[channels, rows]`` tiles; plain ieee was not timed)."""
    if _convs_all_narrow(plan, sched) or not _taps_outer_pays(plan, sched):
        return False
    node = plan.nodes[_heaviest_conv(plan, sched)]
    weight = plan.nodes[node.tensor_args()[1]].shape
    return not ConvSpec.from_attrs(node.attrs).transposed and math.prod(weight[2:]) > 1


def _conv_defaults(plan: Plan, sched: Schedule) -> dict[str, object]:
    """Tile sizes for the plan's convolutions, from the one with the most products: the channel
    tile follows its output channels per group. When every convolution has fewer than 16 of them
    (depthwise: one; narrow), the products are outer products summed with ``fma``, not ``tl.dot``,
    whose tiles would be mostly masked-out columns. Taps go outside the channels where
    ``_taps_outer_pays``."""
    conv = _heaviest_conv(plan, sched)
    taps_outer = _taps_outer_pays(plan, sched)
    node = plan.nodes[conv]
    cout_g = _cout_per_group(plan, conv)
    positions = node.numel // node.shape[1]
    if _convs_all_narrow(plan, sched):
        depthwise = all(_cin_per_group(plan, c) == 1 for c in _convs(sched))
        return {"conv_block_m": 256 if depthwise else 128, "conv_block_n": next_pow2(cout_g), "conv_warps": 4,
                "conv_precision": "fma", "conv_taps_outer": True}  # fmt: skip
    block_n = max(16, min(128, next_pow2(cout_g)))
    block_m = 128 if positions >= 4096 and block_n <= 64 else 64
    warps = 8 if block_m * block_n >= 8192 else 4
    block_k = min(32, next_pow2(_cin_per_group(plan, conv))) if taps_outer else 32
    return {"conv_block_m": block_m, "conv_block_n": block_n, "conv_block_k": max(16, block_k), "conv_warps": warps,
            "conv_taps_outer": taps_outer}  # fmt: skip


def _tf32_conv_tiles(plan: Plan, sched: Schedule) -> dict[str, object]:
    """A convolution in one TF32 pass: taps outside, the input copied channels-last with the
    operands rounded to TF32 in that copy (``conv_layout``, ``conv_preround``), 128 output
    positions by up to 64 output channels by 32 input channels, 4 warps, 3 stages. On an H200
    (``python -m bench.conv_orders --sweep layout``, 2026-11-29, bench/results/conv_sweep_h200.md)
    this was the fastest of ten variants on six of eight development convolutions and within 1.12x
    of the fastest on the other two; against the earlier first candidate (the model's layout,
    operands rounded per tile) it was 1.11-1.82x faster on all eight (1.04-2.55x of eager cuDNN
    in TF32). Rounding before the loop without the channels-last copy was slower than that earlier
    candidate on seven of the eight."""
    cout_g = _cout_per_group(plan, _heaviest_conv(plan, sched))
    return {
        "conv_block_m": 128,
        "conv_block_n": max(16, min(64, next_pow2(cout_g))),
        "conv_block_k": 32,
        "conv_warps": 4,
        "conv_stages": 3,
        "conv_taps_outer": True,
        "conv_layout": "nhwc",
        "conv_preround": True,
    }


def _conv_reduction(plan: Plan, conv: int) -> int:
    """The length of a convolution's reduction: input channels per group x kernel taps."""
    node = plan.nodes[conv]
    return _cin_per_group(plan, conv) * math.prod(plan.nodes[node.tensor_args()[1]].shape[2:])


def _conv_relevant(plan: Plan, conv: int, params: TemplateParams) -> list[str]:
    """The ``conv_*`` parameters that change this convolution's kernel under ``params`` (as
    ``emit_conv`` renders it): outer products (``fma``, or one input channel per group) have no
    channel tile and one order; the input's layout matters to dots walked taps outside and to forward
    ones in the flat order, the tile's gather order (``conv_a_transposed``) to every dot."""
    outer = outer_products(params, _cin_per_group(plan, conv))
    names = ["conv_block_m", "conv_block_n", "conv_warps", "conv_stages", "conv_precision"]
    if not outer:
        names += ["conv_block_k", "conv_taps_outer", "conv_a_transposed"]
        if params.conv_taps_outer or not ConvSpec.from_attrs(plan.nodes[conv].attrs).transposed:
            names.append("conv_layout")
        if params.conv_precision == "tf32":
            names.append("conv_preround")
    return names


register(
    KernelTemplate(
        kind=KernelKind.CONV,
        writer=ConvWriter,
        defaults=_defaults,
        relevant=_relevant,
        fit=_fit,
        compute=_TILING,
        latency=("conv_stages",),
        tiles=("conv_block_m", "conv_block_n", "conv_block_k"),
        shrink=("conv_stages",),
        precision=("conv_precision",),
        tf32_only=(("conv_precision", "tf32"),),
    )
)
