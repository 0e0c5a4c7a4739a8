"""The pooling template: window max/avg over the trailing dims, one output element per lane.

A program takes ``32 * pw_warps`` consecutive output elements, one per thread, splits each flat
index into a leading plane and output coordinates, and loops over the window's taps, reading
``o * stride - padding + k * dilation`` where it falls inside the input. Max pooling propagates
NaN as PyTorch does; average pooling divides by PyTorch's count (the window clipped to the padded
input, or to the input itself when ``count_include_pad`` is off, or the ``divisor_override``).
``pw_ept`` does not apply: with two elements per thread, Triton 3.6 on an H200 dropped in-bounds
taps of windows that straddle the padding (8 of the 40 outputs of ``F.avg_pool2d(x, 3, 2, 1,
ceil_mode=True, divisor_override=5)`` on a (1, 2, 8, 7) input; the interpreter was right).
A float16 or bfloat16 input is read as float32 (the window's maximum is exact, its sum is
accumulated in float32); elementwise ops that follow are computed before the one store, which
rounds each stored value to its node's type.
"""

from __future__ import annotations

import math

from actors.experts.template.emit import IndexSpace, Launch, Scope, Writer
from actors.experts.template.emit_conv import coords
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.fuse import Kernel, Schedule, base_of
from actors.experts.template.ir import HALF, PoolSpec
from actors.experts.template.params import TemplateParams


class PoolWriter(Writer):
    """Emits one pooling kernel with its fused epilogue."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        node = self.plan.nodes[kernel.mm]
        src = node.tensor_args()[0]
        self.xbase, transposed = base_of(self.plan, src, sched.is_exported)
        if transposed:
            raise UnsupportedGraph("a pooling of a transposed tensor is not covered")
        self.widen = ".to(tl.float32)" if self.plan.nodes[self.xbase].dtype in HALF else ""
        self.op = node.op
        self.spec = PoolSpec.from_attrs(node.attrs)
        nd = len(self.spec.kernel)
        self.sin = self.plan.nodes[src].shape[-nd:]
        self.sout = node.shape[-nd:]
        self.out_shape = node.shape

    def space(self, row: bool) -> IndexSpace:
        return IndexSpace(lin="offs", mask="mask")

    def broadcast_row(self, var: str) -> str:
        return var

    def _divisor(self, s: Scope, outs: list[str]) -> str:
        spec = self.spec
        if spec.divisor_override:
            return f"{float(spec.divisor_override)!r}"
        factors = []
        for d, o in enumerate(outs):
            k, st, p, size = spec.kernel[d], spec.stride[d], spec.padding[d], self.sin[d]
            self.emit(s, f"hs{d} = {o} * {st} - {p}")
            self.emit(s, f"he{d} = tl.minimum(hs{d} + {k}, {size + p})")
            if spec.count_include_pad:
                factors.append(f"(he{d} - hs{d})")
            else:
                factors.append(f"(tl.minimum(he{d}, {size}) - tl.maximum(hs{d}, 0))")
        self.emit(s, f"cnt = ({' * '.join(factors)}).to(tl.float32)")
        return "cnt"

    def write(self) -> Launch:
        spec = self.spec
        s = Scope(indent="    ")
        px = self.pointer(self.xbase)
        numel = math.prod(self.out_shape)
        so, plane = math.prod(self.sout), math.prod(self.sin)
        taps = math.prod(spec.kernel)
        start = len(self.lines)
        e = self.emit
        e(s, f"offs = {self.pid()} * BLOCK + tl.arange(0, BLOCK)")
        e(s, f"mask = offs < {numel}")
        e(s, f"sp = offs % {so}")
        e(s, f"xrow = (offs // {so}) * {plane}")
        outs = coords(self, s, "sp", self.sout, "o")
        is_max = self.op == "max"
        e(s, "acc = tl.full((BLOCK,), float('-inf'), tl.float32)" if is_max else "acc = tl.zeros((BLOCK,), tl.float32)")
        e(s, f"for t in range({taps}):")
        loop = Scope(indent="        ", parent=s)
        ks = coords(self, loop, "t", spec.kernel, "q")
        offset, valid = [], ["mask"]
        for d in range(len(spec.kernel)):
            st, p, dl = spec.stride[d], spec.padding[d], spec.dilation[d]
            e(loop, f"i{d} = {outs[d]} * {st} - {p} + {ks[d]} * {dl}")
            valid.append(f"(i{d} >= 0) & (i{d} < {self.sin[d]})")
            stride = math.prod(self.sin[d + 1 :])
            offset.append(f"i{d}" if stride == 1 else f"i{d} * {stride}")
        pad = "float('-inf')" if is_max else "0.0"
        e(loop, f"v = tl.load({px} + xrow + {' + '.join(offset)}, mask={' & '.join(valid)}, other={pad}){self.widen}")
        e(loop, "acc = tl.where((v > acc) | (v != v), v, acc)" if is_max else "acc += v")
        if not is_max:
            e(s, f"acc = acc / {self._divisor(s, outs)}")
        self.store_exports(s, self.kernel.mm, "acc")
        body = self.lines[start:]
        block = 32 * self.params.pw_warps
        return Launch(
            source="\n".join(["@triton.jit", self.signature(["BLOCK"]), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(numel / block),),
            constexprs={"BLOCK": block},
            num_warps=self.params.pw_warps,
            num_stages=1,
        )
