"""Row kernels: reductions (and the elementwise work fused before and after them) over rows of
the reduced dims, whole rows in registers when they fit (``row_one_pass``), else in chunks."""

from __future__ import annotations

from actors.experts.template.emit_row import RowWriter, next_pow2, row_shape
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.params import ONE_PASS_MAX_TILE, TemplateParams


def _defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    rtile = next_pow2(kernel.reduced)
    if kernel.inner == 1:
        block_m = max(1, min(32, 2048 // rtile))
        warps = 4 if rtile <= 2048 else 8 if rtile <= 8192 else 16
        return {"row_block_m": block_m, "row_warps": warps, "row_block_r": 2048}
    widest = max(8, min(64, next_pow2(kernel.inner)))
    if rtile <= 1024:  # one pass, tile of at most 8192 elements
        block_i = max(8, min(widest, 8192 // rtile))
        tile = rtile * block_i
    else:  # loops over R in [64, block_i] chunks
        block_i, tile = widest, 64 * widest
    return {"row_block_i": block_i, "row_warps": 4 if tile <= 2048 else 8, "row_block_r": 64}


def _fit(hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values) -> dict[str, object]:
    if kernel.inner != 1 or "row_block_m" in values:
        return {}
    rows = kernel.numel // max(1, kernel.reduced)
    return {"row_block_m": hw.rows_per_program(rows, next_pow2(kernel.reduced))}


def _relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    names = ["row_warps", "row_block_m" if kernel.inner == 1 else "row_block_i"]
    width = (
        row_shape(sched, kernel, params.row_block_m, params.row_warps)[0] if kernel.inner == 1 else params.row_block_i
    )
    fits = next_pow2(kernel.reduced) * width <= ONE_PASS_MAX_TILE
    if fits:
        names.append("row_one_pass")
    if not (fits and params.row_one_pass):
        names += ["row_block_r", "row_stages"]
    return names


register(
    KernelTemplate(
        kind=KernelKind.ROW,
        writer=RowWriter,
        defaults=_defaults,
        relevant=_relevant,
        fit=_fit,
        memory=("row_block_r", "row_block_i", "row_block_m", "row_one_pass", "row_warps", "row_stages"),
        latency=("row_stages", "row_warps"),
        tiles=("row_block_m", "row_block_r", "row_block_i"),
        shrink=("row_stages", "row_one_pass"),
    )
)
