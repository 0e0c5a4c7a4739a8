"""Scheduling a plan into kernels: which nodes each Triton kernel computes.

Eight kernel kinds: ``pw`` (elementwise over a flat index), ``row`` (reductions over a
``(outer, R, inner)`` view, with elementwise work at element level before/after and at row
level after), ``mm`` (a tiled matrix product with an elementwise epilogue), ``conv`` (a
convolution as an implicit matrix product), ``pool`` (window max/avg), ``scan`` (cumulative
sum/product), ``attn`` (flash-style attention) and ``rec`` (a recurrent layer's time steps), each
also with an elementwise epilogue. Nodes are taken in order; a node joins the newest kernel its
operands come from when that kernel can compute it (same element count, a row value broadcast the
way ``keepdim`` does), otherwise the operands are materialised (``exports``) and a new kernel
starts. Any value read by a later kernel is stored.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from actors.experts.template.any_batch import sized
from actors.experts.template.any_sizes import at_task
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import GATHER_OPS, Node, NodeKind, Plan, broadcast_blocks, gathered
from actors.experts.template.params import TemplateParams


class KernelKind(StrEnum):
    """The kernel templates."""

    PW = "pw"
    ROW = "row"
    MM = "mm"
    CONV = "conv"
    POOL = "pool"
    SCAN = "scan"
    ATTN = "attn"
    REC = "rec"
    TORCH = "torch"
    """Not a kernel: a reference op left to PyTorch between kernels (its value always stored)."""


ONE_NODE_KINDS = (NodeKind.MM, NodeKind.CONV, NodeKind.POOL, NodeKind.SCAN, NodeKind.ATTN, NodeKind.REC)
"""Nodes that are a kernel of their own, of the ``KernelKind`` of the same name (elementwise work
after them joins them as an epilogue): a kernel kind that a family adds for its node goes here."""
_ONE_NODE_KERNELS = frozenset(KernelKind(kind.value) for kind in ONE_NODE_KINDS)


@dataclass
class Kernel:
    """One kernel of a schedule."""

    kind: KernelKind
    index: int
    numel: int
    """Elements of the kernel's domain (pw, row) or of the product's output (mm)."""
    nodes: list[int] = field(default_factory=list)
    exports: list[int] = field(default_factory=list)
    domain: tuple[int, ...] = ()
    """Row kernels: shape of the value reduced."""
    dims: tuple[int, int] = (0, 0)
    """Row kernels: reduced dims of ``domain``."""
    elem: set[int] = field(default_factory=set)
    """Row kernels: nodes at element level (the rest are at row level)."""
    mm: int = -1
    """Mm, conv, pool and scan kernels: the node that defines the kernel."""

    @property
    def outer(self) -> int:
        """Row kernels: product of the dims before the reduced ones."""
        return math.prod(self.domain[: self.dims[0]])

    @property
    def reduced(self) -> int:
        """Row kernels: product of the reduced dims (R)."""
        return math.prod(self.domain[self.dims[0] : self.dims[1]])

    @property
    def inner(self) -> int:
        """Row kernels: product of the dims after the reduced ones."""
        return math.prod(self.domain[self.dims[1] :])

    @property
    def name(self) -> str:
        """The Triton function name of the kernel."""
        return f"_kf_{self.kind.value}{self.index}"


@dataclass
class Schedule:
    """Kernels in launch order and where every computed node lives."""

    plan: Plan
    kernels: list[Kernel]
    kernel_of: dict[int, int]

    @cached_property
    def symbolic(self) -> bool:
        """Whether the plan's shapes hold symbolic sizes (``any_batch.sized``), worked out once: every
        kernel's writer asks (an O(nodes) scan per kernel was a fifth of L3-15's analysis)."""
        return sized(self.plan)

    def is_exported(self, node_id: int) -> bool:
        """Whether a node is stored to a buffer by its kernel."""
        k = self.kernel_of.get(node_id)
        return k is not None and node_id in self.kernels[k].exports


def keepdim_compatible(row_shape: tuple[int, ...], domain: tuple[int, ...], dims: tuple[int, int]) -> bool:
    """Whether a row value of ``row_shape`` broadcasts against ``domain`` as a keepdim result."""
    rank = len(domain)
    if len(row_shape) > rank:
        return False
    padded = (1,) * (rank - len(row_shape)) + row_shape
    for d in range(rank):
        want = 1 if dims[0] <= d < dims[1] else domain[d]
        if padded[d] != want:
            return False
    return True


class _Builder:
    def __init__(self, plan: Plan, params: TemplateParams) -> None:
        self.plan = plan
        self.params = params
        self.kernels: list[Kernel] = []
        self.kernel_of: dict[int, int] = {}
        self.reduced_only: frozenset[int] = frozenset()

    def node(self, nid: int) -> Node:
        return self.plan.nodes[nid]

    def new(self, kind: KernelKind, numel: int) -> Kernel:
        kernel = Kernel(kind=kind, index=len(self.kernels), numel=numel)
        self.kernels.append(kernel)
        return kernel

    def join(self, kernel: Kernel, nid: int, elem: bool = True) -> None:
        kernel.nodes.append(nid)
        self.kernel_of[nid] = kernel.index
        if elem:
            kernel.elem.add(nid)

    def export(self, nid: int) -> None:
        k = self.kernel_of.get(nid)
        if k is not None and nid not in self.kernels[k].exports:
            self.kernels[k].exports.append(nid)

    def export_read(self, nid: int) -> None:
        """Store a value that later elementwise ops or reductions read by linear index. A reshape
        computed in its source's kernel holds the source's elements in the source's order, so
        the kernel stores the source and readers address the reshape through it (``base_of``).
        Storing both wrote the same values twice: KernelBench L2-92's convolution stored its
        output once for the group norm's (N, G, -1) view and once for the residual add, and the
        norm's second pass read both copies."""
        node = self.node(nid)
        while node.kind is NodeKind.VIEW and nid in self.kernel_of:
            src = node.tensor_args()[0]
            if self.kernel_of.get(src) != self.kernel_of[nid]:
                break
            nid, node = src, self.node(src)
        self.export(nid)

    def build(self) -> Schedule:
        live = self.plan.live()
        self.reduced_only = reduced_only_convs(self.plan, live)
        for node in self.plan.nodes:
            if node.id not in live or node.kind in (NodeKind.INPUT, NodeKind.PARAM):
                continue
            if node.kind is NodeKind.VIEW:
                self._view(node)
            elif node.kind is NodeKind.PERM:
                self.export(node.args[0])  # type: ignore[arg-type]
            elif node.kind in ONE_NODE_KINDS:
                for arg in node.tensor_args():
                    self.export(arg)
                kind = KernelKind(node.kind.value)
                kernel = self.new(kind, node.numel)
                kernel.mm = node.id
                self.join(kernel, node.id)
            elif node.kind is NodeKind.TORCH:
                for arg in node.tensor_args():
                    self.export(arg)
                kernel = self.new(KernelKind.TORCH, node.numel)
                kernel.mm = node.id
                self.join(kernel, node.id)
                self.export(node.id)
            elif node.kind is NodeKind.RED:
                self._red(node)
            else:
                self._ew(node)
        for nid in self.plan.outputs:
            self.export(nid)
        return Schedule(plan=self.plan, kernels=self.kernels, kernel_of=self.kernel_of)

    def _view(self, node: Node) -> None:
        src = node.tensor_args()[0]
        k = self.kernel_of.get(src)
        if k is None or self.kernels[k].kind is KernelKind.TORCH:
            return  # a view of a materialised tensor: addressed through its base
        kernel = self.kernels[k]
        if kernel.kind in _ONE_NODE_KERNELS and src not in kernel.elem:
            self.export(src)  # a view of a reduction the kernel sums into: addressed through its base
            return
        self.join(kernel, node.id, elem=src in kernel.elem or kernel.kind is not KernelKind.ROW)

    def _red(self, node: Node) -> None:
        src = node.tensor_args()[0]
        shape = self.node(src).shape
        k = self.kernel_of.get(src)
        if k is not None:
            kernel = self.kernels[k]
            if (
                kernel.kind is KernelKind.ROW
                and kernel.domain == shape
                and kernel.dims == node.dims
                and src in kernel.elem
            ):
                self.join(kernel, node.id, elem=False)
                return
            if kernel.kind is KernelKind.PW and self.params.fuse_prologue and self.node(src).numel == kernel.numel:
                kernel.kind = KernelKind.ROW
                kernel.domain, kernel.dims = shape, node.dims
                kernel.elem = set(kernel.nodes)
                self.join(kernel, node.id, elem=False)
                return
            if self._sums_in_conv(kernel, node, src):
                self.join(kernel, node.id, elem=False)
                return
            self.export_read(src)
        # a reduction of a stored tensor (or an input) over the rows the last row kernel reduces
        # joins it: a batch norm's merged means and squared deviations, read from the kernel of
        # the per-image moments, were two kernels of a handful of elements each (a third of a
        # whole model's launches and compiles, DenseNet-121's 120 norms)
        if self.kernels and self._after(self.kernels[-1], [src]):
            last = self.kernels[-1]
            if last.kind is KernelKind.ROW and last.domain == shape and last.dims == node.dims:
                self.join(last, node.id, elem=False)
                return
        kernel = self.new(KernelKind.ROW, math.prod(shape))
        kernel.domain, kernel.dims = shape, node.dims
        self.join(kernel, node.id, elem=False)

    def _sums_in_conv(self, kernel: Kernel, node: Node, src: int) -> bool:
        """Whether a spatial sum of a convolution kernel's value joins that kernel (under
        ``fuse_prologue``): each tile adds its partial sums per (image, channel) into the zeroed
        result (``ConvWriter``), so the convolution's output is never stored. Only where nothing
        but such sums reads that output (:func:`reduced_only_convs`)."""
        return (
            self.params.fuse_prologue
            and kernel.kind is KernelKind.CONV
            and kernel.mm in self.reduced_only
            and src in kernel.elem
            and spatial_sum(self.plan, node, self.node(kernel.mm).shape)
        )

    def _ew(self, node: Node) -> None:
        if node.op in GATHER_OPS:
            self._gather(node)
            return
        inside = [a for a in node.tensor_args() if a in self.kernel_of]
        outside = [a for a in node.tensor_args() if a not in self.kernel_of]
        if inside:
            k = max(self.kernel_of[a] for a in inside)
            kernel = self.kernels[k]
            mine = [a for a in inside if self.kernel_of[a] == k]
            # A view or transpose of a value a later kernel stores is read only after it; a
            # transpose of one this kernel stores, too (other programs write what it reads).
            later = any(
                self._producer(a) > k or (self._producer(a) == k and self.node(a).kind is NodeKind.PERM)
                for a in outside
            )
            level = None if later else self._fits(kernel, node, mine)
            if level is not None:
                for a in inside:
                    if self.kernel_of[a] != k:
                        self.export_read(a)
                self.join(kernel, node.id, elem=level)
                return
            for a in inside:
                self.export_read(a)
        elif self.kernels and self._after(self.kernels[-1], list(node.tensor_args())):
            # Only outside operands: compute it in the newest kernel if that kernel can.
            last = self.kernels[-1]
            level = self._fits(last, node, [])
            if level is not None:
                self.join(last, node.id, elem=level)
                return
        kernel = self.new(KernelKind.PW, node.numel)
        self.join(kernel, node.id)

    def _gather(self, node: Node) -> None:
        """A read at computed addresses (``GATHER_OPS``): its source is stored first, then read
        where the index says; one that reads every argument so (``cat``, slices, copies) joins the
        newest elementwise kernel of its size where that runs after them all, else starts one."""
        if GATHER_OPS[node.op] == 0:
            args = list(node.tensor_args())
            for arg in args:
                self.export(arg)
            last = self.kernels[-1] if self.kernels else None
            if last is not None and last.kind is KernelKind.PW and last.numel == node.numel and self._after(last, args):
                # Its sources are stored before the newest elementwise kernel runs: read there (an
                # LSTM cell's four gate slices of one sum, a patch merge's four strided slices).
                self.join(last, node.id)
                return
            kernel = self.new(KernelKind.PW, node.numel)
            self.join(kernel, node.id)
            return
        src, index = node.tensor_args()
        self.export(src)
        after = self._producer(src)
        k = self.kernel_of.get(index)
        if k is not None and k > after:
            level = self._fits(self.kernels[k], node, [index])
            if level is not None:
                self.join(self.kernels[k], node.id, elem=level)
                return
            self.export(index)
        elif k is None and self.kernels and self._after(self.kernels[-1], [src, index]):
            level = self._fits(self.kernels[-1], node, [])
            if level is not None:
                self.join(self.kernels[-1], node.id, elem=level)
                return
        elif k is not None:
            self.export(index)
        kernel = self.new(KernelKind.PW, node.numel)
        self.join(kernel, node.id)

    def _producer(self, nid: int) -> int:
        """Index of the kernel that stores the tensor behind ``nid`` (-1 for inputs, params)."""
        node = self.node(nid)
        while nid not in self.kernel_of and node.kind in (NodeKind.VIEW, NodeKind.PERM):
            nid = node.tensor_args()[0]
            node = self.node(nid)
        return self.kernel_of.get(nid, -1)

    def _after(self, kernel: Kernel, args: list[int]) -> bool:
        """Whether every operand is stored before ``kernel`` runs."""
        return all(self._producer(a) < kernel.index for a in args)

    def _fits(self, kernel: Kernel, node: Node, mine: list[int]) -> bool | None:
        """The level (True: element) at which ``node`` joins ``kernel``, or None if it cannot."""
        if kernel.kind is KernelKind.TORCH:
            return None
        if kernel.kind is KernelKind.PW:
            return True if node.numel == kernel.numel else None
        if kernel.kind in _ONE_NODE_KERNELS:
            if any(a not in kernel.elem for a in mine):
                return None  # a sum the kernel adds into is complete only after every tile
            return True if self.params.fuse_epilogue and node.numel == kernel.numel else None
        elem_args = [a for a in mine if a in kernel.elem]
        if mine and not elem_args and node.numel == kernel.outer * kernel.inner:
            return False
        if not mine and node.numel != kernel.numel:
            return False if node.numel == kernel.outer * kernel.inner else None
        if node.numel != kernel.numel:
            return None
        for a in mine:
            if a not in kernel.elem and (
                node.shape != kernel.domain or not keepdim_compatible(self.node(a).shape, kernel.domain, kernel.dims)
            ):
                return None
        return True


