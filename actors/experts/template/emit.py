"""Writing kernels: the shared value/load machinery, and the elementwise template.

A :class:`Writer` emits one ``@triton.jit`` function. Values are computed into variables once
per scope (a loop body is a scope); operands that live outside the kernel are loaded through an
:class:`IndexSpace` that knows how the kernel's tile maps onto linear element indices, so a
broadcast operand (bias, per-channel scale, residual) is read at ``(lin // inner) % count``,
with cheaper forms where the tile's own coordinates already say it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.exprs import ew_expr, lit
from actors.experts.template.fuse import Kernel, KernelKind, Schedule, base_of
from actors.experts.template.ir import GATHER_OPS, HALF, Node, NodeKind, broadcast_blocks
from actors.experts.template.params import TemplateParams

INT32_LIMIT = 2**31 - 1


@dataclass
class IndexSpace:
    """How a tile of the kernel maps to linear indices of a value of ``shape``."""

    lin: str
    mask: str
    shape: tuple[int, ...] | None = None
    fast: dict[tuple[int, int], str] = field(default_factory=dict)
    vectors: dict[tuple[int, int], tuple[str, str, str]] = field(default_factory=dict)
    """Blocks that are one axis of a 2-D tile: the axis's 1-D index, its 1-D mask and the
    broadcast (``[None, :]``). An operand read through one of them alone (a bias over output
    channels) is loaded once per tile column or row and broadcast: one pointer per column, not per
    element (a 128x128 product tile's per-element bias pointers spilled registers)."""

    def vector(self, target: tuple[int, ...], blocks: tuple[tuple[int, int, int], ...]) -> tuple[str, str, str] | None:
        """(index, mask, broadcast) of an operand read by one :attr:`vectors` block, else None."""
        if self.shape is None or tuple(target) != tuple(self.shape) or len(blocks) != 1:
            return None
        a, b, stride = blocks[0]
        found = self.vectors.get((a, b))
        if found is None:
            return None
        index, mask, spread = found
        return (index if stride == 1 else f"({index}) * {stride}", mask, spread)

    def index(self, target: tuple[int, ...], block: tuple[int, int]) -> str:
        """Index of a broadcast operand covering ``block`` of ``target``."""
        rank = len(target)
        if block == (0, rank):
            return self.lin
        if self.shape is not None and tuple(target) == tuple(self.shape) and block in self.fast:
            return self.fast[block]
        inner = math.prod(target[block[1] :])
        count = math.prod(target[block[0] : block[1]])
        expr = self.lin if inner == 1 else f"(({self.lin}) // {inner})"
        return expr if block[0] == 0 else f"(({expr}) % {count})"


@dataclass
class Scope:
    """Variables visible at one point of the kernel (a loop body is a child scope)."""

    indent: str
    parent: Scope | None = None
    memo: dict[object, str] = field(default_factory=dict)
    eviction: str | None = None
    """The L2 eviction hint for whole-size loads in this scope (``evict_last``: the row is read
    again by a later loop of the kernel; ``evict_first``: its last read), or None."""

    def get(self, key: object) -> str | None:
        """The variable bound to ``key`` here or in an enclosing scope."""
        scope: Scope | None = self
        while scope is not None:
            if key in scope.memo:
                return scope.memo[key]
            scope = scope.parent
        return None


class Writer:
    """Emits one kernel; subclasses lay out the tile and the loops."""

    def __init__(self, sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> None:
        self.sched = sched
        self.plan = sched.plan
        self.kernel = kernel
        self.params = params
        self.used = used
        self.lines: list[str] = []
        self.pointers: list[int] = []
        self.counter = 0
        self.wide = (
            sched.symbolic
            or any(self.plan.nodes[n].numel > INT32_LIMIT // 2 for n in kernel.nodes)
            or any(
                self.plan.nodes[a].numel > INT32_LIMIT // 2
                for n in kernel.nodes
                for a in self.plan.nodes[n].tensor_args()
            )
        )

    # -- bookkeeping ---------------------------------------------------------------------
    def emit(self, scope: Scope, line: str) -> None:
        """Append one line at the scope's indentation."""
        self.lines.append(scope.indent + line)

    def fresh(self, prefix: str) -> str:
        """A new variable name."""
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pointer(self, base: int) -> str:
        """The kernel argument holding the tensor ``base``."""
        if base not in self.pointers:
            self.pointers.append(base)
        return f"p{base}"

    def inside(self, nid: int) -> bool:
        """Whether the node is computed by this kernel."""
        return self.sched.kernel_of.get(nid) == self.kernel.index

    def row_level(self, nid: int) -> bool:
        """Row kernels: whether the node is a per-row value."""
        return self.kernel.kind is KernelKind.ROW and nid not in self.kernel.elem

    def write(self) -> Launch:
        """The kernel's source and launch (each template lays out its tile and loops)."""
        raise NotImplementedError

    # -- layout hooks (overridden by the templates) ----------------------------------------
    def space(self, row: bool) -> IndexSpace:
        """The index space of the current tile (element or row level)."""
        raise NotImplementedError

    def broadcast_row(self, var: str) -> str:
        """A per-row variable broadcast over the element tile."""
        raise NotImplementedError

    # -- values --------------------------------------------------------------------------
    def load(self, scope: Scope, arg: int, target: tuple[int, ...], row: bool) -> str:
        """Load an operand computed outside this kernel, broadcast to ``target``."""
        base, transposed = base_of(self.plan, arg, self.sched.is_exported)
        blocks = broadcast_blocks(self.plan.nodes[arg].shape, target)
        if blocks is None:
            raise UnsupportedGraph(f"operand of shape {self.plan.nodes[arg].shape} does not broadcast to {target}")
        ptr = self.pointer(base)
        if transposed:
            blocks = self._transposed_blocks(self.plan.nodes[arg].shape, target)
        if not blocks:
            key: tuple[object, ...] = ("scalar", base)
            widen = self.plan.nodes[base].dtype in ("bool", *HALF)
            code = f"tl.load({ptr})" + (".to(tl.float32)" if widen else "")
        else:
            sp = self.space(row)
            mask, spread = sp.mask, ""
            vector = sp.vector(target, blocks)
            if vector is not None:
                index, mask, spread = vector
            else:
                index = " + ".join(
                    sp.index(target, (a, b)) if stride == 1 else f"({sp.index(target, (a, b))}) * {stride}"
                    for a, b, stride in blocks
                )
            key = ("load", base, index, spread)
            hint = ""
            whole = self.kernel.numel in (self.plan.nodes[base].numel, self.plan.nodes[arg].numel)
            if scope.eviction is not None and whole:  # a reshape's base may spell its size otherwise
                hint = f", eviction_policy={scope.eviction!r}"  # small broadcast operands stay as they are
            code = f"tl.load({ptr} + {index}, mask={mask}, other=0.0{hint})"
            if self.plan.nodes[base].dtype == "bool":
                code = f"tl.load({ptr} + {index}, mask={mask}, other=0{hint}).to(tl.float32)"
            elif self.plan.nodes[base].dtype in HALF:  # computed in float32
                code += ".to(tl.float32)"
            code += spread
        found = scope.get(key)
        if found is not None:
            return found
        var = self.fresh("l")
        self.emit(scope, f"{var} = {code}")
        scope.memo[key] = var
        return var

    @staticmethod
    def _transposed_blocks(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """The runs (as :func:`broadcast_blocks` gives them) of an operand of ``shape`` whose
        last two dims are swapped in memory (``x.transpose(-1, -2)`` of a stored ``x``): one run
        per dim of full size, each with the stride of that dim in the stored layout (so the
        loads are strided along the tile; a transposed operand is rare outside products)."""
        rank, lead = len(shape), len(target) - len(shape)
        stored = (*shape[:-2], shape[-1], shape[-2])
        strides = [math.prod(stored[d + 1 :]) for d in range(rank)]
        strides[-2], strides[-1] = strides[-1], strides[-2]  # logical dim -2 is stored dim -1
        return tuple((lead + d, lead + d + 1, strides[d]) for d in range(rank) if shape[d] != 1)

    def value(self, scope: Scope, nid: int) -> str:
        """The variable holding node ``nid`` at the tile's level, computing it if needed."""
        found = scope.get(("v", nid))
        if found is not None:
            return found
        node = self.plan.nodes[nid]
        if node.kind is NodeKind.VIEW:
            var = self.value(scope, node.tensor_args()[0])
        elif node.kind is NodeKind.EW:
            var = self._ew(scope, node)
        else:
            raise AssertionError(f"node {nid} ({node.kind}) has no value in this scope")
        scope.memo[("v", nid)] = var
        return var

    def operand(self, scope: Scope, nid: int, target: tuple[int, ...], row: bool) -> str:
        """Node ``nid`` as read by a consumer of shape ``target``: its variable, or a load."""
        if self.inside(nid):
            return self.value(scope, nid)
        return self.load(scope, nid, target, row)

    def _ew(self, scope: Scope, node: Node) -> str:
        row = self.row_level(node.id)
        if node.op in GATHER_OPS:
            return GATHER_EMITTERS[node.op](self, scope, node, row)
        args: list[str] = []
        for arg in node.args:
            if isinstance(arg, float):
                # an int64 node's constants are ints (positions: ``arange(T) + 2`` may address a table)
                args.append(str(int(arg)) if node.dtype == "int64" else lit(arg))
            elif self.inside(arg):
                var = self.value(scope, arg)
                args.append(self.broadcast_row(var) if (not row and self.row_level(arg)) else var)
            else:
                args.append(self.load(scope, arg, node.shape, row))
        var = f"v{node.id}"
        if node.op in ("triu", "tril"):
            self.emit(scope, f"{var} = {self._triangle(node, args[0], row)}")
            return var
        self.emit(scope, f"{var} = {ew_expr(node.op, args, node.attrs, self.used)}")
        return var

    def _triangle(self, node: Node, x: str, row: bool) -> str:
        """``x`` where the element's column minus its row is at least (``triu``) or at most
        (``tril``) the diagonal, else 0.0 (the row and column from the tile's linear index)."""
        sp = self.space(row)
        rank = len(node.shape)
        col = sp.index(node.shape, (rank - 1, rank))
        line = sp.index(node.shape, (rank - 2, rank - 1))
        cmp = ">=" if node.op == "triu" else "<="
        return f"tl.where((({col}) - ({line})) {cmp} {int(node.attrs[0])}, {x}, 0.0)"

    def gather_source(self, node: Node, what: str, i: int = 0) -> int:
        """The stored tensor a gather op (``GATHER_OPS``) reads as its argument ``i``: its base
        (not transposed, not computed in this kernel)."""
        src = node.tensor_args()[i]
        base, transposed = base_of(self.plan, src, self.sched.is_exported)
        if transposed or self.inside(src):
            raise UnsupportedGraph(f"{what} into a tensor computed in the same kernel are not covered")
        return base

    def store_exports(self, scope: Scope, nid: int, var: str) -> None:
        """The tile's value of node ``nid`` is ``var``: store every node the kernel exports (the
        node itself and its fused epilogue's results) at the tile's linear index."""
        scope.memo[("v", nid)] = var
        for out in self.kernel.exports:
            self.store(scope, out, row=False)

    def store(self, scope: Scope, nid: int, row: bool) -> None:
        """Store an exported node at the tile's linear index."""
        sp = self.space(row)
        var = self.value(scope, nid)
        if self.plan.nodes[nid].dtype == "int64":
            var = f"{var}.to(tl.int64)"
        elif self.plan.nodes[nid].dtype == "bool":  # a comparison's 0.0 / 1.0
            var = f"({var} != 0.0)"
        elif self.plan.nodes[nid].dtype in HALF:  # rounded once, where it is stored
            var = f"{var}.to(tl.{self.plan.nodes[nid].dtype})"
        self.emit(scope, f"tl.store({self.pointer(nid)} + {sp.lin}, {var}, mask={sp.mask})")

    def signature(self, constexprs: list[str]) -> str:
        """The ``def`` line (pointers first, then the compile-time block sizes)."""
        ptrs = [f"p{b}" for b in self.pointers]
        consts = [f"{c}: tl.constexpr" for c in constexprs]
        return f"def {self.kernel.name}({', '.join(ptrs + consts)}):"

    def pid(self, axis: int = 0) -> str:
        """``tl.program_id`` (widened to int64 for tensors beyond 2**30 elements)."""
        return f"tl.program_id({axis}).to(tl.int64)" if self.wide else f"tl.program_id({axis})"


GatherEmitter = Callable[[Writer, Scope, Node, bool], str]
"""Emits one gather op (``GATHER_OPS``) of a tile: ``(writer, scope, node, row level)`` -> its variable."""
GATHER_EMITTERS: dict[str, GatherEmitter] = {}


def axis_coord(at: str, inner: int, extent: int, outermost: bool) -> str:
    """The coordinate along one axis of the element at linear index ``at`` (a gather emitter's
    walk over its axes): ``inner`` elements per step of the axis, ``extent`` steps. The outermost
    axis needs no modulo: the index stays below the element count."""
    coord = f"({at})" if inner == 1 else f"(({at}) // {inner})"
    return coord if outermost else f"({coord} % {extent})"


def gather_emitter(op: str, sources: int = 1) -> Callable[[GatherEmitter], GatherEmitter]:
    """Register the decorated function as the emitter of the gather op ``op`` (an op family's),
    which reads its first ``sources`` arguments at computed addresses (0: all of them)."""

    def register(fn: GatherEmitter) -> GatherEmitter:
        GATHER_OPS[op] = sources
        GATHER_EMITTERS[op] = fn
        return fn

    return register


@gather_emitter("take_last")
def _take_last(w: Writer, scope: Scope, node: Node, row: bool) -> str:
    """``x[..., t]`` read from the stored ``x`` at this tile's elements of ``t``'s shape."""
    base = w.gather_source(node, "class indices")
    src, index = node.tensor_args()
    classes = w.plan.nodes[src].shape[-1]
    t = w.operand(scope, index, node.shape, row)
    sp = w.space(row)
    at = sp.index(node.shape, (0, len(node.shape)))
    var = f"v{node.id}"
    ok = f"({sp.mask}) & ({t} >= 0) & ({t} < {classes})"
    w.emit(scope, f"{var} = tl.load({w.pointer(base)} + ({at}) * {classes} + {t}, mask={ok}, other=0.0).to(tl.float32)")
    return var


INTERPRETED = "_KF_INTERPRETED"
"""A constexpr value of the rendered source: 1 where Triton's interpreter runs its kernels
(``TRITON_INTERPRET=1``), else 0 (``render`` defines it once, after the kernels)."""

WIDE: dict[str, int | str] = {"WIDE": INTERPRETED}
"""The constexpr of a kernel that takes half operands into :func:`half_dot`."""


def half_dot(a: str, b: str, acc: str) -> str:
    """``tl.dot`` of half operands as they are (tensor cores, float32 sums), widened to float32 only
    where the interpreter runs the kernel (``WIDE``): its bfloat16 products are wrong (off by 2.7e10
    in a 16x16 product, Triton 3.9), and a product of two half values is exact in float32 either way."""
    return f"tl.dot({a}.to(tl.float32) if WIDE else {a}, {b}.to(tl.float32) if WIDE else {b}, {acc})"


@dataclass
class Launch:
    """A kernel's source and how ``forward`` launches it."""

    source: str
    name: str
    pointers: list[int]
    grid: tuple[int, ...]
    constexprs: Mapping[str, int | str]
    """The kernel's compile-time arguments: a number, or the name of a module-level constant of the
    rendered source (:data:`INTERPRETED`)."""
    num_warps: int
    num_stages: int
    grid_exprs: tuple[str, ...] = ()
    """When set, the grid as forward-side expressions (a persistent kernel's ``min(SMs, tiles)``)."""
    lead_args: tuple[str, ...] = ()
    """Forward-side names passed before the tensor pointers (work buffers, tensor descriptors)."""
    setup: tuple[str, ...] = ()
    """Forward lines run before this launch (work buffers, tensor descriptors, device checks)."""
    pre: tuple[Launch, ...] = ()
    """Launches that run before this one and after ``setup`` (a split-K product's partial tiles)."""
    imports: tuple[str, ...] = ()
    """Module-level import lines the kernel's forward needs."""
    reads: tuple[int, ...] = ()
    """Tensors (bases) that ``setup`` reads beside the pointers."""
    tail_args: tuple[str, ...] = ()
    """Forward-side keyword arguments passed after the block sizes (``TMA=...``)."""
    work: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    """Scratch buffers ``(name, shape, dtype)`` the forward allocates before this launch's stages
    and that only they pass (a channels-last copy, packed weights): ``render`` places them with the
    intermediates (``arena.py``) or allocates each with ``torch.empty``."""


class PointwiseWriter(Writer):
    """Elementwise template: one flat block of ``32 * warps * ept`` elements per program."""

    def space(self, row: bool) -> IndexSpace:
        return IndexSpace(lin="offs", mask="mask")

    def broadcast_row(self, var: str) -> str:
        return var

    def write(self) -> Launch:
        top = Scope(indent="    ")
        body_start = len(self.lines)
        self.emit(top, f"offs = {self.pid()} * BLOCK + tl.arange(0, BLOCK)")
        self.emit(top, f"mask = offs < {self.kernel.numel}")
        for nid in self.kernel.exports:
            self.store(top, nid, row=False)
        body = self.lines[body_start:]
        src = ["@triton.jit", self.signature(["BLOCK"]), *body]
        block = self.params.pw_block
        return Launch(
            source="\n".join(src),
            name=self.kernel.name,
            pointers=self.pointers,
            grid=(math.ceil(self.kernel.numel / block),),
            constexprs={"BLOCK": block},
            num_warps=self.params.pw_warps,
            num_stages=1,
        )
