"""The recurrent family's kernel: one layer of an RNN, LSTM or GRU, both directions, all time steps.

A program owns ``BLOCK_B`` batch rows of one direction (grid: batch blocks x directions) and walks
the time steps in order (the backward direction from the last). At each step, for each chunk of
``BLOCK_N`` hidden units, it sums ``h_{t-1} @ W_hh^T`` per gate over chunks of ``BLOCK_K`` with
``tl.dot`` (IEEE float32 by default), adds ``b_hh``, reads the step's input projection and applies
the cell exactly as PyTorch does (LSTM: ``c = f * c + i * g``, ``h = o * tanh(c)``; GRU:
``n = tanh(x_n + r * (W_hn h + b_hn))``, ``h = (h - n) * z + n``; RNN: ``act(x + W_hh h + b_hh)``).

Between steps the hidden state makes a round trip through the program's own rows of the buffer:
each step's ``h`` is stored into the output sequence (it must be anyway) and the next step reads
``h_{t-1}`` back from there by chunks of ``BLOCK_K`` (a few KiB that stay in the SM's L1), since a
register tile cannot be sliced by chunk; an LSTM's running ``c`` lives in the ``c_n`` part.
A barrier at each step (and, for an LSTM, before each chunk's store of ``c``) orders those reads
and writes among the program's threads; no two programs share a row. ``h_n`` is written at the last
step. The first step reads ``h0`` / ``c0`` (or zeros) instead.

Parameters: the matrix-product kind's ``mm_block_m`` (batch rows, clamped to 16 ..
``next_pow2(B)``), ``mm_block_n`` and ``mm_block_k`` (hidden chunks, 16 .. ``next_pow2(H)``),
``mm_warps`` and ``mm_precision`` (``ieee`` or the fp32-accurate ``tf32x3``).

A private module (``recurrent.py`` imports it and registers the kind): the families loader imports
every public module of the package as a family with lowerings of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from actors.experts.template.emit import IndexSpace, Launch, Scope, Writer
from actors.experts.template.emit_row import next_pow2
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import ew_expr
from actors.experts.template.fuse import Kernel, Schedule, base_of
from actors.experts.template.ir import Node
from actors.experts.template.params import TemplateParams

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
"""Gate blocks of ``W_ih`` / ``W_hh`` per cell (PyTorch's order: LSTM i, f, g, o; GRU r, z, n)."""


@dataclass(frozen=True)
class RecSpec:
    """One ``REC`` node's geometry, kept in its ``attrs`` (``op`` names the cell).

    The node's ``args``, in order: the input projection of each direction ``(rows, G*H)`` (rows
    in the layout of ``x``), ``W_hh`` of each direction, ``b_hh`` of each direction (with
    ``bias``), the module's ``h0`` ``(L*D, B, H)`` (with ``h0``) and ``c0`` (with ``c0``)."""

    mode: str
    steps: int
    batch: int
    hidden: int
    directions: int
    batch_first: bool
    layer: int
    bias: bool
    h0: bool
    c0: bool

    def attrs(self) -> tuple[float, ...]:
        """The spec as a node's ``attrs`` (the mode is the node's ``op``)."""
        flags = (self.batch_first, self.bias, self.h0, self.c0)
        return (*map(float, (self.steps, self.batch, self.hidden, self.directions, self.layer)), *map(float, flags))

    @classmethod
    def of(cls, node: Node) -> RecSpec:
        """The inverse of :meth:`attrs` for a ``REC`` node."""
        t, b, h, d, layer, *flags = node.attrs
        first, bias, h0, c0 = (bool(f) for f in flags)
        return cls(node.op, int(t), int(b), int(h), int(d), first, int(layer), bias, h0, c0)

    @property
    def gates(self) -> int:
        """Gate blocks per cell."""
        return GATES[self.mode]

    @property
    def seq(self) -> int:
        """Elements of the output sequence (the start of the final states in the buffer)."""
        return self.steps * self.batch * self.directions * self.hidden

    @property
    def states(self) -> int:
        """Elements of one final state ``(D, B, H)``."""
        return self.directions * self.batch * self.hidden

    @property
    def numel(self) -> int:
        """Elements of the node's buffer: the sequence, ``h_n`` and (LSTM) ``c_n``."""
        return self.seq + self.states * (2 if self.mode == "lstm" else 1)

    def slots(self) -> dict[str, tuple[int, ...]]:
        """Argument positions by role: ``x``, ``w``, ``b`` (one per direction), ``h0``, ``c0``."""
        d, at = self.directions, 0
        found: dict[str, tuple[int, ...]] = {}
        counts = {"x": d, "w": d, "b": d if self.bias else 0, "h0": int(self.h0), "c0": int(self.c0)}
        for name, count in counts.items():
            found[name] = tuple(range(at, at + count))
            at += count
        return found


def _clamp(value: int, extent: int) -> int:
    """A block size of at least 16 (``tl.dot``'s least) and at most ``extent`` rounded up."""
    return max(16, min(value, next_pow2(extent)))


class RecurrentWriter(Writer):
    """Emits one recurrent layer's kernel."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        node = self.plan.nodes[kernel.mm]
        if kernel.nodes != [node.id]:
            raise UnsupportedGraph("elementwise work fused into a recurrent kernel is not covered")
        self.node = node
        self.spec = RecSpec.of(node)
        self.bases: list[int] = []
        """The stored tensor behind each argument of the node, in the node's order."""
        for arg in node.tensor_args():
            base, transposed = base_of(self.plan, arg, sched.is_exported)
            if transposed:
                raise UnsupportedGraph("a recurrent layer of a transposed operand is not covered")
            self.bases.append(base)
        sp = self.spec
        self.block_b = _clamp(params.mm_block_m, sp.batch)
        self.block_n = _clamp(params.mm_block_n, sp.hidden)
        self.block_k = _clamp(params.mm_block_k, sp.hidden)

    def space(self, row: bool) -> IndexSpace:
        return IndexSpace(lin="lin", mask="m")

    def broadcast_row(self, var: str) -> str:
        return var

    def _ptr(self, role: str, e: int = 0) -> str:
        """The kernel argument of the ``e``-th argument of ``role`` (see :meth:`RecSpec.slots`)."""
        return self.pointer(self.bases[self.spec.slots()[role][e]])

    def write(self) -> Launch:
        sp, p = self.spec, self.params
        s = Scope(indent="    ")
        start = len(self.lines)
        out = self.pointer(self.node.id)
        e = self.emit
        t_, b_, h_, d_, g_ = sp.steps, sp.batch, sp.hidden, sp.directions, sp.gates
        dh = d_ * h_
        e(s, f"pid = {self.pid(0)}")
        e(s, f"d = {self.pid(1)}" if d_ == 2 else "d = 0")
        e(s, "rb = pid * BLOCK_B + tl.arange(0, BLOCK_B)")
        e(s, f"bmask = rb < {b_}")
        roles = ["x", "w", *(["b"] if sp.bias else [])]
        if d_ == 2:  # each direction has its own projection and weights
            e(s, "if d == 0:")
            for role in roles:
                e(Scope(indent="        "), f"p_{role} = {self._ptr(role, 0)}")
            e(s, "else:")
            for role in roles:
                e(Scope(indent="        "), f"p_{role} = {self._ptr(role, 1)}")
        else:
            for role in roles:
                e(s, f"p_{role} = {self._ptr(role, 0)}")
        e(s, f"hn = {sp.seq} + (d * {b_} + rb) * {h_}")
        if sp.h0 or sp.c0:
            e(s, f"s0 = (({sp.layer * d_} + d) * {b_} + rb) * {h_}")
        e(s, f"for s in range({t_}):")
        step = Scope(indent="        ", parent=s)
        e(step, f"t = s + d * ({t_ - 1} - 2 * s)")
        e(step, "tp = t - 1 + 2 * d")
        row = "rb * {T} + {t}" if sp.batch_first else "{t} * {B} + rb"
        e(step, "row = " + row.format(T=t_, B=b_, t="t"))
        e(step, "rowp = " + row.format(T=t_, B=b_, t="tp"))
        e(step, "tl.debug_barrier()")  # the previous step's stores, seen by every thread
        e(step, f"for n0 in range(0, {h_}, BLOCK_N):")
        chunk = Scope(indent="            ", parent=step)
        e(chunk, "rn = n0 + tl.arange(0, BLOCK_N)")
        e(chunk, f"nmask = rn < {h_}")
        e(chunk, "m = bmask[:, None] & nmask[None, :]")
        for g in range(g_):
            e(chunk, f"a{g} = tl.zeros((BLOCK_B, BLOCK_N), tl.float32)")
        e(chunk, f"for k0 in range(0, {h_}, BLOCK_K):")
        inner = Scope(indent="                ", parent=chunk)
        e(inner, "rk = k0 + tl.arange(0, BLOCK_K)")
        e(inner, f"kmask = rk < {h_}")
        e(inner, "mk = bmask[:, None] & kmask[None, :]")
        e(inner, "wm = kmask[:, None] & nmask[None, :]")
        e(inner, "hp = " + self._prev(sp, "rk", "mk", dh))
        for g in range(g_):
            e(inner, f"w{g} = tl.load(p_w + ({g * h_} + rn[None, :]) * {h_} + rk[:, None], mask=wm, other=0.0)")
            e(inner, f'a{g} = tl.dot(hp, w{g}, a{g}, input_precision="{p.mm_precision}")')
        for g in range(g_):
            if sp.bias:
                e(chunk, f"a{g} = a{g} + tl.load(p_b + {g * h_} + rn, mask=nmask, other=0.0)[None, :]")
            e(chunk, f"x{g} = tl.load(p_x + row[:, None] * {g_ * h_} + {g * h_} + rn[None, :], mask=m, other=0.0)")
        self._cell(chunk, sp, dh)
        e(chunk, f"tl.store({out} + row[:, None] * {dh} + d * {h_} + rn[None, :], h, mask=m)")
        e(chunk, f"tl.store({out} + hn[:, None] + rn[None, :], h, mask=m & (s == {t_ - 1}))")
        body = self.lines[start:]
        consts = {"BLOCK_B": self.block_b, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k}
        return Launch(
            source="\n".join(["@triton.jit", self.signature(list(consts)), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(b_ / self.block_b), d_),
            constexprs=consts,
            num_warps=p.mm_warps,
            num_stages=1,
        )

    def _prev(self, sp: RecSpec, cols: str, mask: str, dh: int) -> str:
        """``h_{t-1}`` at columns ``cols``: the previous step's output, or at the first step the
        initial state (``h0``, else zeros)."""
        out = self.pointer(self.node.id)
        at = f"rowp[:, None] * {dh} + d * {sp.hidden} + {cols}[None, :]"
        expr = f"tl.load({out} + {at}, mask={mask} & (s > 0), other=0.0)"
        if sp.h0:
            expr += f" + tl.load({self._ptr('h0')} + s0[:, None] + {cols}[None, :], mask={mask} & (s == 0), other=0.0)"
        return expr

    def _cell(self, chunk: Scope, sp: RecSpec, dh: int) -> None:
        """The cell's equations on the chunk's gates (``a``: the hidden products, ``x``: the
        projections), PyTorch's order of operations; binds ``h``."""
        e, used = self.emit, self.used

        def f(op: str, var: str) -> str:
            return ew_expr(op, [var], (), used)

        if sp.mode == "lstm":
            for g, (name, op) in enumerate((("gi", "sigmoid"), ("gf", "sigmoid"), ("gg", "tanh"), ("go", "sigmoid"))):
                e(chunk, f"z{g} = a{g} + x{g}")
                e(chunk, f"{name} = {f(op, f'z{g}')}")
            out = self.pointer(self.node.id)
            cs = f"hn[:, None] + {sp.states} + rn[None, :]"
            cp = f"tl.load({out} + {cs}, mask=m & (s > 0), other=0.0)"
            if sp.c0:
                cp += f" + tl.load({self._ptr('c0')} + s0[:, None] + rn[None, :], mask=m & (s == 0), other=0.0)"
            e(chunk, f"cp = {cp}")
            e(chunk, "c = gf * cp + gi * gg")
            e(chunk, f"h = go * {f('tanh', 'c')}")
            e(chunk, "tl.debug_barrier()")  # every thread has read this chunk's c before it is replaced
            e(chunk, f"tl.store({out} + {cs}, c, mask=m)")
        elif sp.mode == "gru":
            e(chunk, "z0 = a0 + x0")
            e(chunk, f"r = {f('sigmoid', 'z0')}")
            e(chunk, "z1 = a1 + x1")
            e(chunk, f"u = {f('sigmoid', 'z1')}")
            e(chunk, "z2 = x2 + a2 * r")
            e(chunk, f"nn_ = {f('tanh', 'z2')}")
            e(chunk, "hc = " + self._prev(sp, "rn", "m", dh))
            e(chunk, "h = (hc - nn_) * u + nn_")
        else:
            e(chunk, "z0 = a0 + x0")
            e(chunk, f"h = {f('tanh' if sp.mode == 'rnn_tanh' else 'relu', 'z0')}")
