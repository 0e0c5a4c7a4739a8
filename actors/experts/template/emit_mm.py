"""The matrix-product template: tiles in a grouped launch order with a fused elementwise epilogue,
and the Hopper-class variants the ``mm_*`` parameters select (split-K, persistent, TMA loads).

- **split-K** (``mm_split_k`` > 1): program ``w`` computes tile ``w // S`` over K slice ``w % S``
  and writes its fp32 partial tile to a work buffer ``(S, M*N)``; a second kernel sums the S
  partials of each element as a tree (``tl.sum``, a fixed order: deterministic) and applies the
  epilogue. Clamped to a power of two that leaves every slice ``MIN_STEPS_PER_SLICE`` K steps and
  keeps the buffer under ``WORKSPACE_LIMIT`` elements.
- **persistent** (``mm_persistent``): ``min(#SMs, work items)`` programs, each looping over the
  work items (tiles, or tile x slice) in the grouped order; the SM count is read at run time.
- **TMA** (``mm_tma``): A and B tiles come through host-built ``TensorDescriptor``s when this
  Triton has them (checked here, where the source is written), both operands are row-major with
  16-byte aligned rows; ``forward`` still falls back to plain loads (a ``TMA`` constexpr) on a
  device below compute capability 9 or an unaligned base. Triton's interpreter runs both paths.

- **padding** (``mm_pad``): a single product of row-major operands whose rows are not 16-byte
  aligned (K or N not a multiple of 16 bytes) reads zero-padded copies of A (M x Kp) and B
  (Kp x Np) made in ``forward``, Kp and Np multiples of the tiles: vector loads, and no mask on
  the K loop or on B. (TMA is not combined with it.)

Batched products whose operands are not flattened into one matrix keep the plain template.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass

from actors.experts.template.any_sizes import at_task
from actors.experts.template.emit import WIDE, IndexSpace, Launch, Scope, Writer, half_dot
from actors.experts.template.fuse import Kernel, Schedule, base_of
from actors.experts.template.ir import HALF
from actors.experts.template.params import TemplateParams

WORKSPACE_LIMIT = 1 << 26
"""Most fp32 elements of a split-K work buffer (256 MB); a larger split is halved until it fits."""
MIN_STEPS_PER_SLICE = 4
"""Fewest ``BLOCK_K`` steps a K slice keeps; a larger split is halved until each slice has them."""
_REDUCE_TILE = 4096
"""Partials (split x elements) per program of the split-K sum."""


@functools.cache
def tma_available() -> bool:
    """Whether the installed Triton has tensor descriptors (in-kernel and host-built)."""
    try:
        import triton.language as tl

        found = importlib.util.find_spec("triton.tools.tensor_descriptor") is not None
    except ImportError:
        return False
    return found and hasattr(tl, "make_tensor_descriptor")


@dataclass(frozen=True)
class Operand:
    """A matrix operand addressed by strides over a contiguous base tensor."""

    base: int
    transposed: bool
    rows: int
    cols: int
    row_stride: int
    col_stride: int
    batch: int
    batch_stride: int


def _operand(sched: Schedule, nid: int) -> Operand:
    plan = sched.plan
    base, transposed = base_of(plan, nid, sched.is_exported)
    node = plan.nodes[nid]
    stored = plan.nodes[node.tensor_args()[0]].shape if transposed else node.shape
    r, c = stored[-2], stored[-1]
    batch = math.prod(stored[:-2])
    if transposed:
        return Operand(base, True, c, r, 1, c, batch, r * c)
    return Operand(base, False, r, c, c, 1, batch, r * c)


@dataclass(frozen=True)
class MmShape:
    """A product as the template launches it: ``batch`` products of (m x k) @ (k x n)."""

    m: int
    n: int
    k: int
    batch: int
    a: Operand
    b: Operand


def mm_shape(sched: Schedule, kernel: Kernel) -> MmShape:
    """The launched shape of a matrix-product kernel (a batched A times a shared B is one product)."""
    node = sched.plan.nodes[kernel.mm]
    a_id, b_id = node.tensor_args()
    a, b = _operand(sched, a_id), _operand(sched, b_id)
    m, k, n = a.rows, a.cols, b.cols
    batch = math.prod(node.shape[:-2])
    # A batched A times one shared B: one product of A's rows. Written without ordering the batch
    # (at a batch of one it is the same product), so that a batch that moves decides nothing.
    if b.batch == 1 and a.batch == batch and not a.transposed:
        m, batch = m * batch, 1
    return MmShape(m, n, k, batch, a, b)


def element_size(dtype: str) -> int:
    """Bytes per element of a floating dtype as the plan names it."""
    return {"float16": 2, "bfloat16": 2, "float64": 8}.get(dtype, 4)


def needs_padding(shape: MmShape, esize: int) -> bool:
    """Whether a product's operands are row-major with rows that are not 16-byte aligned (the case
    ``mm_pad`` is for: K or N not a multiple of 16 bytes)."""
    row_major = not (shape.a.transposed or shape.b.transposed) and shape.b.batch == 1
    return row_major and ((shape.k * esize) % 16 != 0 or (shape.n * esize) % 16 != 0)


def effective_split(requested: int, m: int, n: int, k: int, block_k: int) -> int:
    """The split-K factor actually used: ``requested`` halved until every slice keeps
    ``MIN_STEPS_PER_SLICE`` K steps and the work buffer fits ``WORKSPACE_LIMIT``. The halving
    only changes speed and the buffer's size (a slice past K adds zeros): where the sizes move (an
    any-size copy) it is decided at the task's own sizes (``any_sizes.at_task``)."""
    split, m, n, k = requested, at_task(m), at_task(n), at_task(k)
    while split > 1 and (math.ceil(k / block_k) < split * MIN_STEPS_PER_SLICE or split * m * n > WORKSPACE_LIMIT):
        split //= 2
    return split


