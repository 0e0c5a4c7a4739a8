"""The convolution template: a (transposed) convolution as an implicit matrix product.

Rows of the product are output positions (batch x output spatial), columns are the output
channels of one group, and the reduction runs over that group's input channels x kernel taps.
No patch matrix is built: each ``[BLOCK_M, BLOCK_K]`` tile of it is gathered from the input with
the padding as masked-out (zero) loads. A forward convolution reads input position
``o * stride - padding + k * dilation``; a transposed one (its gather form) reads
``(o + padding - k * dilation) / stride`` where that is a whole number inside the input. Groups
are the launch's second axis (depthwise and pointwise are groups of one channel and 1x1
kernels). The elementwise ops that follow (bias, activations, scaling, residual adds) run on the
accumulator tile before the one store, through the shared :class:`~emit.Writer` machinery.
"""

from __future__ import annotations

import math

from actors.experts.template.emit import IndexSpace, Launch, Scope, Writer
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.fuse import Kernel, Schedule, base_of
from actors.experts.template.ir import ConvSpec
from actors.experts.template.params import TemplateParams


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def coords(writer: Writer, s: Scope, flat: str, sizes: tuple[int, ...], prefix: str) -> list[str]:
    """Emit variables ``prefix{d}`` holding the row-major coordinates of ``flat`` over ``sizes``."""
    names = []
    for d, (size, stride) in enumerate(zip(sizes, _strides(sizes), strict=True)):
        expr = flat if stride == 1 else f"({flat} // {stride})"
        if d > 0:
            expr = f"{expr} % {size}"
        writer.emit(s, f"{prefix}{d} = {expr}")
        names.append(f"{prefix}{d}")
    return names


