"""Default parameters for a plan, and mutation steered by the parent's diagnosis.

``default_params`` picks sizes from the traced shapes (whole rows in registers when they fit,
larger matmul tiles for larger products). ``mutate`` steps one to three of the parameters that
matter for the plan to a neighbouring value; the diagnosis decides which parameters and which
direction (launch-bound: fuse and enlarge; memory-bound: vector width, block sizes, one pass;
compute-bound: matmul tiles, stages and dot precision; latency-bound: split-K, persistence, stages
and warps; out of resources: smaller and fewer).
"""

from __future__ import annotations

import math

import numpy as np

from actors.experts.template.emit_conv import outer_products
from actors.experts.template.emit_mm import (
    MIN_STEPS_PER_SLICE,
    effective_split,
    element_size,
    mm_shape,
    needs_padding,
)
from actors.experts.template.emit_row import next_pow2
from actors.experts.template.errors import InvalidParams
from actors.experts.template.fuse import KernelKind, Schedule, schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import ConvSpec, Plan
from actors.experts.template.params import ONE_PASS_MAX_TILE, SPACE, TemplateParams
from schemas.enums import DiagnosisCategory

_MEMORY = (
    "pw_ept",
    "pw_warps",
    "row_block_r",
    "row_block_i",
    "row_block_m",
    "row_one_pass",
    "row_warps",
    "row_stages",
)
_COMPUTE = ("mm_block_m", "mm_block_n", "mm_block_k", "mm_warps", "mm_stages", "mm_group_m", "mm_precision")
_HOPPER = ("mm_split_k", "mm_persistent", "mm_tma", "mm_pad")
"""Matmul schedule variants; relevant only to single (or flattened) products (``relevant_params``)."""
_CONV = (
    "conv_block_m", "conv_block_n", "conv_block_k", "conv_warps", "conv_stages", "conv_precision", "conv_taps_outer",
    "conv_a_transposed", "conv_layout", "conv_preround",
)  # fmt: skip
_ATTN = ("attn_block_m", "attn_block_n", "attn_block_k", "attn_block_d", "attn_warps", "attn_stages", "attn_precision")
_COMPUTE_ALL = (*_COMPUTE, *_HOPPER, *_CONV, *_ATTN)
_LATENCY = (*_HOPPER, "mm_stages", "mm_warps", "conv_stages", "attn_stages", "row_stages", "row_warps", "pw_warps")
"""Parameters that change how much work is in flight (profiled latency-bound)."""
_TILES = (
    "conv_block_m",
    "conv_block_n",
    "conv_block_k",
    "pw_ept",
    "row_block_m",
    "row_block_r",
    "row_block_i",
    "mm_block_m",
    "mm_block_n",
    "mm_block_k",
)
_SHRINK = (*_TILES, "mm_stages", "conv_stages", "row_stages", "row_one_pass")


