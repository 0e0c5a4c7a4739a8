"""The scan family: ``cumsum`` / ``cumprod`` (and flips around them) lowered, and their kernel.

Lowering: ``torch.cumsum(x, dim)`` / ``cumprod`` become one ``SCAN`` node along ``dim``. A flip
along the scanned dim is tracked as a :class:`FlipRef` and must meet a scan along that dim (or be
flipped back): ``cumsum(x.flip(d), d).flip(d)`` is a reversed scan of ``x``. Declined, with the
reason: a ``dtype`` argument, flips over several dims or used anywhere else. A float16 or bfloat16
input gives a scan of its type (as ``torch.cumsum`` returns), carried in float32 and rounded once
where it is stored.

Kernel: the value is viewed as ``(outer, R, inner)``. When the scanned dim is innermost a program
takes ``row_block_m`` rows and walks ``R`` in chunks of ``row_block_r`` (tile ``[M, R]``);
otherwise it takes one ``outer`` index and ``row_block_i`` inner positions (tile ``[R, I]``,
coalesced along ``inner``). Each chunk is scanned with ``tl.cumsum`` / ``tl.cumprod`` and
combined with the running carry of the chunks before it (positions past the end hold the
identity, so the chunk's last position is the new carry). A reversed scan walks positions
``R - 1 - j``. Elementwise ops that follow run on each chunk before its store.
"""

from __future__ import annotations

import math
from typing import Any

from actors.experts.template.emit import IndexSpace, Launch, Scope, Writer
from actors.experts.template.emit_row import next_pow2
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.fuse import Kernel, KernelKind, Schedule
from actors.experts.template.ir import FlipRef, NodeKind, Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.params import TemplateParams