SPATIAL_SUM_MIN = 64
"""Output positions per image and channel a convolution must have for its spatial sums to join
it: each tile then spans few images (``ConvWriter``'s partial sums per image)."""


def spatial_sum(plan: Plan, node: Node, conv_shape: tuple[int, ...]) -> bool:
    """Whether ``node`` sums a float32 value of the convolution's output shape over every spatial
    dimension (batch and channels kept), over at least :data:`SPATIAL_SUM_MIN` positions.

    The bound only changes speed (the convolution's tiles add into the sums at any size): where
    the positions move with the task's sizes (an any-size copy, ``any_sizes``) it is taken at the
    task's own sizes."""
    rank = len(conv_shape)
    src = node.tensor_args()[0] if node.kind is NodeKind.RED else -1
    return (
        node.kind is NodeKind.RED
        and node.op == "sum"
        and node.dims == (2, rank)
        and node.dtype == "float32"
        and plan.nodes[src].shape == conv_shape
        and at_task(math.prod(conv_shape[2:])) >= SPATIAL_SUM_MIN
    )


def reduced_only_convs(plan: Plan, live: frozenset[int]) -> frozenset[int]:
    """The convolutions whose output, through elementwise ops of its shape, is read only by
    :func:`spatial_sum` reductions (a global average pool, a spatial mean or sum): such sums may
    join the convolution's kernel. A value of the chain that the model returns, or that anything
    else reads (a view, an op mixing in one of the sums: a batch norm's centring), keeps the
    output stored and the sums in kernels of their own."""
    found: set[int] = set()
    for conv in plan.nodes:
        if conv.kind is not NodeKind.CONV or conv.id not in live:
            continue
        chain, derived, ok = {conv.id}, {conv.id}, True
        for node in plan.nodes[conv.id + 1 :]:
            if node.id not in live:
                continue
            args = node.tensor_args()
            if not any(a in derived for a in args):
                continue
            derived.add(node.id)
            if not any(a in chain for a in args):
                continue
            if spatial_sum(plan, node, conv.shape):
                continue
            if (
                node.kind is NodeKind.EW
                and node.op not in GATHER_OPS
                and node.shape == conv.shape
                and all(a in chain or a not in derived for a in args)
            ):
                chain.add(node.id)
                continue
            ok = False
            break
        if ok and not chain & set(plan.outputs):
            found.add(conv.id)
    return frozenset(found)