def default_params(plan: Plan, hw: GpuModel | None = None, tf32: bool = False) -> TemplateParams:
    """A good first configuration for the plan's shapes; with a model of the target GPU, the
    sizes that fill it (``hardware.py``). ``tf32``: the run admits the reference's own TF32 in its
    convolutions (precision parity; cuDNN runs fp32 convolutions so at PyTorch's defaults)."""
    values: dict[str, object] = {}
    sched = schedule(plan, TemplateParams())
    seen: set[KernelKind] = set()
    for kernel in sched.kernels:
        if kernel.kind in seen:
            continue
        seen.add(kernel.kind)
        if kernel.kind is KernelKind.PW:
            values.update(pw_warps=8 if kernel.numel >= 1 << 20 else 4, pw_ept=4)
        elif kernel.kind is KernelKind.ROW:
            rtile = next_pow2(kernel.reduced)
            if kernel.inner == 1:
                block_m = max(1, min(32, 2048 // rtile))
                warps = 4 if rtile <= 2048 else 8 if rtile <= 8192 else 16
                values.update(row_block_m=block_m, row_warps=warps, row_block_r=2048)
            else:
                widest = max(8, min(64, next_pow2(kernel.inner)))
                if rtile <= 1024:  # one pass, tile of at most 8192 elements
                    block_i = max(8, min(widest, 8192 // rtile))
                    tile = rtile * block_i
                else:  # loops over R in [64, block_i] chunks
                    block_i, tile = widest, 64 * widest
                values.update(row_block_i=block_i, row_warps=4 if tile <= 2048 else 8, row_block_r=64)
        elif kernel.kind is KernelKind.CONV:
            values.update(_conv_defaults(plan, sched))
        elif kernel.kind is KernelKind.SCAN:
            values.update(_scan_defaults(plan, kernel.mm))
        elif kernel.kind is KernelKind.ATTN:
            dv = plan.nodes[kernel.mm].shape[-1]
            values.update(attn_block_d=max(16, min(128, next_pow2(dv))), attn_block_m=64, attn_block_n=32)
        elif kernel.kind is KernelKind.POOL:
            values.setdefault("pw_warps", 4)
        else:
            node = plan.nodes[kernel.mm]
            m, n = node.shape[-2], node.shape[-1]
            big = m * max(1, kernel.numel // (m * n)) >= 256 and n >= 256
            if big:
                values.update(mm_block_m=128, mm_block_n=128, mm_block_k=32, mm_warps=8, mm_stages=3)
            else:
                values.update(mm_block_m=64, mm_block_n=64, mm_block_k=32, mm_warps=4, mm_stages=3)
    if hw is not None and hw.is_gpu:
        values.update(_fit_to(hw, plan, sched, tf32))
    return TemplateParams.from_dict(values)


def _dtype_bytes(plan: Plan, node: int) -> int:
    return element_size(plan.nodes[node].dtype if node >= 0 else "float32")


def _fit_to(hw: GpuModel, plan: Plan, sched: Schedule, tf32: bool = False) -> dict[str, object]:
    """First sizes from the GPU model, per kernel kind (the first kernel of each kind decides)."""
    values: dict[str, object] = {}
    for kernel in sched.kernels:
        if kernel.kind is KernelKind.PW and "pw_ept" not in values:
            ept = hw.vector_width(_dtype_bytes(plan, kernel.nodes[-1] if kernel.nodes else -1))
            values.update(pw_ept=ept, pw_warps=hw.elementwise_warps(kernel.numel, ept))
        elif kernel.kind is KernelKind.ROW and kernel.inner == 1 and "row_block_m" not in values:
            rows = kernel.numel // max(1, kernel.reduced)
            values["row_block_m"] = hw.rows_per_program(rows, next_pow2(kernel.reduced))
        elif kernel.kind is KernelKind.MM and "mm_block_m" not in values:
            node = plan.nodes[kernel.mm]
            m, n = node.shape[-2], node.shape[-1]
            bm, bn = hw.mm_tiles(m, n, max(1, kernel.numel // (m * n)))
            shape = mm_shape(sched, kernel)
            split = hw.split_k(shape.m, shape.n, shape.k, (64, 64, 32)) if shape.batch == 1 else 1
            if split > 1:  # few tiles, long K: 64x64 tiles over slices of K fill the machine
                bm, bn = 64, 64
                values["mm_split_k"] = effective_split(split, shape.m, shape.n, shape.k, 32)
            stages = hw.stages_that_fit(bm, bn, 32, _dtype_bytes(plan, kernel.mm), most=3)
            warps = 8 if bm * bn >= 128 * 128 else 4
            values.update(mm_block_m=bm, mm_block_n=bn, mm_block_k=32, mm_warps=warps, mm_stages=stages)
            if hw.tf32x3_pays and _dtype_bytes(plan, kernel.mm) == 4:
                values["mm_precision"] = "tf32x3"
            if shape.batch == 1 and needs_padding(shape, _dtype_bytes(plan, shape.a.base)):
                values["mm_pad"] = True  # unaligned rows: scalar, masked loads on every K step otherwise
        # As for products: cuDNN runs fp32 convolutions in TF32 (PyTorch's default), while a
        # candidate must be fp32-accurate; the first convolutions of the level-1 development
        # subset on an H200, in ieee fp32 (no tensor cores), ran at 0.11-0.13x of eager. A plan
        # of narrow ones keeps the fma that ``_conv_defaults`` chose, and forward convolutions
        # of several taps walked taps outside keep ieee (``_forward_taps_ieee``).
        elif (
            kernel.kind is KernelKind.CONV
            and tf32
            and hw.tf32x3_pays
            and _dtype_bytes(plan, kernel.mm) == 4
            and not _convs_all_narrow(plan, sched)
        ):
            # The reference's own precision (cuDNN's TF32), admitted by precision parity: one
            # tensor-core pass instead of three, in the tiles that suit it (``_tf32_conv_tiles``).
            values["conv_precision"] = "tf32"
            values.update(_tf32_conv_tiles(plan, sched))
        elif (
            kernel.kind is KernelKind.CONV
            and hw.tf32x3_pays
            and _dtype_bytes(plan, kernel.mm) == 4
            and not _convs_all_narrow(plan, sched)
            and not _forward_taps_ieee(plan, sched)
        ):
            values["conv_precision"] = "tf32x3"
    return values


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


def _scan_defaults(plan: Plan, scan: int) -> dict[str, object]:
    """Chunk sizes for one scan: wide chunks along R, a few rows (or inner positions) per program."""
    node = plan.nodes[scan]
    d = node.dims[0]
    r, inner = node.shape[d], math.prod(node.shape[d + 1 :])
    if inner == 1:
        block_r = max(64, min(2048, next_pow2(r)))
        return {"row_block_m": max(1, min(32, 4096 // block_r)), "row_block_r": block_r, "row_warps": 4}
    return {"row_block_i": max(8, min(64, next_pow2(inner))), "row_block_r": 64, "row_warps": 4}


def _conv_relevant(plan: Plan, conv: int, params: TemplateParams) -> list[str]:
    """The ``conv_*`` parameters that change this convolution's kernel under ``params`` (as
    ``emit_conv`` renders it): outer products (``fma``, or one input channel per group) have no
    channel tile and one order; the input tile's layout matters only to dots walked taps outside."""
    outer = outer_products(params, _cin_per_group(plan, conv))
    names = ["conv_block_m", "conv_block_n", "conv_warps", "conv_stages", "conv_precision"]
    if not outer:
        names += ["conv_block_k", "conv_taps_outer"]
        if params.conv_taps_outer:
            names += ["conv_a_transposed", "conv_layout"]
        if params.conv_precision == "tf32":
            names.append("conv_preround")
    return names


def relevant_params(plan: Plan, params: TemplateParams) -> tuple[str, ...]:
    """The parameters that change the rendered kernels of ``plan`` under ``params``."""
    names: list[str] = []
    schedule_of = schedule(plan, params)
    for kernel in schedule_of.kernels:
        if kernel.kind is KernelKind.PW:
            names += ["pw_warps", "pw_ept"]
        elif kernel.kind is KernelKind.POOL:
            names.append("pw_warps")  # one output element per thread (emit_pool)
        elif kernel.kind is KernelKind.MM:
            names += list(_COMPUTE)
            shape = mm_shape(schedule_of, kernel)
            if shape.batch == 1:
                names += ["mm_persistent", "mm_tma"]
                if needs_padding(shape, _dtype_bytes(plan, shape.a.base)):
                    names.append("mm_pad")
                if math.ceil(shape.k / params.mm_block_k) >= 2 * MIN_STEPS_PER_SLICE:
                    names.append("mm_split_k")
        elif kernel.kind is KernelKind.CONV:
            names += _conv_relevant(plan, kernel.mm, params)
        elif kernel.kind is KernelKind.ATTN:
            names += list(_ATTN)
        elif kernel.kind is KernelKind.SCAN:
            inner = math.prod(plan.nodes[kernel.mm].shape[plan.nodes[kernel.mm].dims[1] :])
            names += ["row_warps", "row_block_r", "row_block_m" if inner == 1 else "row_block_i"]
        else:
            names += ["row_warps", "row_block_m" if kernel.inner == 1 else "row_block_i"]
            width = params.row_block_m if kernel.inner == 1 else params.row_block_i
            fits = next_pow2(kernel.reduced) * width <= ONE_PASS_MAX_TILE
            if fits:
                names.append("row_one_pass")
            if not (fits and params.row_one_pass):
                names += ["row_block_r", "row_stages"]
    for i, flag in enumerate(("fuse_epilogue", "fuse_prologue")):
        if len({f[i] for f in plan.fusions}) > 1:
            names.append(flag)
    return tuple(dict.fromkeys(names))


def _step(name: str, value: object, rng: np.random.Generator, direction: int) -> object:
    """A neighbouring value of one parameter (``direction`` 0: either way)."""
    space = SPACE[name]
    if isinstance(value, bool | str):
        others = [v for v in space if v != value]
        return others[int(rng.integers(len(others)))]
    i = space.index(value)
    if direction == 0:
        direction = 1 if rng.random() < 0.5 else -1
    stride = 2 if rng.random() < 0.2 else 1
    j = min(len(space) - 1, max(0, i + direction * stride))
    return space[j]


def _choices(
    relevant: tuple[str, ...], params: TemplateParams, diagnosis: DiagnosisCategory | None
) -> tuple[tuple[str, ...], int, dict[str, object]]:
    """(candidate parameter names, direction, forced values) for a diagnosis."""
    forced: dict[str, object] = {}
    if diagnosis is DiagnosisCategory.SLOW_LAUNCH_BOUND:
        for flag in ("fuse_epilogue", "fuse_prologue"):
            if flag in relevant and not getattr(params, flag):
                forced[flag] = True
        return tuple(n for n in relevant if n in _TILES) or relevant, 1, forced
    if diagnosis is DiagnosisCategory.SLOW_MEMORY_BOUND:
        return tuple(n for n in relevant if n in _MEMORY) or relevant, 0, forced
    if diagnosis is DiagnosisCategory.SLOW_COMPUTE_BOUND:
        return tuple(n for n in relevant if n in _COMPUTE_ALL) or relevant, 0, forced
    if diagnosis is DiagnosisCategory.SLOW_LATENCY_BOUND:
        return tuple(n for n in relevant if n in _LATENCY) or relevant, 0, forced
    if diagnosis in (
        DiagnosisCategory.COMPILE_RESOURCES,
        DiagnosisCategory.COMPILE_TIMEOUT,
        DiagnosisCategory.RUNTIME_OOM,
    ):
        if "row_one_pass" in relevant and params.row_one_pass:
            forced["row_one_pass"] = False
        return tuple(n for n in relevant if n in _SHRINK) or relevant, -1, forced
    if diagnosis is DiagnosisCategory.INCORRECT_PRECISION:
        for name in ("mm_precision", "conv_precision", "attn_precision"):
            if getattr(params, name) == "tf32x3":  # fma sums in fp32 already
                forced[name] = "ieee"
            elif getattr(params, name) == "tf32":  # TF32 refused: the fp32-accurate passes
                forced[name] = "tf32x3"
    return relevant, 0, forced


def mutate(
    plan: Plan,
    params: TemplateParams,
    rng: np.random.Generator,
    *,
    diagnosis: DiagnosisCategory | None,
    tf32: bool = False,
) -> TemplateParams:
    """A valid neighbour of ``params`` for ``plan``, steered by ``diagnosis`` (``tf32``: the run
    admits TF32 convolutions; else none is proposed).

    Returns ``params`` itself only when no other valid configuration is reachable.
    """
    relevant = relevant_params(plan, params)
    if not relevant:
        return params
    names, direction, forced = _choices(relevant, params, diagnosis)
    for attempt in range(64):
        changes: dict[str, object] = dict(forced) if attempt < 32 else {}
        count = 1 + int(rng.random() < 0.4) + int(rng.random() < 0.15)
        pool = names if attempt < 48 else relevant
        for _ in range(count):
            name = pool[int(rng.integers(len(pool)))]
            current = changes.get(name, getattr(params, name))
            changes[name] = _step(name, current, rng, direction if attempt < 32 else 0)
        try:
            candidate = params.with_changes(**changes)
        except InvalidParams:
            continue
        if (candidate.fuse_epilogue, candidate.fuse_prologue) not in plan.fusions:
            continue
        if not tf32 and candidate.conv_precision == "tf32" and params.conv_precision != "tf32":
            continue
        if candidate != params:
            return candidate
    return params