def _one_dim(value: object, rank: int, what: str) -> int:
    if isinstance(value, tuple | list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or not -rank <= value < rank:
        raise UnsupportedGraph(f"{what} over dims {value!r} is not covered (one dim of {rank})")
    return value % rank


@lowering("flip")
def _flip(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    return lower_flip(lw, b)


def lower_flip(lw: LowerContext, b: dict[str, Any]) -> object:
    """``flip`` along one dim: a marker a scan (or a second flip) consumes."""
    x = b["input"]
    if isinstance(x, FlipRef):
        if _one_dim(b["dims"], len(lw.shape(x.src)), "flip") == x.dim:
            return x.src
        raise UnsupportedGraph("flips along two different dims are not covered")
    t = lw.tensor(x, "flip")
    return FlipRef(t, _one_dim(b["dims"], len(lw.shape(t)), "flip"))


@lowering("cumsum", "cumprod")
def _scan(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    return lower_scan(lw, canon, b)


def lower_scan(lw: LowerContext, canon: str, b: dict[str, Any]) -> object:
    """``cumsum`` / ``cumprod`` along one dim (reversed when its input is flipped along it)."""
    if b.get("dtype") is not None:
        raise UnsupportedGraph(f"{canon} with a dtype is not covered")
    x = b["input"]
    flipped = isinstance(x, FlipRef)
    src = x.src if isinstance(x, FlipRef) else lw.tensor(x, canon)
    shape = lw.shape(src)
    if not shape:
        raise UnsupportedGraph(f"{canon} of a zero-dimensional tensor is not covered")
    dim = _one_dim(b["dim"], len(shape), canon)
    if isinstance(x, FlipRef) and x.dim != dim:
        raise UnsupportedGraph(f"{canon} of a tensor flipped along another dim is not covered")
    op = "sum" if canon == "cumsum" else "prod"
    dtype = lw.node(src).dtype
    ref = lw.add(NodeKind.SCAN, shape, op=op, args=(src.id,), dims=(dim, dim + 1), attrs=(float(flipped),), dtype=dtype)
    return FlipRef(ref, dim) if flipped else ref


class ScanWriter(Writer):
    """Emits one scan kernel with its fused epilogue."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        node = self.plan.nodes[kernel.mm]
        self.node = node
        self.src = node.tensor_args()[0]
        d = node.dims[0]
        self.outer, self.r, self.inner = math.prod(node.shape[:d]), node.shape[d], math.prod(node.shape[d + 1 :])
        self.last = self.inner == 1
        self.reverse = bool(node.attrs[0])
        self.bm = params.row_block_m if self.last else 1
        self.bi = 1 if self.last else params.row_block_i
        self.block_r = min(params.row_block_r, next_pow2(self.r), max(16, 8192 // max(self.bm, self.bi)))
        self.nib = math.ceil(self.inner / self.bi)

    def space(self, row: bool) -> IndexSpace:
        return IndexSpace(lin="lin", mask="m", shape=self.node.shape)

    def broadcast_row(self, var: str) -> str:
        return var

    def write(self) -> Launch:
        s = Scope(indent="    ")
        start = len(self.lines)
        e = self.emit
        ident = "0.0" if self.node.op == "sum" else "1.0"
        r, axis = self.r, 1 if self.last else 0
        if self.last:
            e(s, f"rows = {self.pid()} * BLOCK_M + tl.arange(0, BLOCK_M)")
            e(s, f"rmask = rows < {self.outer}")
            e(s, f"carry = tl.full((BLOCK_M,), {ident}, tl.float32)")
            e(s, "is_last = (tl.arange(0, BLOCK_R) == BLOCK_R - 1)[None, :]")
        else:
            e(s, f"pid = {self.pid()}")
            e(s, f"o = pid // {self.nib}")
            e(s, f"ci = (pid % {self.nib}) * BLOCK_I + tl.arange(0, BLOCK_I)")
            e(s, f"imask = ci < {self.inner}")
            e(s, f"carry = tl.full((BLOCK_I,), {ident}, tl.float32)")
            e(s, "is_last = (tl.arange(0, BLOCK_R) == BLOCK_R - 1)[:, None]")
        e(s, f"for r0 in range(0, {r}, BLOCK_R):")
        loop = Scope(indent="        ", parent=s)
        e(loop, "j = r0 + tl.arange(0, BLOCK_R)")
        e(loop, f"pos = {r - 1} - j" if self.reverse else "pos = j")
        if self.last:
            e(loop, f"m = rmask[:, None] & (j < {r})[None, :]")
            e(loop, f"lin = rows[:, None] * {r} + pos[None, :]")
        else:
            e(loop, f"m = (j < {r})[:, None] & imask[None, :]")
            e(loop, f"lin = (o * {r} + pos[:, None]) * {self.inner} + ci[None, :]")
        value = self.operand(loop, self.src, self.plan.nodes[self.src].shape, row=False)
        e(loop, f"x = tl.where(m, {value}, {ident})")
        carry = "carry[:, None]" if self.last else "carry[None, :]"
        if self.node.op == "sum":
            e(loop, f"c = tl.cumsum(x, axis={axis}) + {carry}")
        else:
            e(loop, f"c = tl.cumprod(x, axis={axis}) * {carry}")
        e(loop, f"carry = tl.sum(tl.where(is_last, c, 0.0), axis={axis})")
        loop.memo[("v", self.node.id)] = "c"
        for nid in self.kernel.exports:
            self.store(loop, nid, row=False)
        body = self.lines[start:]
        consts = (
            {"BLOCK_M": self.bm, "BLOCK_R": self.block_r}
            if self.last
            else {"BLOCK_R": self.block_r, "BLOCK_I": self.bi}
        )
        grid = math.ceil(self.outer / self.bm) if self.last else self.outer * self.nib
        return Launch(
            source="\n".join(["@triton.jit", self.signature(list(consts)), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(grid,),
            constexprs=consts,
            num_warps=self.params.row_warps,
            num_stages=1,
        )


def _scan_defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    """Chunk sizes for one scan: wide chunks along R, a few rows (or inner positions) per program."""
    node = plan.nodes[kernel.mm]
    d = node.dims[0]
    r, inner = node.shape[d], math.prod(node.shape[d + 1 :])
    if inner == 1:
        block_r = max(64, min(2048, next_pow2(r)))
        return {"row_block_m": max(1, min(32, 4096 // block_r)), "row_block_r": block_r, "row_warps": 4}
    return {"row_block_i": max(8, min(64, next_pow2(inner))), "row_block_r": 64, "row_warps": 4}


def _scan_relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    node = plan.nodes[kernel.mm]
    inner = math.prod(node.shape[node.dims[1] :])
    return ["row_warps", "row_block_r", "row_block_m" if inner == 1 else "row_block_i"]


register(KernelTemplate(KernelKind.SCAN, ScanWriter, _scan_defaults, _scan_relevant))