_SCHEDULES: OrderedDict[tuple[int, bool, bool], tuple[Plan, Schedule]] = OrderedDict()
"""Schedules by plan and fusion switches, the newest ``_SCHEDULES_KEPT`` (the plan kept with its
schedule, so its id is not reused while the entry lives): a schedule depends on nothing else, the
expert renders and mutates the same plan many times a second, and no one changes a built schedule."""
_SCHEDULES_KEPT = 64
_SCHEDULES_LOCK = threading.Lock()  # the expert renders in worker threads


def schedule(plan: Plan, params: TemplateParams) -> Schedule:
    """Split ``plan`` into kernels under the fusion switches of ``params`` (a shared, read-only
    ``Schedule``: built once per plan and switches)."""
    key = (id(plan), params.fuse_epilogue, params.fuse_prologue)
    with _SCHEDULES_LOCK:
        known = _SCHEDULES.get(key)
        if known is not None and known[0] is plan:
            _SCHEDULES.move_to_end(key)
            return known[1]
    result = _Builder(plan, params).build()
    _check_addressable(result)
    with _SCHEDULES_LOCK:
        _SCHEDULES[key] = (plan, result)
        while len(_SCHEDULES) > _SCHEDULES_KEPT:
            _SCHEDULES.popitem(last=False)
    return result


