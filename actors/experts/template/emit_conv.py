"""The convolution template: a (transposed) convolution as an implicit matrix product.

Rows of the product are output positions (batch x output spatial), columns are the output
channels of one group, and the reduction runs over that group's input channels x kernel taps.
No patch matrix is built: each ``[BLOCK_M, BLOCK_K]`` tile of it is gathered from the input with
the padding as masked-out (zero) loads. The reduction runs in one of two orders
(``conv_taps_outer``): one flat index over (input channel, tap), whose position arithmetic is done
per tile element, or taps outside and chunks of input channels inside, where a tap's input position
and its padding mask are worked out once per row of the tile (a vector of ``BLOCK_M``), and the
channel chunk only adds a multiple of the input plane; its weights are repacked per call so that a
tile's output channels are contiguous. With ``fma``, or one input channel per group (depthwise),
the products are outer products of a vector of inputs and a vector of weights, one channel and tap
at a time (the earlier form, a ``[BLOCK_M, BLOCK_K, BLOCK_N]`` tile of products summed over K, was
off by 3e-4 to 0.64 on at least 9 small cases with 16x16x16 tiles on an H200, Triton 3.6, and right
under the interpreter; the outer products are right on both). A forward convolution reads input position
``o * stride - padding + k * dilation``; a transposed one (its gather form) reads
``(o + padding - k * dilation) / stride`` where that is a whole number inside the input; walked
taps outside, a strided one runs in its stride phases (:meth:`ConvWriter.phased`), each walking only
the taps that land on whole input positions for it, not every tap with most of them masked. Groups
are the launch's second axis (depthwise and pointwise are groups of one channel and 1x1
kernels). The elementwise ops that follow (bias, activations, scaling, residual adds) run on the
accumulator tile before the one store, through the shared :class:`~emit.Writer` machinery.
"""

from __future__ import annotations

import math
from functools import cached_property

from actors.experts.precision import tf32_rounding
from actors.experts.template.any_batch import Sym
from actors.experts.template.any_sizes import Decided
from actors.experts.template.emit import WIDE, IndexSpace, Launch, Scope, Writer, half_dot
from actors.experts.template.emit_row import FEW_PROGRAMS, next_pow2
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.fuse import Kernel, Schedule, base_of
from actors.experts.template.ir import HALF, ConvSpec, NodeKind
from actors.experts.template.params import TemplateParams


def outer_products(params: TemplateParams, cin_per_group: int) -> bool:
    """Whether a convolution's products are outer products of a vector of inputs and a vector of
    weights, one input channel and tap at a time: with ``fma``, and always with one input channel
    per group (``tl.dot`` would mask out 255 of every 256 products of a depthwise convolution)."""
    return params.conv_precision == "fma" or cin_per_group == 1


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


MIN_ONE_CHANNEL_ROWS = 32
"""Fewest rows of a :attr:`ConvWriter.one_channel` tile: its rows are one image's positions, so
the tile shrinks to the power of two that holds them (a 7x7 output: 64, not 1024 rows of which
975 would be masked), but not below one warp's threads."""


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


