"""Matrix-product kernels: tiles of the output over a K loop in ``tl.dot`` (``emit_mm``), with the
single-product schedule variants (split-K, persistent, TMA, padded operands)."""

from __future__ import annotations

import math

from actors.experts.template.emit_mm import (
    MIN_STEPS_PER_SLICE,
    MatmulWriter,
    effective_split,
    element_size,
    mm_shape,
    needs_padding,
)
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.params import TemplateParams

_TILING = ("mm_block_m", "mm_block_n", "mm_block_k", "mm_warps", "mm_stages", "mm_group_m", "mm_precision")
_VARIANTS = ("mm_split_k", "mm_persistent", "mm_tma", "mm_pad")
"""Schedule variants; relevant only to single (or flattened) products (:func:`_relevant`)."""


def _bytes(plan: Plan, node: int) -> int:
    return element_size(plan.nodes[node].dtype if node >= 0 else "float32")


def _block_k(plan: Plan, kernel: Kernel) -> int:
    """K per step: 32 float32 values, or 64 half ones (128 bytes a row either way; a half tile's
    ``tl.dot`` runs on the tensor cores, whose 16-bit instructions take K in steps of 16)."""
    return 64 if _bytes(plan, kernel.mm) == 2 else 32


def _defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    node = plan.nodes[kernel.mm]
    m, n = node.shape[-2], node.shape[-1]
    bk = _block_k(plan, kernel)
    if m * max(1, kernel.numel // (m * n)) >= 256 and n >= 256:
        return {"mm_block_m": 128, "mm_block_n": 128, "mm_block_k": bk, "mm_warps": 8, "mm_stages": 3}
    return {"mm_block_m": 64, "mm_block_n": 64, "mm_block_k": bk, "mm_warps": 4, "mm_stages": 3}


def _fit(hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values) -> dict[str, object]:
    if "mm_block_m" in values:
        return {}
    node = plan.nodes[kernel.mm]
    m, n = node.shape[-2], node.shape[-1]
    bm, bn = hw.mm_tiles(m, n, max(1, kernel.numel // (m * n)))
    shape = mm_shape(sched, kernel)
    bk = _block_k(plan, kernel)
    split = hw.split_k(shape.m, shape.n, shape.k, (64, 64, bk)) if shape.batch == 1 else 1
    found: dict[str, object] = {}
    if split > 1:  # few tiles, long K: 64x64 tiles over slices of K fill the machine
        bm, bn = 64, 64
        found["mm_split_k"] = effective_split(split, shape.m, shape.n, shape.k, bk)
    stages = hw.stages_that_fit(bm, bn, bk, _bytes(plan, kernel.mm), most=3)
    warps = 8 if bm * bn >= 128 * 128 else 4
    found.update(mm_block_m=bm, mm_block_n=bn, mm_block_k=bk, mm_warps=warps, mm_stages=stages)
    if hw.tf32x3_pays and _bytes(plan, kernel.mm) == 4:
        found["mm_precision"] = "tf32x3"
    if shape.batch == 1 and needs_padding(shape, _bytes(plan, shape.a.base)):
        found["mm_pad"] = True  # unaligned rows: scalar, masked loads on every K step otherwise
    return found


def _relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    names = [n for n in _TILING if n != "mm_precision" or _bytes(plan, kernel.mm) == 4]  # half: tl.dot's own
    shape = mm_shape(sched, kernel)
    if shape.batch == 1:
        names += ["mm_persistent", "mm_tma"]
        if needs_padding(shape, _bytes(plan, shape.a.base)):
            names.append("mm_pad")
        if math.ceil(shape.k / params.mm_block_k) >= 2 * MIN_STEPS_PER_SLICE:
            names.append("mm_split_k")
    return names


register(
    KernelTemplate(
        kind=KernelKind.MM,
        writer=MatmulWriter,
        defaults=_defaults,
        relevant=_relevant,
        fit=_fit,
        compute=(*_TILING, *_VARIANTS),
        latency=(*_VARIANTS, "mm_stages", "mm_warps"),
        tiles=("mm_block_m", "mm_block_n", "mm_block_k"),
        shrink=("mm_stages",),
        precision=("mm_precision",),
    )
)