class MatmulWriter(Writer):
    """Tiled matrix product with a grouped launch order and a fused elementwise epilogue."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        super().__init__(sched, kernel, params, used)
        shape = mm_shape(sched, kernel)
        self.a, self.b = shape.a, shape.b
        self.m, self.n, self.k, self.batch = shape.m, shape.n, shape.k, shape.batch
        self.out_shape = self.plan.nodes[kernel.mm].shape
        single = self.batch == 1
        self.split = effective_split(params.mm_split_k, self.m, self.n, self.k, params.mm_block_k) if single else 1
        self.persistent = params.mm_persistent and single
        self.half = self.plan.nodes[kernel.mm].dtype in HALF
        """Half operands: ``tl.dot`` takes them as they are (tensor cores, float32 sums), except
        under Triton's interpreter, whose bfloat16 products are wrong: there they are widened
        (``WIDE``; the products of two half values are exact in float32 either way)."""
        esize = element_size(self.plan.nodes[self.a.base].dtype)
        self.pad = params.mm_pad and single and needs_padding(shape, esize)
        """Operands read from zero-padded, aligned copies (see the module docstring)."""
        self.kp = math.ceil(self.k / params.mm_block_k) * params.mm_block_k
        self.np = math.ceil(self.n / params.mm_block_n) * params.mm_block_n
        self.tma = (
            params.mm_tma
            and not self.pad
            and single
            and not (self.a.transposed or self.b.transposed)
            and (self.k * esize) % 16 == 0
            and (self.n * esize) % 16 == 0
            and tma_available()
        )
        self.flat = False
        """True while the split-K sum (a flat index over M x N) is written."""

    def space(self, row: bool) -> IndexSpace:
        rank = len(self.out_shape)
        if self.flat:
            return IndexSpace(
                lin="offs", mask="mask", shape=self.out_shape, fast={(rank - 1, rank): "rn", (0, rank - 1): "rm"}
            )
        rows = "rg" if self.batch != 1 else "rm"
        return IndexSpace(
            lin="lin",
            mask="cmask",
            shape=self.out_shape,
            fast={(rank - 1, rank): "rn[None, :]", (0, rank - 1): f"{rows}[:, None]"},
            vectors={
                (rank - 1, rank): ("rn", f"(rn < {self.n})", "[None, :]"),
                (0, rank - 1): (rows, f"(rm < {self.m})", "[:, None]"),
            },
        )

    def broadcast_row(self, var: str) -> str:
        return var

    def _def(self, name: str, lead: list[str], consts: list[str]) -> str:
        args = lead + [f"p{b}" for b in self.pointers] + [f"{c}: tl.constexpr" for c in consts]
        return f"def {name}({', '.join(args)}):"

    def _program(self, s: Scope) -> Scope:
        """The work item, its tile in grouped order and its fp32 accumulator ``acc``; returns the
        scope in which ``acc`` holds the (partial) product."""
        p = self.params
        m, n, k, split = self.m, self.n, self.k, self.split
        e = self.emit
        npm, npn = math.ceil(m / p.mm_block_m), math.ceil(n / p.mm_block_n)
        work = npm * npn * split
        if self.persistent:
            e(s, f"for w in range({self.pid(0)}, {work}, tl.num_programs(0)):")
            s = Scope(indent=s.indent + "    ", parent=s)
        else:
            e(s, f"w = {self.pid(0)}")
        if self.batch != 1:
            e(s, f"bid = {self.pid(1)}")
        e(s, f"tile = w // {split}" if split > 1 else "tile = w")
        e(s, f"group = GROUP_M * {npn}")
        e(s, "first = (tile // group) * GROUP_M")
        e(s, f"gsize = tl.minimum({npm} - first, GROUP_M)")
        e(s, "pid_m = first + (tile % group) % gsize")
        e(s, "pid_n = (tile % group) // gsize")
        e(s, "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        e(s, "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        e(s, "rk = tl.arange(0, BLOCK_K)")
        if split > 1:
            chunk = math.ceil(math.ceil(k / split) / p.mm_block_k) * p.mm_block_k
            e(s, f"k_lo = (w % {split}) * {chunk}")
            e(s, f"k_hi = tl.minimum(k_lo + {chunk}, {self.kp if self.pad else k})")
            lo, hi = "k_lo", "k_hi"
        else:
            lo, hi = "0", str(self.kp if self.pad else k)
        e(s, "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        if self.half:
            dot = f"acc = {half_dot('a', 'b', 'acc')}"
        else:
            dot = f'acc = tl.dot(a, b, acc, input_precision="{p.mm_precision}")'
        inner = Scope(indent=s.indent + "    ", parent=s)
        if self.tma:
            e(s, "if TMA:")
            e(inner, f"for k0 in range({lo}, {hi}, BLOCK_K):")
            e(inner, "    a = da.load([pid_m * BLOCK_M, k0])")
            e(inner, "    b = db.load([k0, pid_n * BLOCK_N])")
            e(inner, f"    {dot}")
            e(s, "else:")
            self._pointer_loop(inner, "da", "db", lo, hi, dot)
        elif self.pad:
            self._padded_loop(s, lo, hi, dot)
        else:
            self._pointer_loop(s, self.pointer(self.a.base), self.pointer(self.b.base), lo, hi, dot)
        return s

    def _pointer_loop(self, s: Scope, pa: str, pb: str, lo: str, hi: str, dot: str) -> None:
        m, n, k = self.m, self.n, self.k
        e = self.emit
        sab = self.a.batch_stride if self.a.batch != 1 else 0
        sbb = self.b.batch_stride if self.b.batch != 1 else 0
        ka = f"({lo} + rk)" if lo != "0" else "rk"
        ta = f" + bid * {sab}" if self.batch != 1 else ""
        tb = f" + bid * {sbb}" if self.batch != 1 else ""
        e(s, f"a_ptrs = {pa}{ta} + rm[:, None] * {self.a.row_stride} + {ka}[None, :] * {self.a.col_stride}")
        e(s, f"b_ptrs = {pb}{tb} + {ka}[:, None] * {self.b.row_stride} + rn[None, :] * {self.b.col_stride}")
        e(s, f"for k0 in range({lo}, {hi}, BLOCK_K):")
        e(s, f"    a = tl.load(a_ptrs, mask=(rm[:, None] < {m}) & (rk[None, :] < {k} - k0), other=0.0)")
        e(s, f"    b = tl.load(b_ptrs, mask=(rk[:, None] < {k} - k0) & (rn[None, :] < {n}), other=0.0)")
        e(s, f"    {dot}")
        e(s, f"    a_ptrs += BLOCK_K * {self.a.col_stride}")
        e(s, f"    b_ptrs += BLOCK_K * {self.b.row_stride}")

    def _padded_loop(self, s: Scope, lo: str, hi: str, dot: str) -> None:
        """The K loop over the zero-padded copies ``pa`` (M x Kp) and ``pb`` (Kp x Np): A's rows
        past M are the only loads masked."""
        e = self.emit
        ka = f"({lo} + rk)" if lo != "0" else "rk"
        e(s, f"a_ptrs = pa + rm[:, None] * {self.kp} + {ka}[None, :]")
        e(s, f"b_ptrs = pb + {ka}[:, None] * {self.np} + rn[None, :]")
        e(s, f"amask = rm[:, None] < {self.m}")
        e(s, f"for k0 in range({lo}, {hi}, BLOCK_K):")
        e(s, "    a = tl.load(a_ptrs, mask=amask, other=0.0)")
        e(s, "    b = tl.load(b_ptrs)")
        e(s, f"    {dot}")
        e(s, "    a_ptrs += BLOCK_K")
        e(s, f"    b_ptrs += BLOCK_K * {self.np}")

    def _epilogue(self, s: Scope) -> None:
        m, n = self.m, self.n
        self.emit(s, f"cmask = (rm[:, None] < {m}) & (rn[None, :] < {n})")
        if self.batch != 1:
            self.emit(s, f"rg = bid * {m} + rm")
            self.emit(s, f"lin = rg[:, None] * {n} + rn[None, :]")
        else:
            self.emit(s, f"lin = rm[:, None] * {n} + rn[None, :]")
        self.store_exports(s, self.kernel.mm, "acc")

    def _launch_args(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
        """(setup lines, lead arguments, bases read by setup) of the product kernel."""
        idx = self.kernel.index
        p = self.params
        setup: list[str] = []
        lead: list[str] = []
        reads: list[int] = []
        a, b = f"_b{self.a.base}", f"_b{self.b.base}"
        if self.tma:
            reads += [self.a.base, self.b.base]
            setup += [
                f"_tma{idx} = (not {a}.is_cuda or torch.cuda.get_device_capability({a}.device)[0] >= 9) "
                f"and {a}.data_ptr() % 16 == 0 and {b}.data_ptr() % 16 == 0",
                f"if _tma{idx}:",
                f"    _da{idx} = TensorDescriptor({a}, [{self.m}, {self.k}], [{self.k}, 1], "
                f"[{p.mm_block_m}, {p.mm_block_k}])",
                f"    _db{idx} = TensorDescriptor({b}, [{self.k}, {self.n}], [{self.n}, 1], "
                f"[{p.mm_block_k}, {p.mm_block_n}])",
                "else:",
                f"    _da{idx}, _db{idx} = {a}, {b}",
            ]
            lead += [f"_da{idx}", f"_db{idx}"]
        if self.pad:
            reads += [self.a.base, self.b.base]
            setup += [
                f"_pa{idx} = torch.zeros(({self.m}, {self.kp}), device={a}.device, dtype={a}.dtype)",
                f"_pa{idx}[:, :{self.k}] = {a}.reshape({self.m}, {self.k})",
                f"_pb{idx} = torch.zeros(({self.kp}, {self.np}), device={b}.device, dtype={b}.dtype)",
                f"_pb{idx}[:{self.k}, :{self.n}] = {b}.reshape({self.k}, {self.n})",
            ]
            lead += [f"_pa{idx}", f"_pb{idx}"]
        if self.persistent:
            reads.append(self.a.base)
            setup.append(
                f"_sms{idx} = torch.cuda.get_device_properties({a}.device).multi_processor_count if {a}.is_cuda else 4"
            )
        return tuple(setup), tuple(lead), tuple(reads)

    def _grid(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        p = self.params
        work = math.ceil(self.m / p.mm_block_m) * math.ceil(self.n / p.mm_block_n) * self.split
        if self.persistent:
            return (work,), (f"min({work}, _sms{self.kernel.index})",)
        return (work, self.batch), ()

    def _consts(self) -> dict[str, int | str]:
        p = self.params
        consts = {"BLOCK_M": p.mm_block_m, "BLOCK_N": p.mm_block_n, "BLOCK_K": p.mm_block_k, "GROUP_M": p.mm_group_m}
        return {**consts, **(WIDE if self.half else {})}

    def write(self) -> Launch:
        if self.split > 1:
            return self._write_split()
        p = self.params
        start = len(self.lines)
        s = self._program(Scope(indent="    "))
        self._epilogue(s)
        body = self.lines[start:]
        setup, lead_vals, reads = self._launch_args()
        lead = ["da", "db"] if self.tma else ["pa", "pb"] if self.pad else []
        consts = [*self._consts(), *(["TMA"] if self.tma else [])]
        grid, grid_exprs = self._grid()
        return Launch(
            source="\n".join(["@triton.jit", self._def(self.kernel.name, lead, consts), *body]),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=grid,
            constexprs=self._consts(),
            num_warps=p.mm_warps,
            num_stages=p.mm_stages,
            grid_exprs=grid_exprs,
            lead_args=lead_vals,
            setup=setup,
            imports=_TMA_IMPORT if self.tma else (),
            reads=reads,
            tail_args=(f"TMA=_tma{self.kernel.index}",) if self.tma else (),
        )

    def _write_split(self) -> Launch:
        p = self.params
        idx, split, mn = self.kernel.index, self.split, self.m * self.n
        start = len(self.lines)
        s = self._program(Scope(indent="    "))
        self.emit(s, f"cmask = (rm[:, None] < {self.m}) & (rn[None, :] < {self.n})")
        self.emit(s, f"tl.store(ws + (w % {split}) * {mn} + rm[:, None] * {self.n} + rn[None, :], acc, mask=cmask)")
        part_body, part_ptrs = self.lines[start:], list(self.pointers)
        lead = ["ws", *(["da", "db"] if self.tma else ["pa", "pb"] if self.pad else [])]
        consts = [*self._consts(), *(["TMA"] if self.tma else [])]
        part_src = ["@triton.jit", self._def(f"{self.kernel.name}_part", lead, consts), *part_body]
        setup, lead_vals, reads = self._launch_args()
        grid, grid_exprs = self._grid()
        part = Launch(
            source="\n".join(part_src),
            name=f"{self.kernel.name}_part",
            pointers=part_ptrs,
            grid=grid,
            constexprs=self._consts(),
            num_warps=p.mm_warps,
            num_stages=p.mm_stages,
            grid_exprs=grid_exprs,
            lead_args=(f"_ws{idx}", *lead_vals),
            tail_args=(f"TMA=_tma{idx}",) if self.tma else (),
        )
        # The sum of the partials, in a fixed tree order, then the epilogue.
        self.pointers, self.flat = [], True
        start = len(self.lines)
        t = Scope(indent="    ")
        block = max(16, _REDUCE_TILE // split)
        self.emit(t, f"offs = {self.pid(0)} * BLOCK + tl.arange(0, BLOCK)")
        self.emit(t, f"mask = offs < {mn}")
        self.emit(t, f"rm = offs // {self.n}")
        self.emit(t, f"rn = offs % {self.n}")
        self.emit(t, f"parts = tl.load(ws + tl.arange(0, {split})[:, None] * {mn} + offs[None, :], "
                     "mask=mask[None, :], other=0.0)")  # fmt: skip
        self.emit(t, "acc = tl.sum(parts, axis=0)")
        t.memo[("v", self.kernel.mm)] = "acc"
        for nid in self.kernel.exports:
            self.store(t, nid, row=False)
        src = ["@triton.jit", self._def(self.kernel.name, ["ws"], ["BLOCK"]), *self.lines[start:]]
        work = f"_ws{idx} = torch.empty(({split}, {mn}), device=_b{self.a.base}.device, dtype=torch.float32)"
        return Launch(
            source="\n".join(src),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(mn / block),),
            constexprs={"BLOCK": block},
            num_warps=4,
            num_stages=1,
            lead_args=(f"_ws{idx}",),
            setup=(work, *setup),
            pre=(part,),
            imports=_TMA_IMPORT if self.tma else (),
            reads=(self.a.base, *reads),
        )


_TMA_IMPORT = ("from triton.tools.tensor_descriptor import TensorDescriptor",)