class ConvWriter(Writer):
    """Emits one convolution kernel with its fused epilogue."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        node = self.plan.nodes[kernel.mm]
        x, w = node.tensor_args()
        self.xbase, xt = base_of(self.plan, x, sched.is_exported)
        self.wbase, wt = base_of(self.plan, w, sched.is_exported)
        if xt or wt:
            raise UnsupportedGraph("a convolution of a transposed tensor is not covered")
        self.spec = ConvSpec.from_attrs(node.attrs)
        xs, ws, os = self.plan.nodes[x].shape, self.plan.nodes[w].shape, node.shape
        self.out_shape = os
        self.nd = len(os) - 2
        self.cin, self.cout = xs[1], os[1]
        self.sin, self.sout, self.ks = xs[2:], os[2:], ws[2:]
        g = self.spec.groups
        self.cin_g, self.cout_g = self.cin // g, self.cout // g
        self.taps = math.prod(self.ks)
        self.k = self.cin_g * self.taps
        self.m = xs[0] * math.prod(self.sout)
        if g > 65535:
            raise UnsupportedGraph(f"a convolution with {g} groups (more than the launch grid's 65535)")

    def space(self, row: bool) -> IndexSpace:
        rank = len(self.out_shape)
        fast = {(1, 2): "co[None, :]", (0, 1): "nb[:, None]", (2, rank): "sp[:, None]"}
        return IndexSpace(lin="lin", mask="cmask", shape=self.out_shape, fast=fast)

    def broadcast_row(self, var: str) -> str:
        return var

    def _gather(self, loop: Scope, outs: list[str], taps: list[str]) -> tuple[str, str]:
        """The input offset within one (batch, channel) plane and its validity, per tile element."""
        spec = self.spec
        offset: list[str] = []
        valid: list[str] = []
        for d in range(self.nd):
            o, k = f"{outs[d]}[:, None]", f"{taps[d]}[None, :]"
            s, p, dl, size = spec.stride[d], spec.padding[d], spec.dilation[d], self.sin[d]
            kd = k if dl == 1 else f"{k} * {dl}"
            if not spec.transposed:
                od = o if s == 1 else f"{o} * {s}"
                pos = f"{od} - {p} + {kd}" if p else f"{od} + {kd}"
                self.emit(loop, f"i{d} = {pos}")
                valid.append(f"(i{d} >= 0) & (i{d} < {size})")
            else:
                pos = f"{o} + {p} - {kd}" if p else f"{o} - {kd}"
                if s == 1:
                    self.emit(loop, f"i{d} = {pos}")
                    valid.append(f"(i{d} >= 0) & (i{d} < {size})")
                else:
                    self.emit(loop, f"t{d} = {pos}")
                    self.emit(loop, f"i{d} = t{d} // {s}")
                    valid.append(f"(t{d} >= 0) & (t{d} % {s} == 0) & (i{d} < {size})")
            stride = math.prod(self.sin[d + 1 :])
            offset.append(f"i{d}" if stride == 1 else f"i{d} * {stride}")
        return " + ".join(offset), " & ".join(valid)

    def write(self) -> Launch:
        p = self.params
        s = Scope(indent="    ")
        px, pw = self.pointer(self.xbase), self.pointer(self.wbase)
        plane = math.prod(self.sin)
        so = math.prod(self.sout)
        npn = math.ceil(self.cout_g / p.conv_block_n)
        start = len(self.lines)
        e = self.emit
        e(s, f"pid = {self.pid(0)}")
        e(s, f"g = {self.pid(1)}")
        e(s, f"rm = (pid // {npn}) * BLOCK_M + tl.arange(0, BLOCK_M)")
        e(s, f"rn = (pid % {npn}) * BLOCK_N + tl.arange(0, BLOCK_N)")
        e(s, f"co = g * {self.cout_g} + rn")
        e(s, f"mmask = rm < {self.m}")
        e(s, f"nmask = rn < {self.cout_g}")
        e(s, f"nb = rm // {so}")
        e(s, f"sp = rm % {so}")
        outs = coords(self, s, "sp", self.sout, "o")
        e(s, f"xrow = nb * {self.cin * plane} + g * {self.cin_g * plane}")
        e(s, "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        e(s, f"for k0 in range(0, {self.k}, BLOCK_K):")
        loop = Scope(indent="        ", parent=s)
        rk = "(k0 + tl.arange(0, BLOCK_K)).to(tl.int64)" if self.wide else "k0 + tl.arange(0, BLOCK_K)"
        e(loop, f"rk = {rk}")
        e(loop, f"kmask = rk < {self.k}")
        e(loop, f"ci = rk // {self.taps}")
        e(loop, f"kp = rk % {self.taps}")
        taps = coords(self, loop, "kp", self.ks, "q")
        offset, valid = self._gather(loop, outs, taps)
        e(loop, f"a_mask = mmask[:, None] & kmask[None, :] & {valid}")
        e(loop, f"a = tl.load({px} + xrow[:, None] + ci[None, :] * {plane} + {offset}, mask=a_mask, other=0.0)")
        if self.spec.transposed:
            w_index = f"((g * {self.cin_g} + ci[:, None]) * {self.cout_g} + rn[None, :]) * {self.taps} + kp[:, None]"
        else:
            w_index = f"co[None, :] * {self.k} + rk[:, None]"
        e(loop, f"b = tl.load({pw} + {w_index}, mask=kmask[:, None] & nmask[None, :], other=0.0)")
        if p.conv_precision == "fma":  # few output channels: no tl.dot (16 columns at least)
            e(loop, "acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)")
        else:
            e(loop, f'acc = tl.dot(a, b, acc, input_precision="{p.conv_precision}")')
        e(s, "cmask = mmask[:, None] & nmask[None, :]")
        e(s, f"lin = (nb[:, None] * {self.cout} + co[None, :]) * {so} + sp[:, None]")
        s.memo[("v", self.kernel.mm)] = "acc"
        for nid in self.kernel.exports:
            self.store(s, nid, row=False)
        body = self.lines[start:]
        src = ["@triton.jit", self.signature(["BLOCK_M", "BLOCK_N", "BLOCK_K"]), *body]
        return Launch(
            source="\n".join(src),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(self.m / p.conv_block_m) * npn, self.spec.groups),
            constexprs={"BLOCK_M": p.conv_block_m, "BLOCK_N": p.conv_block_n, "BLOCK_K": p.conv_block_k},
            num_warps=p.conv_warps,
            num_stages=p.conv_stages,
        )