def base_of(plan: Plan, nid: int, stored: Callable[[int], bool]) -> tuple[int, bool]:
    """The materialised tensor behind ``nid`` and whether a transpose sits on top.

    ``stored`` says which computed nodes a kernel writes to a buffer. Raises
    :class:`UnsupportedGraph` for a reshape of a transposed tensor (not a view).
    """
    transposed = False
    node = plan.nodes[nid]
    if node.kind is NodeKind.PERM:
        transposed = True
        node = plan.nodes[node.tensor_args()[0]]
    while node.kind is NodeKind.VIEW and not stored(node.id):
        node = plan.nodes[node.tensor_args()[0]]
        if node.kind is NodeKind.PERM:
            raise UnsupportedGraph("a reshape of a transposed tensor is not covered")
    if node.kind not in (NodeKind.INPUT, NodeKind.PARAM, NodeKind.VIEW, NodeKind.PERM) and not stored(node.id):
        raise AssertionError(f"node {node.id} is read by another kernel but never stored")
    return node.id, transposed


def _check_addressable(sched: Schedule) -> None:
    """Every external operand must be readable by linear index (or by strides in a product)."""
    plan = sched.plan
    for kernel in sched.kernels:
        for nid in kernel.nodes:
            node = plan.nodes[nid]
            if node.kind in (NodeKind.MM, NodeKind.TORCH):
                for arg in node.tensor_args():
                    base_of(plan, arg, sched.is_exported)
                continue
            if node.kind in ONE_NODE_KINDS:  # read by strides, not as transposed operands (matmuls are, above)
                for arg in node.tensor_args():
                    if base_of(plan, arg, sched.is_exported)[1]:
                        raise UnsupportedGraph(f"a {node.kind.value} of a transposed tensor is not covered")
                continue
            if node.kind not in (NodeKind.EW, NodeKind.RED):
                continue
            for i, arg in enumerate(node.tensor_args()):
                if sched.kernel_of.get(arg) == kernel.index:
                    continue
                _, transposed = base_of(plan, arg, sched.is_exported)
                if gathered(node.op, i):
                    if transposed:
                        raise UnsupportedGraph("indices into a transposed tensor are not covered")
                    continue  # read at computed addresses, not broadcast
                target = plan.nodes[arg].shape if node.kind is NodeKind.RED else node.shape
                if broadcast_blocks(plan.nodes[arg].shape, target) is None:
                    raise UnsupportedGraph(
                        f"an operand of shape {plan.nodes[arg].shape} broadcast to {target} is not covered"
                    )
