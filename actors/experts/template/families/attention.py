"""The attention family: ``scaled_dot_product_attention`` lowered, and a flash-style kernel.

Lowering: ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` on
``(..., L, D)`` operands with equal batch dims becomes one ``ATTN`` node (``attrs``: scale,
causal). With an ``attn_mask`` (bool: keep where true; float: added to the scores; any shape that
broadcasts to the scores) it is lowered unfused (:func:`masked_attention`), float32 only; a causal
mask built in forward (a bool ``ones`` with ``triu(1)`` or ``tril()``) is the causal ``ATTN`` node.
Declined, with the reason: dropout, grouped-query broadcasting, masks of half operands.

Kernel: a program owns ``attn_block_m`` query rows of one batch-head and ``attn_block_d`` output
columns, and walks the keys in tiles of ``attn_block_n`` with an online softmax (running row
maximum and sum, the accumulator rescaled when the maximum grows), so the ``L x L`` scores never
reach memory. ``Q K^T`` is accumulated over the head dim in chunks of ``attn_block_k``; when the
value width is split over several programs each recomputes the scores (the parameter trades that
against registers). Causal attention masks keys after the query (PyTorch's top-left alignment)
and stops the key loop at the diagonal. The elementwise ops that follow run before the store.

Wide value heads (more than :data:`FLASH_MAX_DV` columns, one tile of the kernel above) in float32
are lowered unfused instead (:func:`unfused_pays`): ``Q K^T`` as a product, the scale and softmax
as a row kernel, then the product with ``V``. The flash kernel would compute the scores again for
every value tile (eight times for a head of 1024: most of its time), while the unfused path
computes them once and moves the score matrix through memory three times, which costs less for
such heads. The score matrix is bounded (:data:`UNFUSED_MAX_SCORE_BYTES`); causal attention
stays flash (it skips the blocks above the diagonal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from actors.experts.template.any_batch import Sym
from actors.experts.template.composites import reduce_dims
from actors.experts.template.emit import WIDE, IndexSpace, Launch, Scope, Writer, half_dot
from actors.experts.template.emit_row import next_pow2
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.fuse import Kernel, KernelKind, Schedule, base_of
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import HALF, NodeKind, NodeRef, Plan
from actors.experts.template.kernel_kinds import KernelTemplate, Values, register
from actors.experts.template.lowering import LowerContext, lowering, one_float_type
from actors.experts.template.params import TemplateParams
from actors.experts.template.products import product


@lowering("sdpa")
def _sdpa(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    return lower_sdpa(lw, b)


def lower_sdpa(lw: LowerContext, b: dict[str, Any]) -> NodeRef:
    """One ``ATTN`` node for ``scaled_dot_product_attention``."""
    dtype = _dtype(lw, [b[n] for n in ("query", "key", "value")])
    if dtype == "float32":
        q, k, v = (lw.tensor(b[n], "scaled_dot_product_attention") for n in ("query", "key", "value"))
    else:
        q, k, v = b["query"], b["key"], b["value"]
    dropout = b.get("dropout_p", 0.0)
    if dropout != 0.0:
        raise UnsupportedGraph("scaled_dot_product_attention with dropout is not covered")
    if b.get("enable_gqa"):
        raise UnsupportedGraph("scaled_dot_product_attention with enable_gqa is not covered")
    qs, ks, vs = lw.shape(q), lw.shape(k), lw.shape(v)
    if len(qs) < 2 or qs[:-2] != ks[:-2] or qs[:-2] != vs[:-2] or ks[-2] != vs[-2] or qs[-1] != ks[-1]:
        raise UnsupportedGraph(f"attention of shapes {qs}, {ks}, {vs} (broadcast batch dims) is not covered")
    scale = b.get("scale")
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise UnsupportedGraph(f"attention scale={scale!r} is not a number")
    out = (*qs[:-1], vs[-1])
    causal = bool(b.get("is_causal", False))
    if b.get("attn_mask") is not None:
        if causal:
            raise UnsupportedGraph("scaled_dot_product_attention with both attn_mask and is_causal is not valid")
        return masked_attention(lw, q, k, v, float(scale), [Mask(b["attn_mask"], masked_where=False)])
    if unfused_pays(qs, ks, vs, dtype, causal):
        return _unfused(lw, q, k, v, float(scale))
    return lw.add(NodeKind.ATTN, out, args=(q.id, k.id, v.id), attrs=(float(scale), float(causal)), dtype=dtype)


FLASH_MAX_DV = 128
"""The widest value head the flash kernel computes in one tile (``_tile``)."""
UNFUSED_MAX_SCORE_BYTES = 2 << 30
"""The largest score matrix (float32) the unfused path writes to memory."""


def unfused_pays(qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], dtype: str, causal: bool) -> bool:
    """Whether attention of these shapes runs unfused (see the module's doc): a float32 head whose
    value width is more than one tile of the flash kernel, not causal, and a score matrix within
    :data:`UNFUSED_MAX_SCORE_BYTES`. Per output element the flash kernel then does ``ceil(dv /
    128) * d`` multiply-adds for the scores and the unfused path ``d`` plus three float32 passes
    over the scores: at a head of 256 already fewer, at 1024 a fifth."""
    scores = math.prod(qs[:-1]) * ks[-2] * 4
    return dtype == "float32" and not causal and vs[-1] > FLASH_MAX_DV and scores <= UNFUSED_MAX_SCORE_BYTES


def _unfused(lw: LowerContext, q: NodeRef, k: NodeRef, v: NodeRef, scale: float) -> NodeRef:
    """``softmax(Q K^T * scale) V`` as two products and a row softmax (the row maximum first)."""
    scores = lw.ew("mul", product(lw, q, lw.perm(k)), scale)
    dims = reduce_dims(lw.shape(scores), -1)
    shifted = lw.ew("sub", scores, lw.red("amax", scores, dims, True))
    e = lw.ew("exp", shifted)
    return product(lw, lw.ew("div", e, lw.red("sum", e, dims, True)), v)


@dataclass(frozen=True)
class Mask:
    """An attention mask as its caller means it: a bool tensor that keeps the scores where it is
    true (``scaled_dot_product_attention``'s ``attn_mask``) or drops them there
    (``masked_where``: ``MultiheadAttention``'s masks), or a float tensor added to the scores."""

    tensor: object
    masked_where: bool


def masked_attention(lw: LowerContext, q: NodeRef, k: NodeRef, v: NodeRef, scale: float, masks: list[Mask]) -> NodeRef:
    """``softmax(Q K^T * scale with masks) V`` unfused: the scores as a product, each mask applied
    where it broadcasts over them (a dropped score is ``-inf``, as in PyTorch), then the row softmax
    (zeros for a row with every score dropped, as PyTorch gives) and the product with ``V``.
    Declined where the score matrix passes :data:`UNFUSED_MAX_SCORE_BYTES`."""
    if len(masks) == 1 and _causal(lw, masks[0], lw.shape(q)[-2], lw.shape(k)[-2]):
        # A causal mask built in forward (``torch.ones(t, t, dtype=torch.bool).triu(1)``): flash
        # attention's own causal blocks, which skip the keys after each query rather than mask them.
        return lower_sdpa(lw, {"query": q, "key": k, "value": v, "scale": scale, "is_causal": True})
    if lw.node(q).dtype != "float32":
        raise UnsupportedGraph("attention with a mask of other than float32 operands is not covered")
    scores_shape = (*lw.shape(q)[:-1], lw.shape(k)[-2])
    if math.prod(scores_shape) * 4 > UNFUSED_MAX_SCORE_BYTES:
        raise UnsupportedGraph(f"attention with a mask over scores of {scores_shape} (more than 2 GiB) is not covered")
    scores = lw.ew("mul", product(lw, q, lw.perm(k)), scale)
    for mask in masks:
        if not isinstance(mask.tensor, NodeRef):
            raise UnsupportedGraph(f"an attention mask of {type(mask.tensor).__name__} is not covered (a tensor)")
        m = lw.in_order(mask.tensor)
        shape, dtype = lw.shape(m), lw.node(m).dtype
        lead = len(scores_shape) - len(shape)
        if lead < 0 or any(a not in (1, b) for a, b in zip(shape, scores_shape[lead:], strict=True)):
            raise UnsupportedGraph(
                f"an attention mask of shape {shape} does not broadcast to the scores {scores_shape}"
            )
        if dtype == "bool":
            drop = -math.inf
            scores = lw.ew("where", m, drop, scores) if mask.masked_where else lw.ew("where", m, scores, drop)
        elif dtype == "float32":
            scores = lw.ew("add", scores, m)
        else:
            raise UnsupportedGraph(f"an attention mask of {dtype} is not covered (bool or float32)")
    # A row whose every score is dropped attends to nothing: PyTorch's attention gives it zeros
    # (a "safe" softmax), not the NaN of exp(-inf - -inf).
    dims = reduce_dims(lw.shape(scores), -1)
    top = lw.red("amax", scores, dims, True)
    top = lw.ew("where", lw.ew("eq", top, -math.inf), 0.0, top)
    e = lw.ew("exp", lw.ew("sub", scores, top))
    total = lw.red("sum", e, dims, True)
    probs = lw.ew("where", lw.ew("eq", total, 0.0), 0.0, lw.ew("div", e, total))
    return product(lw, probs, v)


def _causal(lw: LowerContext, mask: Mask, length: int, keys: int) -> bool:
    """Whether ``mask`` is the causal one of square scores: a bool ``ones`` with ``triu(1)``
    dropping the keys after each query, or ``tril(0)`` keeping the rest."""
    if not isinstance(mask.tensor, NodeRef) or length != keys:
        return False
    node = lw.node(mask.tensor)
    if node.dtype != "bool" or node.op not in ("triu", "tril") or node.shape[-2:] != (length, keys):
        return False
    source = lw.node(NodeRef(node.tensor_args()[0]))
    if source.op != "fill" or source.attrs != (1.0,) or any(d != 1 for d in node.shape[:-2]):
        return False
    diagonal = int(node.attrs[0])
    return (node.op, diagonal, mask.masked_where) in (("triu", 1, True), ("tril", 0, False))


def _dtype(lw: LowerContext, operands: list[Any]) -> str:
    """The common dtype of q, k and v: float32, or one half type (computed in float32, stored half)."""
    if not all(isinstance(t, NodeRef) for t in operands):
        raise UnsupportedGraph("scaled_dot_product_attention of a non-tensor operand")
    return one_float_type(lw, operands, "attention")


class AttentionWriter(Writer):
    """Emits one attention kernel with its fused epilogue."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        node = self.plan.nodes[kernel.mm]
        self.node = node
        bases = []
        for arg in node.tensor_args():
            base, transposed = base_of(self.plan, arg, sched.is_exported)
            if transposed:
                raise UnsupportedGraph("attention of a transposed operand is not covered")
            bases.append(base)
        self.q, self.k, self.v = bases
        qs, ks, vs = (self.plan.nodes[a].shape for a in node.tensor_args())
        self.bh = math.prod(qs[:-2])
        self.lq, self.d = qs[-2], qs[-1]
        self.lk, self.dv = ks[-2], vs[-1]
        self.scale, self.causal = node.attrs[0], bool(node.attrs[1])
        self.ndt = math.ceil(self.dv / params.attn_block_d)
        self.half = node.dtype in HALF
        """Half operands meet in ``tl.dot`` as they are (scores and sums in float32) and the
        probabilities are rounded to the operands' type for the second product, as PyTorch's
        flash and cuDNN kernels do; only under Triton's interpreter, whose bfloat16 products are
        wrong, are the operands widened (``WIDE``)."""
        self.hoisted = self.d <= params.attn_block_k
        """The head dim fits one ``attn_block_k`` step: the program's queries are loaded once,
        before the key loop, not once per key tile."""

    def space(self, row: bool) -> IndexSpace:
        return IndexSpace(lin="lin", mask="cmask")

    def broadcast_row(self, var: str) -> str:
        return var

    def _dot(self, a: str, b: str, acc: str) -> str:
        if self.half:
            return half_dot(a, b, acc)
        return f'tl.dot({a}, {b}, {acc}, input_precision="{self.params.attn_precision}")'

    def _load_q(self, s: Scope) -> None:
        self.emit(
            s,
            f"q = tl.load({self.pointer(self.q)} + (bh * {self.lq} + rm[:, None]) * {self.d} + rk[None, :], "
            "mask=mmask[:, None] & kmask[None, :], other=0.0)",
        )

    def _key_tile(self, loop: Scope, masked: bool) -> None:
        """One key tile: its scores (base-2, scaled), the online softmax's update and ``acc``."""
        e = self.emit
        lk, d, dv = self.lk, self.d, self.dv
        pk, pv = self.pointer(self.k), self.pointer(self.v)
        e(loop, "rn = n0 + tl.arange(0, BLOCK_N)")
        e(loop, f"nmask = rn < {lk}")
        e(loop, "qk = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)")
        kt = (
            f"tl.load({pk} + (bh * {lk} + rn[None, :]) * {d} + rk[:, None], "
            "mask=kmask[:, None] & nmask[None, :], other=0.0)"
        )
        if self.hoisted:
            e(loop, f"kt = {kt}")
            e(loop, f"qk = {self._dot('q', 'kt', 'qk')}")
        else:
            e(loop, f"for k0 in range(0, {d}, BLOCK_K):")
            inner = Scope(indent=loop.indent + "    ", parent=loop)
            e(inner, "rk = k0 + tl.arange(0, BLOCK_K)")
            e(inner, f"kmask = rk < {d}")
            self._load_q(inner)
            e(inner, f"kt = {kt}")
            e(inner, f"qk = {self._dot('q', 'kt', 'qk')}")
        # scores in base 2: exp(s * scale) == exp2(s * scale * log2(e))
        qk = f"qk * {self.scale * math.log2(math.e)!r}"
        if masked:
            valid = "nmask[None, :] & (rn[None, :] <= rm[:, None])" if self.causal else "nmask[None, :]"
            e(loop, f"qk = tl.where({valid}, {qk}, float('-inf'))")
        else:
            e(loop, f"qk = {qk}")
        e(loop, "m_new = tl.maximum(m_i, tl.max(qk, axis=1))")
        e(loop, "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
        e(loop, "pr = tl.exp2(qk - m_safe[:, None])")
        e(loop, "alpha = tl.exp2(m_i - m_safe)")
        e(loop, "l_i = l_i * alpha + tl.sum(pr, axis=1)")
        vmask = (
            "nmask[:, None] & dmask[None, :]" if masked or _ragged(lk, self.params.attn_block_n) else "dmask[None, :]"
        )
        e(loop, f"v = tl.load({pv} + (bh * {lk} + rn[:, None]) * {dv} + rd[None, :], mask={vmask}, other=0.0)")
        if self.half:
            e(loop, "pr = pr.to(v.dtype)")
        e(loop, f"acc = {self._dot('pr', 'v', 'acc * alpha[:, None]')}")
        e(loop, "m_i = m_new")

    def write(self) -> Launch:
        p = self.params
        s = Scope(indent="    ")
        lq, lk, dv = self.lq, self.lk, self.dv
        start = len(self.lines)
        e = self.emit
        e(s, f"pid = {self.pid(0)}")
        e(s, f"bh = {self.pid(1)}")
        e(s, f"row0 = (pid // {self.ndt}) * BLOCK_M")
        e(s, "rm = row0 + tl.arange(0, BLOCK_M)")
        e(s, f"rd = (pid % {self.ndt}) * BLOCK_D + tl.arange(0, BLOCK_D)")
        e(s, f"mmask = rm < {lq}")
        e(s, f"dmask = rd < {dv}")
        e(s, "m_i = tl.full((BLOCK_M,), float('-inf'), tl.float32)")
        e(s, "l_i = tl.zeros((BLOCK_M,), tl.float32)")
        e(s, "acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)")
        if self.hoisted:
            e(s, "rk = tl.arange(0, BLOCK_K)")
            e(s, f"kmask = rk < {self.d}")
            self._load_q(s)
        loop = Scope(indent="        ", parent=s)
        if self.causal:
            # key tiles wholly at or before the block's first query need no mask; the rest, up to
            # the block's last query (the diagonal), do
            e(s, "full = (row0 // BLOCK_N) * BLOCK_N")
            e(s, f"for n0 in range(0, tl.minimum(full, {(lk // p.attn_block_n) * p.attn_block_n}), BLOCK_N):")
            self._key_tile(loop, masked=False)
            e(s, f"for n0 in range(tl.minimum(full, {(lk // p.attn_block_n) * p.attn_block_n}), "
                 f"tl.minimum({lk}, row0 + BLOCK_M), BLOCK_N):")  # fmt: skip
            self._key_tile(loop, masked=True)
        else:
            e(s, f"for n0 in range(0, {lk}, BLOCK_N):")
            self._key_tile(loop, masked=_ragged(lk, p.attn_block_n))
        e(s, "o = acc / l_i[:, None]")
        e(s, "cmask = mmask[:, None] & dmask[None, :]")
        e(s, f"lin = (bh * {lq} + rm[:, None]) * {dv} + rd[None, :]")
        self.store_exports(s, self.node.id, "o")
        body = self.lines[start:]
        consts = {
            "BLOCK_M": p.attn_block_m,
            "BLOCK_N": p.attn_block_n,
            "BLOCK_K": p.attn_block_k,
            "BLOCK_D": p.attn_block_d,
            **(WIDE if self.half else {}),
        }
        return Launch(
            source="\n".join(["@triton.jit", self.signature(list(consts)), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(lq / p.attn_block_m) * self.ndt, self.bh),
            constexprs=consts,
            num_warps=p.attn_warps,
            num_stages=p.attn_stages,
        )


_ATTN = ("attn_block_m", "attn_block_n", "attn_block_k", "attn_block_d", "attn_warps", "attn_stages", "attn_precision")


def _ragged(extent: int, block: int) -> bool:
    """Whether the last of ``extent``'s tiles of ``block`` may be partial (always, for a size that
    moves: the kernel then serves every length)."""
    return isinstance(extent, Sym) or extent % block != 0


def _tile(extent: int) -> int:
    """A head-dim tile: the extent's power of two, 16 to 128."""
    return max(16, min(128, next_pow2(extent)))


def _attn_defaults(plan: Plan, sched: Schedule, kernel: Kernel, values: Values) -> dict[str, object]:
    node = plan.nodes[kernel.mm]
    d, dv = plan.nodes[node.tensor_args()[0]].shape[-1], node.shape[-1]
    return {
        "attn_block_d": _tile(dv),
        "attn_block_m": 64,
        "attn_block_n": 32,
        "attn_block_k": _tile(d),  # the head dim in one step up to 128: queries loaded once
    }


def _attn_fit(
    hw: GpuModel, plan: Plan, sched: Schedule, kernel: Kernel, tf32: bool, values: Values
) -> dict[str, object]:
    """Flash-attention tiles: half operands 128 queries x 64 keys a step, 8 warps from a value
    tile of 128 (4 below), 3 stages; float32 keeps 64 x 32 (twice the bytes a tile) and sums in
    three TF32 passes where they beat the CUDA cores (``tf32x3_pays``), as fp32 products do."""
    if "attn_block_m" in values:
        return {}
    node = plan.nodes[kernel.mm]
    if node.dtype in HALF:
        warps = 8 if _tile(node.shape[-1]) >= 128 else 4
        return {"attn_block_m": 128, "attn_block_n": 64, "attn_warps": warps, "attn_stages": 3}
    return {"attn_precision": "tf32x3"} if hw.tf32x3_pays else {}


def _attn_relevant(plan: Plan, sched: Schedule, kernel: Kernel, params: TemplateParams) -> list[str]:
    return [n for n in _ATTN if n != "attn_precision" or plan.nodes[kernel.mm].dtype not in HALF]


register(
    KernelTemplate(
        kind=KernelKind.ATTN,
        writer=AttentionWriter,
        defaults=_attn_defaults,
        relevant=_attn_relevant,
        fit=_attn_fit,
        compute=_ATTN,
        latency=("attn_stages",),
        precision=("attn_precision",),
    )
)