def _past_end(last: int, size: int) -> bool:
    """Whether input index ``last`` may be past an input of ``size``: where both move with the
    task's sizes and no comparison holds at every size (a strided window: by the size's parity),
    it may, and the bound is checked in the kernel."""
    try:
        return last >= size
    except Decided:
        return True


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
        self.half = node.dtype in HALF
        """Half input and weights: ``tl.dot`` takes them as they are (float32 sums, as cuDNN's),
        widened only under Triton's interpreter (``WIDE``, as for products); outer products
        widen them first (a product of two half values is exact in float32)."""
        self.k = self.cin_g * self.taps
        self.m = xs[0] * math.prod(self.sout)
        if g > 65535:
            raise UnsupportedGraph(f"a convolution with {g} groups (more than the launch grid's 65535)")

    def space(self, row: bool) -> IndexSpace:
        rank = len(self.out_shape)
        if self.one_channel:
            fast = {(1, 2): "co", (0, 1): "nb", (2, rank): "sp"}
        else:
            fast = {(1, 2): "co[None, :]", (0, 1): "nb[:, None]", (2, rank): "sp[:, None]"}
            vectors = {
                (1, 2): ("co", "nmask", "[None, :]"),
                (0, 1): ("nb", "mmask", "[:, None]"),
                (2, rank): ("sp", "mmask", "[:, None]"),
            }
            return IndexSpace(lin="lin", mask="cmask", shape=self.out_shape, fast=fast, vectors=vectors)
        return IndexSpace(lin="lin", mask="cmask", shape=self.out_shape, fast=fast)

    @cached_property
    def one_channel(self) -> bool:
        """Whether the tile is one output channel's ``BLOCK_M`` output positions of one image, kept
        as 1-D vectors (``acc`` ``[BLOCK_M]``, a scalar weight per tap, the image ``nb`` a scalar,
        the channel ``co`` the group's index in every element): a depthwise convolution's outer
        products, one output channel per group, no phases, no spatial sum. Fixed per kernel, so
        computed once. Triton 3.6 miscompiled the ``[BLOCK_M, 1]`` tile on an H200 (every output
        of a 5x5, stride-2 depthwise convolution of KernelBench L3-22 wrong at ``BLOCK_M`` 1024 and
        4 warps, right as 1-D). As 1-D tiles over the flat (image, position) rows, with the image
        ``rm // so`` per element, the same kernel still came out wrong at other tiles (480
        channels, 3x3, 14x14, batch 10, 256 rows: half the outputs), with the store's index
        spelled either way; tiles that never straddle two images were right at every tile and
        shape tried (a replica of the emitted kernel, Triton 3.6 on an H200), and need no division
        per element for the image."""
        return (
            self.cout_g == 1
            and outer_products(self.params, self.cin_g)
            and self.blocks()[1] == 1
            and not self.phased()
            and not any(self._summed(n) for n in self.kernel.exports)
        )

    def broadcast_row(self, var: str) -> str:
        return var

    def _positions(self, loop: Scope, outs: list[str], taps: list[str]) -> tuple[str, str]:
        """The input offset within one (batch, channel) plane and its validity, from output
        coordinate and tap expressions already shaped to broadcast (per tile element in the flat
        order, per row taps outside). Bounds a forward convolution cannot cross are not checked."""
        spec = self.spec
        offset: list[str] = []
        valid: list[str] = []
        for d in range(self.nd):
            o, q = outs[d], taps[d]
            s, p, dl, size = spec.stride[d], spec.padding[d], spec.dilation[d], self.sin[d]
            qd = q if dl == 1 else f"{q} * {dl}"
            if not spec.transposed:
                od = o if s == 1 else f"{o} * {s}"
                self.emit(loop, f"i{d} = {od} - {p} + {qd}" if p else f"i{d} = {od} + {qd}")
                if p:  # without padding no tap reads below 0
                    valid.append(f"(i{d} >= 0)")
                if _past_end((self.sout[d] - 1) * s - p + (self.ks[d] - 1) * dl, size):  # the last row's last tap
                    valid.append(f"(i{d} < {size})")
            else:
                pos = f"{o} + {p} - {qd}" if p else f"{o} - {qd}"
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

    def _phase_positions(self, loop: Scope) -> tuple[str, str]:
        """In a :meth:`phased` loop, from the phase's tap counter ``kt``: the tap's index in the
        kernel (``kt`` again, for the weights) and the input offset within one plane and its
        validity per row (``j{d} + h{d} - t{d} * dilation``, inside the input)."""
        e = self.emit
        e(loop, "tq = kt")
        offset: list[str] = []
        valid: list[str] = []
        taps: list[str] = []
        for d in range(self.nd):
            st, dl, size = self.spec.stride[d], self.spec.dilation[d], self.sin[d]
            rest = " * ".join(f"nt{x}" for x in range(d + 1, self.nd))
            e(loop, f"t{d} = (tq // ({rest})) % nt{d}" if rest else f"t{d} = tq % nt{d}")
            e(loop, f"i{d} = j{d} + h{d} - t{d}" + (f" * {dl}" if dl != 1 else ""))
            valid.append(f"(i{d} >= 0) & (i{d} < {size})")
            k = f"(r{d} + {st} * t{d})" if st > 1 else f"t{d}"
            taps.append(k if d == self.nd - 1 else f"{k} * {math.prod(self.ks[d + 1 :])}")
            stride = math.prod(self.sin[d + 1 :])
            offset.append(f"i{d}" if stride == 1 else f"i{d} * {stride}")
        e(loop, f"kt = {' + '.join(taps)}")
        return " + ".join(offset), " & ".join(valid)

    def taps_outer(self) -> bool:
        """Whether the reduction walks taps outside and input channels inside: ``conv_taps_outer``,
        and always with ``fma`` or one input channel per group (products of vectors and weights,
        one channel at a time: no ``[BLOCK_M, BLOCK_K, BLOCK_N]`` tile of products)."""
        return self.params.conv_taps_outer or outer_products(self.params, self.cin_g)

    def _warps(self, bm: int, one: bool) -> int:
        """The launch's warps: ``conv_warps``, at most one per 64 rows of a one-channel tile, and at
        most 4 for a three-pass TF32 dot over 64-row tiles. On an H100 (Triton 3.6, KernelBench
        L3-25 at its published size, 2026-12-07) every candidate with such kernels launched with 8
        warps was wrong (NaN/Inf in a third of the output: 8 of 8 verdicts in a 60 s run; 5 of 5
        renders run alone outside the evaluator flagged), the same tiles with 4 warps were right
        (1 of 1 run alone); 128-row tiles with 8 warps were not measured. The kernels' masks and
        addresses are the same at any warp count (the interpreter, which has no warps, computes
        them right at these sizes)."""
        p = self.params
        if one:
            return min(p.conv_warps, max(1, bm // 64))
        if p.conv_precision == "tf32x3" and bm < 128 and not outer_products(p, self.cin_g):
            return min(p.conv_warps, 4)
        return p.conv_warps

    def phased(self) -> bool:
        """Whether a strided transposed convolution is split into its stride phases (taps
        outside only): the output positions ``o`` with the same ``o % stride`` per dimension read
        the input through the same taps, ``k = r + stride * t`` with ``r`` fixed by the phase, so
        a phase walks only its own taps (``ceil(k / stride)`` per dimension) instead of every tap
        with most masked out: 1/4 of the products of a 3x3, stride-2 kernel are real (KernelBench
        L2-2). Where a dimension's dilation shares a factor with its stride, no such ``r`` exists
        for every phase, and the taps stay masked."""
        spec = self.spec
        return (
            spec.transposed
            and self.taps_outer()
            and any(s > 1 for s in spec.stride)
            and all(math.gcd(dl, s) == 1 for dl, s in zip(spec.dilation, spec.stride, strict=True))
        )

    def channels_last(self) -> bool:
        """Whether the input is read from a channels-last copy (``conv_layout`` ``nhwc``): only
        for ``tl.dot`` reductions, whose channel chunks are then contiguous (taps outside), or, in
        a forward convolution's flat order, whose index runs over (tap, input channel) with the
        channels fastest, so a tap's few channels are one contiguous run of the copy."""
        if self.params.conv_layout != "nhwc" or outer_products(self.params, self.cin_g):
            return False
        return self.params.conv_taps_outer or not self.spec.transposed

    def preround(self) -> bool:
        """Whether the operands are rounded to TF32 before the loop (``conv_preround``) instead
        of per tile inside it."""
        return (
            self.params.conv_precision == "tf32"
            and not self.half
            and self.params.conv_preround
            and not outer_products(self.params, self.cin_g)
        )

    def blocks(self) -> tuple[int, int, int]:
        """``BLOCK_M, BLOCK_N, BLOCK_K`` of this kernel. Taps outside, the channel tiles shrink to
        the channels there are. For ``outer_products`` ``BLOCK_K`` is 1 and the rows grow to keep
        the tile's size where the output channels are fewer (up to 1024); with ``tl.dot`` the
        channel tiles stay 16 at least."""
        p = self.params
        if not self.taps_outer():
            return p.conv_block_m, p.conv_block_n, p.conv_block_k
        if outer_products(p, self.cin_g):
            bn = min(p.conv_block_n, next_pow2(self.cout_g))
            return min(1024, max(p.conv_block_m, p.conv_block_m * p.conv_block_n // bn)), bn, 1
        bn = max(16, min(p.conv_block_n, next_pow2(self.cout_g)))
        bk = max(16, min(p.conv_block_k, next_pow2(self.cin_g)))
        return (*self._spread(p.conv_block_m, bn), bk)

    def _spread(self, bm: int, bn: int) -> tuple[int, int]:
        """Smaller tiles (rows down to 32, then channels down to 16) for a convolution that is
        not the schedule's first while its tiles are fewer than the first one's (at most
        :data:`FEW_PROGRAMS`): the ``conv_*`` parameters were chosen for the first (the GPU model
        and the defaults read the first kernel of each kind), and a whole model's later layers
        have fewer positions and more channels. ResNet-18 at batch 2 ran its 512-channel 7x7
        layers in 8 tiles of 128 x 64 on an H100's 132 SMs (54 us a layer; all of cuDNN's
        convolutions together took 187 us)."""
        first = next((k for k in self.sched.kernels if k.kind is self.kernel.kind), self.kernel)
        if first is self.kernel or self.phased():
            return bm, bn
        node = self.plan.nodes[first.mm]
        xs, os = self.plan.nodes[node.tensor_args()[0]].shape, node.shape
        groups = ConvSpec.from_attrs(node.attrs).groups
        first_bn = max(16, min(self.params.conv_block_n, next_pow2(os[1] // groups)))
        n_tiles = math.ceil(os[1] // groups / first_bn) * groups
        if isinstance(self.m, Sym) or isinstance(xs[0], Sym):
            # the any-batch copies: tiles per image, so that the copy's text is the same at every
            # batch (any_sizes.check_texts), and enough of them in one image is enough at any batch
            want_per_image = min(FEW_PROGRAMS, math.prod(os[2:]) / self.params.conv_block_m * n_tiles)

            def per_image(m_tile: int, n_tile: int) -> float:
                return math.prod(self.sout) / m_tile * math.ceil(self.cout_g / n_tile) * self.spec.groups

            while per_image(bm, bn) < want_per_image and bm > 32:
                bm //= 2
            while per_image(bm, bn) < want_per_image and bn > 16:
                bn //= 2
            return bm, bn
        want = min(FEW_PROGRAMS, math.ceil(xs[0] * math.prod(os[2:]) / self.params.conv_block_m) * n_tiles)

        def tiles(m_tile: int, n_tile: int) -> int:
            return math.ceil(self.m / m_tile) * math.ceil(self.cout_g / n_tile) * self.spec.groups

        while tiles(bm, bn) < want and bm > 32:
            bm //= 2
        while tiles(bm, bn) < want and bn > 16:
            bn //= 2
        return bm, bn

    def write(self) -> Launch:
        p = self.params
        s = Scope(indent="    ")
        plane = math.prod(self.sin)
        so = math.prod(self.sout)
        bm, bn, bk = self.blocks()
        packed = (self.taps_outer() and bk > 1) or self.preround() or self.channels_last()
        copied = self.channels_last() or self.preround()
        px = "xc" if copied else self.pointer(self.xbase)
        pw = "wp" if packed else self.pointer(self.wbase)
        npn = math.ceil(self.cout_g / bn)
        start = len(self.lines)
        e = self.emit
        e(s, f"pid = {self.pid(0)}")
        e(s, f"g = {self.pid(1)}")
        if self.phased():  # the phases of one tile run side by side: their stores meet in L2
            e(s, f"ph = pid % {self._phases()}")
            e(s, f"pid = pid // {self._phases()}")
        one = self.one_channel
        if one:  # npn is 1; a tile is one image's run of positions (see one_channel)
            bm = min(bm, max(MIN_ONE_CHANNEL_ROWS, next_pow2(so)))
            per_image = math.ceil(so / bm)
            if isinstance(per_image, Sym) or per_image > 1:  # a moving image: tiles per image at run time
                e(s, f"nb = pid // {per_image}")
                e(s, f"sp = (pid % {per_image}) * BLOCK_M + tl.arange(0, BLOCK_M)")
            else:
                e(s, "nb = pid")
                e(s, "sp = tl.arange(0, BLOCK_M)")
            e(s, "co = g + tl.zeros((BLOCK_M,), dtype=tl.int32)")  # a vector: the epilogue's loads are masked
        else:
            e(s, f"rm = (pid // {npn}) * BLOCK_M + tl.arange(0, BLOCK_M)")
            e(s, f"rn = (pid % {npn}) * BLOCK_N + tl.arange(0, BLOCK_N)")
            e(s, f"co = g * {self.cout_g} + rn")
            e(s, f"nmask = rn < {self.cout_g}")
        rows = self.m
        if one:
            rows = self.out_shape[0] * per_image * bm
            e(s, f"mmask = sp < {so}")
            outs = coords(self, s, "sp", self.sout, "o")
        elif self.phased():
            rows = self._phase_rows(s)
            outs = [f"o{d}" for d in range(self.nd)]
        else:
            e(s, f"mmask = rm < {self.m}")
            e(s, f"nb = rm // {so}")
            e(s, f"sp = rm % {so}")
            outs = coords(self, s, "sp", self.sout, "o")
        if self.channels_last():  # [batch, *spatial, channels]: a group's channels start at g * cin_g
            e(s, f"xrow = nb * {self.cin * plane} + g * {self.cin_g}")
        else:
            e(s, f"xrow = nb * {self.cin * plane} + g * {self.cin_g * plane}")
        tile = "(BLOCK_M,)" if one else "(BLOCK_M, BLOCK_N)"
        e(s, f"acc = tl.zeros({tile}, dtype=tl.float32)")
        if self.taps_outer():
            self._taps_outer(s, px, pw, plane, outs, bk)
        else:
            self._flat(s, px, pw, plane, outs)
        if one:
            e(s, "cmask = mmask")
            e(s, f"lin = (nb * {self.cout} + co) * {so} + sp")
        else:
            e(s, "cmask = mmask[:, None] & nmask[None, :]")
            e(s, f"lin = (nb[:, None] * {self.cout} + co[None, :]) * {so} + sp[:, None]")
        self.tile_rows = ("pid * BLOCK_M" if npn == 1 else f"(pid // {npn}) * BLOCK_M", rows // self.out_shape[0], bm)
        self.store_exports(s, self.kernel.mm, "acc")
        body = self.lines[start:]
        signature = self.signature(["BLOCK_M", "BLOCK_N", "BLOCK_K", *(["WIDE"] if self.half else [])])
        setup: tuple[str, ...] = tuple(f"_b{n}.zero_()" for n in self.kernel.exports if self._summed(n))
        lead: tuple[str, ...] = ()
        reads: tuple[int, ...] = ()
        pre: tuple[Launch, ...] = ()
        work: tuple[tuple[str, tuple[int, ...], str], ...] = ()
        idx = self.kernel.index
        if copied:
            signature = signature.replace("(", "(xc, ", 1)
            copy = self._input_copy()
            shape = self._copy_shape()
            work = (*work, (f"_xc{idx}", tuple(shape), self.plan.nodes[self.xbase].dtype))
            lead, reads, pre = (f"_xc{idx}",), (self.xbase,), (copy,)
        if packed:
            signature = signature.replace("(", "(wp, ", 1)
            if self.preround():  # packed and rounded by one kernel into a new buffer: the model's weights stay
                shape, _ = self._packing()
                work = (*work, (f"_wr{idx}", (math.prod(shape),), "float32"))
                pre = (*pre, self._packed_rounding(f"_wr{idx}"))
                weights = f"_wr{idx}"
            else:
                setup = (*setup, f"_wp{idx} = {self._packed_weight()}")
                weights = f"_wp{idx}"
            lead, reads = (weights, *lead), (self.wbase, *reads)
        return Launch(
            source="\n".join(["@triton.jit", signature, *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(rows / bm) * npn * (self._phases() if self.phased() else 1), self.spec.groups),
            constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **(WIDE if self.half else {})},
            num_warps=self._warps(bm, one),
            num_stages=p.conv_stages,
            lead_args=lead,
            setup=setup,
            pre=pre,
            reads=reads,
            work=work,
        )

    def _summed(self, nid: int) -> bool:
        """Whether an exported node is a spatial sum the tiles add into (``fuse.spatial_sum``)."""
        return self.plan.nodes[nid].kind is NodeKind.RED

    def store(self, scope: Scope, nid: int, row: bool) -> None:
        if self._summed(nid):
            self._sum_into(scope, nid)
        else:
            super().store(scope, nid, row)

    def _sum_into(self, scope: Scope, nid: int) -> None:
        """Add the tile's sums per (image, output channel) of a spatial sum's operand into its
        zeroed result (``[batch, channels, 1...]``): the tile's rows are consecutive output
        positions, so they span a few images, each summed in the tile (a fixed tree) and added
        once per channel (relaxed atomics: the tiles' order is free). Rows of one image are
        ``per`` apart; a tile spanning more than five images (outer products' long tiles) adds
        element by element. Where the positions per image move (an any-size copy) the images a tile
        spans are known at run time only, and a loop adds each."""
        first, per, bm = self.tile_rows
        n, c = self.out_shape[0], self.cout
        ptr = self.pointer(nid)
        src = self.value(scope, self.plan.nodes[nid].tensor_args()[0])
        part = self.fresh("ps")
        self.emit(scope, f"{part} = tl.where(cmask, {src}, 0.0)")
        if isinstance(per, Sym):
            img, reach, step = self.fresh("ni"), self.fresh("nr"), self.fresh("j")
            self.emit(scope, f"{img} = ({first}) // ({per})")
            self.emit(scope, f"{reach} = tl.minimum(({bm - 1}) // ({per}) + 2, ({n}) - {img})")
            self.emit(scope, f"for {step} in range(0, {reach}):")
            body = Scope(indent=scope.indent + "    ", parent=scope)
            total = self.fresh("ss")
            self.emit(body, f"{total} = tl.sum(tl.where(nb[:, None] == {img} + {step}, {part}, 0.0), axis=0)")
            self.emit(body, f'tl.atomic_add({ptr} + ({img} + {step}) * {c} + co, {total}, mask=nmask, sem="relaxed")')
            return
        if per % bm == 0:
            span = 1  # tiles never straddle two images
        elif bm % per == 0:
            span = bm // per  # tiles start on an image's first row
        else:
            span = (bm - 1) // per + 2
        span = min(span, n)
        if span > 5:
            at = f"nb[:, None] * {c} + co[None, :]"
            self.emit(scope, f'tl.atomic_add({ptr} + {at}, {part}, mask=cmask, sem="relaxed")')
            return
        img = self.fresh("ni")
        self.emit(scope, f"{img} = ({first}) // {per}")
        for j in range(span):
            at = f"({img} + {j})" if j else img
            total = self.fresh("ss")
            picked = f"tl.where(nb[:, None] == {at}, {part}, 0.0)" if span > 1 else part
            self.emit(scope, f"{total} = tl.sum({picked}, axis=0)")
            # an image past the batch has only masked-out rows: its sums (zeros) go to the last
            # image, harmlessly, rather than out of bounds
            row = f"tl.minimum({at}, {n - 1})" if j else at
            self.emit(scope, f'tl.atomic_add({ptr} + {row} * {c} + co, {total}, mask=nmask, sem="relaxed")')

    def _phases(self) -> int:
        """The stride phases of a :meth:`phased` convolution (the fastest part of the launch's
        first axis)."""
        return math.prod(self.spec.stride)

    def _phase_rows(self, s: Scope) -> int:
        """Emit a phase's output positions (``nb``, ``o{d}``, ``sp``, ``mmask``) and its taps per
        dimension (``r{d}`` the first, ``nt{d}`` how many, ``h{d}`` its input offset: the tap
        ``r + stride * t`` reads input ``j + h - t * dilation`` for the phase's ``j``-th
        position ``o = phase + stride * j``); returns the rows of one phase (every phase is
        given as many, those past the output masked)."""
        spec, e = self.spec, self.emit
        per = tuple(math.ceil(o / st) for o, st in zip(self.sout, spec.stride, strict=True))
        e(s, f"nb = rm // {math.prod(per)}")
        js = coords(self, s, f"rm % {math.prod(per)}", per, "j")
        hs = coords(self, s, "ph", spec.stride, "f")
        bounds: list[str] = [f"(rm < {self.out_shape[0] * math.prod(per)})"]
        for d in range(self.nd):
            st, p, dl = spec.stride[d], spec.padding[d], spec.dilation[d]
            inv = pow(dl, -1, st) if st > 1 else 0
            e(s, f"o{d} = {hs[d]} + {st} * {js[d]}" if st > 1 else f"o{d} = {js[d]}")
            if self.sout[d] % st:
                bounds.append(f"(o{d} < {self.sout[d]})")
            # the first tap k with (phase + padding - k * dilation) % stride == 0, then every stride-th
            e(s, f"r{d} = (({hs[d]} + {p}) % {st}) * {inv} % {st}" if st > 1 else f"r{d} = 0")
            e(s, f"nt{d} = ({self.ks[d]} - r{d} + {st - 1}) // {st}" if st > 1 else f"nt{d} = {self.ks[d]}")
            # exact division (the numerator is a multiple of the stride), kept non-negative
            e(s, f"h{d} = ({hs[d]} + {p} - r{d} * {dl} + {st * dl}) // {st} - {dl}" if st > 1 else f"h{d} = {p}")
        e(s, f"mmask = {' & '.join(bounds)}")
        terms = [f"o{d}" if d == self.nd - 1 else f"o{d} * {math.prod(self.sout[d + 1 :])}" for d in range(self.nd)]
        e(s, f"sp = {' + '.join(terms)}")
        return self.out_shape[0] * math.prod(per)

    def _copy_shape(self) -> tuple[int, ...]:
        """The shape of the input's copy: channels-last, or the input's own."""
        n = self.out_shape[0]
        return (n, *self.sin, self.cin) if self.channels_last() else (n, self.cin, *self.sin)

    def _input_copy(self) -> Launch:
        """The pass before the convolution that copies its input channels-last (``nhwc``) and/or
        rounds it to TF32 (``conv_preround``): one read and one write of the input, in the
        candidate's own time."""
        name = f"{self.kernel.name}_in"
        plane, c, n = math.prod(self.sin), self.cin, self.out_shape[0]
        if not self.channels_last():
            return self._rounding(name, f"_xc{self.kernel.index}", f"_b{self.xbase}", n * c * plane)
        rnd = tf32_rounding("v")
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        lines = ["@triton.jit", f"def {name}(xc, p{self.xbase}, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):"]
        bs, bc = 64, max(4, min(64, next_pow2(c)))
        nsb = math.ceil(plane / bs)
        body = [
            f"pid = {pid}",
            f"nb = pid // {nsb}",
            f"rs = (pid % {nsb}) * BLOCK_S + tl.arange(0, BLOCK_S)",
            f"smask = rs < {plane}",
            f"for c0 in range(0, {c}, BLOCK_C):",
            "    rc = c0 + tl.arange(0, BLOCK_C)",
            f"    m = smask[:, None] & (rc < {c})[None, :]" if c % bc else "    m = smask[:, None]",
            f"    v = tl.load(p{self.xbase} + nb * {c * plane} + rc[None, :] * {plane} + rs[:, None], "
            "mask=m, other=0.0)",
            *([f"    {rnd}"] if self.preround() else []),
            f"    tl.store(xc + nb * {c * plane} + rs[:, None] * {c} + rc[None, :], v, mask=m)",
        ]
        grid, consts = (n * nsb,), {"BLOCK_S": bs, "BLOCK_C": bc}
        return Launch(
            source="\n".join([*lines, *("    " + b for b in body)]),
            name=name,
            pointers=[self.xbase],
            grid=grid,
            constexprs=consts,
            num_warps=4,
            num_stages=1,
            lead_args=(f"_xc{self.kernel.index}",),
        )

    def _weight_count(self) -> int:
        """Elements of the weights (``[cout, cin_g, *k]`` or, transposed, ``[cin, cout_g, *k]``)."""
        return self.cout * self.cin_g * self.taps if not self.spec.transposed else self.cin * self.cout_g * self.taps

    def _rounding(self, name: str, dst: str, src: str, total: int, gather: str = "offs") -> Launch:
        """A kernel that writes ``src`` rounded to TF32 (to nearest) into ``dst``, ``total``
        elements, element ``offs`` of ``dst`` from element ``gather`` of ``src``: Triton, not
        PyTorch ops (a candidate's forward may only move data in PyTorch)."""
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        body = [
            f"offs = {pid} * BLOCK_S + tl.arange(0, BLOCK_S)",
            f"m = offs < {total}",
            f"v = tl.load(src + {gather}, mask=m, other=0.0)",
            tf32_rounding("v"),
            "tl.store(dst + offs, v, mask=m)",
        ]
        lines = ["@triton.jit", f"def {name}(dst, src, BLOCK_S: tl.constexpr):", *("    " + b for b in body)]
        return Launch(
            source="\n".join(lines),
            name=name,
            pointers=[],
            grid=(math.ceil(total / 1024),),
            constexprs={"BLOCK_S": 1024},
            num_warps=4,
            num_stages=1,
            lead_args=(dst, src),
        )

    def _packing(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """How the kernel's weight layout comes from the module's: the weights viewed as
        ``shape`` and permuted by ``order``. Taps outside, as ``[groups, taps, cin_g, cout_g]``
        (each tap's ``[BLOCK_K, BLOCK_N]`` tile rows of contiguous output channels) or,
        channels-last, ``[groups, taps, cout_g, cin_g]`` (input channels contiguous, as the
        input's); in the flat order as they are, or, channels-last, ``[cout, taps, cin_g]`` (the
        flat index's (tap, channel) order)."""
        g = self.spec.groups
        if not self.taps_outer() and self.channels_last():  # flat over (tap, channel)
            return (self.cout, self.cin_g, self.taps), (0, 2, 1)
        if not self.taps_outer():
            return (self._weight_count(),), (0,)
        if self.spec.transposed:  # [cin, cout_g, *k] = [g, cin_g, cout_g, taps]
            order = (0, 3, 2, 1) if self.channels_last() else (0, 3, 1, 2)
            return (g, self.cin_g, self.cout_g, self.taps), order
        order = (0, 3, 1, 2) if self.channels_last() else (0, 3, 2, 1)  # [cout, cin_g, *k] = [g, cout_g, cin_g, taps]
        return (g, self.cout_g, self.cin_g, self.taps), order

    def _packed_weight(self) -> str:
        """The forward-side expression of the weights in the kernel's layout (:meth:`_packing`):
        a copy per call, of the weights alone (the reference's weights are read where they are,
        never kept), or the weights themselves where the layouts agree."""
        shape, order = self._packing()
        w = f"_b{self.wbase}"
        if order == tuple(range(len(order))):
            return w
        if order == (0, 2, 1):
            return f"{w}.reshape{shape!r}.transpose(1, 2).contiguous()"
        return f"{w}.reshape{shape!r}.permute{order!r}.contiguous()"

    def _packed_rounding(self, dst: str) -> Launch:
        """One kernel that writes the weights into ``dst`` in the kernel's layout
        (:meth:`_packing`), rounded to TF32 (to nearest): each element of ``dst`` gathers its
        source element (a copy in PyTorch first cost the forward a second launch and a buffer)."""
        shape, order = self._packing()
        if order == (0, 3, 1, 2) and shape[3] > 1:
            return self._tap_major_rounding(dst, shape)
        packed = [shape[o] for o in order]
        strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        terms = []
        for i, o in enumerate(order):
            if packed[i] == 1:
                continue
            inner = math.prod(packed[i + 1 :])
            coord = "offs" if inner == 1 else f"(offs // {inner})"
            if i > 0:
                coord = f"({coord} % {packed[i]})"
            terms.append(coord if strides[o] == 1 else f"{coord} * {strides[o]}")
        gather = " + ".join(terms) or "0"
        return self._rounding(f"{self.kernel.name}_wr", dst, f"_b{self.wbase}", math.prod(shape), gather)

    def _tap_major_rounding(self, dst: str, shape: tuple[int, ...]) -> Launch:
        """:meth:`_packed_rounding` for the channels-last forward layout, ``[g, cout_g, cin_g,
        taps]`` into ``[g, taps, cout_g, cin_g]``, as a tiled transpose: a program reads one output
        channel's ``[BLOCK_C, TAPS]`` block of the weights, contiguous in memory, and writes it as
        ``taps`` runs of ``BLOCK_C`` input channels (Triton stages the turn through shared
        memory). The element-wise gather read the weights at a stride of ``taps`` elements: 21 us
        for a 512 x 512 x 3 x 3 layer of ResNet-18 on an H100, 4x what its bytes need."""
        _, cout_g, cin_g, taps = shape
        tp = next_pow2(taps)
        bc = max(16, min(next_pow2(cin_g), max(1, 4096 // tp)))
        chunks = math.ceil(cin_g / bc)
        rows = math.prod(shape) // (cin_g * taps)
        name = f"{self.kernel.name}_wr"
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        body = [
            f"pid = {pid}",
            f"row = pid // {chunks}",
            f"c = (pid % {chunks}) * BLOCK_C + tl.arange(0, BLOCK_C)",
            "t = tl.arange(0, TAPS)",
            f"m = (c < {cin_g})[:, None] & (t < {taps})[None, :]",
            f"v = tl.load(src + row * {cin_g * taps} + c[:, None] * {taps} + t[None, :], mask=m, other=0.0)",
            tf32_rounding("v"),
            f"gi = row // {cout_g}",
            f"co = row % {cout_g}",
            f"tl.store(dst + ((gi * {taps} + t[None, :]) * {cout_g} + co) * {cin_g} + c[:, None], v, mask=m)",
        ]
        lines = [
            "@triton.jit",
            f"def {name}(dst, src, BLOCK_C: tl.constexpr, TAPS: tl.constexpr):",
            *("    " + b for b in body),
        ]
        return Launch(
            source="\n".join(lines),
            name=name,
            pointers=[],
            grid=(rows * chunks,),
            constexprs={"BLOCK_C": bc, "TAPS": tp},
            num_warps=4,
            num_stages=1,
            lead_args=(dst, f"_b{self.wbase}"),
        )

    def _accumulate(self, loop: Scope) -> None:
        """``acc`` += the ``[BLOCK_M, BLOCK_K]`` tile ``a`` times the ``[BLOCK_K, BLOCK_N]`` tile ``b``.

        In ``tf32`` the operands are rounded to TF32 (to nearest) first: the tensor cores drop the
        low 13 mantissa bits, and truncated operands erred 2.7-3.4x as much as cuDNN's TF32 against
        float64 on an H200 (KernelBench L1-63, L2-4), past precision parity's bar of 3x; rounded,
        they err as cuDNN does."""
        if self.half:
            self.emit(loop, f"acc = {half_dot('a', 'b', 'acc')}")
            return
        if self.params.conv_precision == "tf32" and not self.preround():
            for t in ("a", "b"):
                self.emit(loop, tf32_rounding(t))
        self.emit(loop, f'acc = tl.dot(a, b, acc, input_precision="{self.params.conv_precision}")')

    def _flat(self, s: Scope, px: str, pw: str, plane: int, outs: list[str]) -> None:
        """The reduction as one flat index over (input channel, tap), or from a channels-last copy
        (forward only) over (tap, input channel), gathered per tile element.
        A forward convolution's input offset is a sum of a row's part (``xo``: its batch and
        output position, once per tile) and a column's (``koff``: channel and tap, once per
        step), so only one add and the padding masks are per tile element."""
        e = self.emit
        forward = not self.spec.transposed
        last = self.channels_last()  # forward only: (tap, channel), channels fastest
        step = self.cin if last else 1  # elements between neighbouring input positions
        if forward:
            spec, terms = self.spec, ["xrow"]
            for d in range(self.nd):
                st, p, stride = spec.stride[d], spec.padding[d], math.prod(self.sin[d + 1 :]) * step
                od = outs[d] if st == 1 else f"{outs[d]} * {st}"
                pos = f"({od} - {p})" if p else od
                terms.append(pos if stride == 1 else f"{pos} * {stride}")
            e(s, f"xo = {' + '.join(terms)}")
        e(s, f"for k0 in range(0, {self.k}, BLOCK_K):")
        loop = Scope(indent="        ", parent=s)
        rk = "(k0 + tl.arange(0, BLOCK_K)).to(tl.int64)" if self.wide else "k0 + tl.arange(0, BLOCK_K)"
        e(loop, f"rk = {rk}")
        e(loop, f"kmask = rk < {self.k}")
        if last:
            e(loop, f"kp = rk // {self.cin_g}")
            e(loop, f"ci = rk % {self.cin_g}")
        else:
            e(loop, f"ci = rk // {self.taps}")
            e(loop, f"kp = rk % {self.taps}")
        taps = coords(self, loop, "kp", self.ks, "q")
        # Rows fast (``conv_a_transposed``): the tile is gathered as [BLOCK_K, BLOCK_M], output
        # positions along its last axis, and transposed for the dot.
        rows_fast = self.params.conv_a_transposed
        row, col = ("[None, :]", "[:, None]") if rows_fast else ("[:, None]", "[None, :]")
        start = len(self.lines)
        offset, valid = self._positions(loop, [f"{o}{row}" for o in outs], [f"{q}{col}" for q in taps])
        if forward and not valid:  # the positions only checked the padding: there is none to check
            del self.lines[start:]
        e(loop, f"a_mask = mmask{row} & kmask{col}" + (f" & {valid}" if valid else ""))
        if forward:
            cols = ["ci" if last else f"ci * {plane}"]
            for d in range(self.nd):
                dl, stride = self.spec.dilation[d], math.prod(self.sin[d + 1 :]) * step
                cols.append(f"{taps[d]} * {dl * stride}" if dl * stride != 1 else taps[d])
            e(loop, f"koff = {' + '.join(cols)}")
            pointers = f"{px} + xo{row} + koff{col}"
        else:
            pointers = f"{px} + xrow{row} + ci{col} * {plane} + {offset}"
        load = f"tl.load({pointers}, mask=a_mask, other=0.0)"
        e(loop, f"a = tl.trans({load})" if rows_fast else f"a = {load}")
        if self.spec.transposed:
            w_index = f"((g * {self.cin_g} + ci[:, None]) * {self.cout_g} + rn[None, :]) * {self.taps} + kp[:, None]"
        else:
            w_index = f"co[None, :] * {self.k} + rk[:, None]"
        e(loop, f"b = tl.load({pw} + {w_index}, mask=kmask[:, None] & nmask[None, :], other=0.0)")
        self._accumulate(loop)

    def _taps_outer(self, s: Scope, px: str, pw: str, plane: int, outs: list[str], bk: int) -> None:
        """The reduction as taps outside and chunks of ``BLOCK_K`` input channels inside (one
        channel at a time where ``BLOCK_K`` is 1), one loop of ``taps x chunks`` steps: the tap's
        input positions and masks are per row."""
        e = self.emit
        chunks = math.ceil(self.cin_g / bk)
        phased = self.phased()
        if phased:  # only the phase's own taps: nt0 x nt1 x ..., a runtime count
            e(s, f"ntaps = {' * '.join(f'nt{d}' for d in range(self.nd))}")
        e(s, f"for kk in range(0, {'ntaps' if phased else self.taps} * {chunks}):")
        loop = Scope(indent="        ", parent=s)
        if chunks == 1:
            e(loop, "kt = kk")
        else:
            e(loop, f"kt = kk // {chunks}")
            e(loop, f"c0 = (kk % {chunks}) * BLOCK_K")
        if phased:
            offset, valid = self._phase_positions(loop)
        else:
            taps = coords(self, loop, "kt", self.ks, "q")
            offset, valid = self._positions(loop, outs, taps)
        e(loop, f"rmask = mmask & {valid}" if valid else "rmask = mmask")
        if self.channels_last():  # the tap's position times the channels, a chunk's channels contiguous
            e(loop, f"xo = xrow + ({offset}) * {self.cin}")
        else:
            e(loop, f"xo = xrow + {offset}")
        transposed = self.spec.transposed
        if bk == 1:  # outer products, one input channel at a time
            ci = "c0" if chunks > 1 else "0"
            chan = f" + c0 * {plane}" if chunks > 1 else ""
            widen = ".to(tl.float32)" if self.half else ""
            e(loop, f"a = tl.load({px} + xo{chan}, mask=rmask, other=0.0){widen}")
            one = self.one_channel  # one output channel: a scalar weight per tap and channel
            rn, co = ("0", "g") if one else ("rn", "co")
            if transposed:  # [g * cin_g + ci, rn, tap]
                w_index = f"((g * {self.cin_g} + {ci}) * {self.cout_g} + {rn}) * {self.taps} + kt"
            else:  # [co, ci, tap]
                w_index = f"{co} * {self.k} + {ci} * {self.taps} + kt"
            if one:
                e(loop, f"b = tl.load({pw} + {w_index}){widen}")
                e(loop, "acc += a * b")
            else:
                e(loop, f"b = tl.load({pw} + {w_index}, mask=nmask, other=0.0){widen}")
                e(loop, "acc += a[:, None] * b[None, :]")
            return
        ci = "c0 + tl.arange(0, BLOCK_K)" if chunks > 1 else "tl.arange(0, BLOCK_K)"
        e(loop, f"ci = {ci}")
        ragged = self.cin_g % bk != 0  # the last chunk runs past the group's channels
        if ragged:
            e(loop, f"kmask = ci < {self.cin_g}")
        last = self.channels_last()
        step = "" if last else f" * {plane}"
        rows_t, rows = ("rmask[None, :] & kmask[:, None]", "rmask[:, None] & kmask[None, :]") if ragged else (
            "rmask[None, :]", "rmask[:, None]")  # fmt: skip
        if self.params.conv_a_transposed:  # a [channels, rows] tile, transposed for the dot
            e(loop, f"a = tl.trans(tl.load({px} + xo[None, :] + ci[:, None]{step}, mask={rows_t}, other=0.0))")
        else:
            e(loop, f"a = tl.load({px} + xo[:, None] + ci[None, :]{step}, mask={rows}, other=0.0)")
        if last:  # [g, taps, cout_g, cin_g]
            w_index = f"((g * {self.taps} + kt) * {self.cout_g} + rn[None, :]) * {self.cin_g} + ci[:, None]"
        else:  # [g, taps, cin_g, cout_g]
            w_index = f"((g * {self.taps} + kt) * {self.cin_g} + ci[:, None]) * {self.cout_g} + rn[None, :]"
        wmask = "kmask[:, None] & nmask[None, :]" if ragged else "nmask[None, :]"
        e(loop, f"b = tl.load({pw} + {w_index}, mask={wmask}, other=0.0)")
        self._accumulate(loop)
