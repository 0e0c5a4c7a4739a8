"""Lowering a traced reference into the plan's primitive nodes.

Every spelling of a covered op (function, method, module, operator) maps to one canonical op
(``spellings.py``); composites become primitive parts here: ``mean`` a sum and a division,
``softmax``/``log_softmax``/``logsumexp`` a max, an exp-sum and elementwise parts, ``layer_norm``
/ ``rms_norm`` / ``group_norm`` two reductions and an affine epilogue, ``linear`` a matrix product
with a transposed weight and a bias. Anything else raises :class:`UnsupportedGraph`.
"""

from __future__ import annotations

import builtins
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.nn.utils.weight_norm import WeightNorm

from actors.experts.template.attn_pattern import explicit_attention
from actors.experts.template.composites import apply
from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import (
    CASTS,
    COMPARISONS,
    EW_OPS,
    FLOAT_ARG,
    HALF,
    DiagRef,
    KeepTorch,
    Node,
    NodeKind,
    NodeRef,
)
from actors.experts.template.keep_torch import is_layout, keep
from actors.experts.template.lowering import INDEX_DTYPES, index_inputs, load_families, lower_fn
from actors.experts.template.spellings import bind, resolve
from actors.experts.template.tensor_attrs import TensorAttrs
from actors.experts.template.trace import Traced


def _is_id(ref: object) -> bool:
    return isinstance(ref, NodeRef)


def _broadcast(shapes: list[tuple[int, ...]], op: str) -> tuple[int, ...]:
    """The broadcast of ``shapes`` (numpy rules), or decline."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, size in enumerate((1,) * (rank - len(shape)) + shape):
            if size != 1 and out[i] not in (1, size):
                raise UnsupportedGraph(f"operands of {op} with shapes {shapes} do not broadcast", op=op)
            out[i] = size if size != 1 else out[i]
    return tuple(out)


SPLIT_MIN_ROW = 65536
"""Reductions over innermost rows at least this long, with few rows, are split in two stages."""
SPLIT_ROWS = 2048
"""How many partial rows a split reduction aims at (enough programs to fill a GPU)."""


def _split(op: str, shape: tuple[int, ...], dims: tuple[int, int]) -> int | None:
    """The number of parts to split a reduction's rows into, or ``None`` to keep it whole.

    Only sums, maxima and minima over innermost dims (``inner == 1``) with fewer rows than
    ``SPLIT_ROWS`` and rows of at least ``SPLIT_MIN_ROW``; the parts are a power of two that
    divides the row and leaves parts of at least ``SPLIT_MIN_ROW / 64`` elements.
    """
    d0, d1 = dims
    if op not in ("sum", "amax", "amin") or d1 != len(shape):
        return None
    outer, r = math.prod(shape[:d0]), math.prod(shape[d0:])
    if outer >= SPLIT_ROWS or r < SPLIT_MIN_ROW:
        return None
    parts = 1 << max(0, (SPLIT_ROWS // max(outer, 1)).bit_length() - 1)
    while parts >= 2 and (r % parts or r // parts < SPLIT_MIN_ROW // 64):
        parts //= 2
    return parts if parts >= 2 else None


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, tuple | list):
        return any(_has_tensor(v) for v in value)
    return False


@dataclass(frozen=True)
class _Uncovered:
    """An FX node the templates do not cover; reading it declines with its reason (a pattern such
    as explicit attention may consume it without reading it)."""

    error: UnsupportedGraph


_INDEX_DTYPES = {getattr(torch, name): name for name in INDEX_DTYPES}
"""The integer dtypes a buffer of gather indices may have (the plan's name for each)."""

_IN_ORDER_KINDS = frozenset({NodeKind.CONV, NodeKind.POOL, NodeKind.SCAN, NodeKind.REC})
"""Nodes that read their operands in row-major order (products read a transpose by its strides)."""
_HALF_KINDS = frozenset(
    {
        NodeKind.INPUT,
        NodeKind.PARAM,
        NodeKind.EW,
        NodeKind.RED,
        NodeKind.VIEW,
        NodeKind.ATTN,
        NodeKind.MM,
        NodeKind.PERM,
        NodeKind.CONV,
        NodeKind.POOL,
        NodeKind.SCAN,
    }
)
"""Node kinds that may take half operands (the others decline them: recurrences and ops left to PyTorch)."""


def _promoted(dtypes: list[str]) -> str:
    """The floating result type of an elementwise op on tensors of ``dtypes`` (PyTorch's promotion:
    one half type stays; float32, a mix of the two half types or no floating tensor gives float32)."""
    floating = {d for d in dtypes if d in ("float32", *HALF)}
    return floating.pop() if len(floating) == 1 and floating <= set(HALF) else "float32"


class Lowerer:
    """Walks the FX graph once, building nodes."""

    def __init__(self, traced: Traced, keep_torch: KeepTorch = KeepTorch.NONE, split: bool = True) -> None:
        self.traced = traced
        self.keep_torch = keep_torch
        """Which ops the templates do not cover may stay the reference's PyTorch calls."""
        self.split = split
        """Whether reductions over few huge rows are split in parts (:func:`_split`): a choice by
        size, so a plan for any size (``any_sizes``) is lowered without it."""
        self.split_taken = False
        """Whether some reduction was split (``Plan.split``)."""
        self._int_bounds: dict[int, int] = {}
        """An int64 node computed from ``torch.arange`` values (``_POSITION_OPS``) -> the largest
        magnitude it can hold (:meth:`int_bound`)."""
        self._copies_in_order: dict[int, NodeRef] = {}
        """A transpose's id -> its copy in row-major order (one copy however many ops read it so)."""
        self.nodes: list[Node] = []
        self.env: dict[fx.Node, Any] = {}
        self.ops: list[str] = []
        self.aliasing: set[fx.Node] = set()
        self.written: dict[fx.Node, fx.Node] = {}
        """In-place ops (as their spelling says: ``F.relu(x, True)`` too) -> the tensor each writes."""
        params: dict[str, torch.Tensor] = dict(traced.root.named_parameters())
        buffers = dict(traced.root.named_buffers())
        params.update(buffers)
        self.param_paths = params
        self.buffer_paths = frozenset(buffers)
        self.attrs = TensorAttrs(traced)
        """The plain tensor attributes forward reads and writes (not reproduced: what it leaves on them)."""
        self.returns: tuple[Any, ...] | None = None
        """How ``forward`` nests the tensors it returns (:attr:`Plan.returns`), once lowered."""

    # -- building blocks -------------------------------------------------------------------
    def add(self, kind: NodeKind, shape: tuple[int, ...], **kw: Any) -> NodeRef:
        """Append a node and return a reference to it."""
        if kind not in _HALF_KINDS and any(self.nodes[a].dtype in HALF for a in kw.get("args", ()) if type(a) is int):
            raise UnsupportedGraph(f"a {kind.value} node of float16/bfloat16 tensors is not covered (recurrent "
                                   "layers and ops left to PyTorch are float32 only)")  # fmt: skip
        if kind in _IN_ORDER_KINDS and any(type(a) is int and self.nodes[a].kind is NodeKind.PERM for a in kw["args"]):
            # read in row-major order, not by strides: a transposed operand is copied in order first
            kw["args"] = tuple(self.in_order(NodeRef(a)).id if type(a) is int else a for a in kw["args"])
        node = Node(id=len(self.nodes), kind=kind, shape=tuple(int(s) for s in shape), **kw)
        self.nodes.append(node)
        return NodeRef(node.id)

    def node(self, ref: NodeRef) -> Node:
        """The node behind a reference."""
        return self.nodes[ref.id]

    def shape(self, ref: NodeRef) -> tuple[int, ...]:
        """Shape of a node."""
        return self.nodes[ref.id].shape

    def param(self, path: str) -> NodeRef:
        """A node for the parameter or buffer at ``path``."""
        tensor = self.param_paths.get(path)
        if tensor is None:
            normalised = self._hooked_weight_norm(path)
            if normalised is not None:
                return normalised
            raise UnsupportedGraph(f"forward reads {path!r}, which is not a parameter or buffer")
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in ("float32", *HALF):
            raise UnsupportedGraph(
                f"parameter {path} is {tensor.dtype}; only float32, float16 and bfloat16 are covered"
            )
        return self._param_node(path, tensor, dtype)

    def _hooked_weight_norm(self, path: str) -> NodeRef | None:
        """The weight a deprecated ``torch.nn.utils.weight_norm`` hook computes before each forward
        of its module (``path``: ``module.weight``, set from ``weight_v`` and ``weight_g``), as
        ``torch._weight_norm`` computes it (``families/weight_norm.py``); None where no such hook sets it."""
        owner, _, name = path.rpartition(".")
        try:
            module = self.traced.root.get_submodule(owner)
        except AttributeError:
            return None
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                fn = lower_fn("weight_norm")
                if fn is None or f"{path}_v" not in self.param_paths or f"{path}_g" not in self.param_paths:
                    return None
                args = {"v": self.param(f"{path}_v"), "g": self.param(f"{path}_g"), "dim": hook.dim}
                got = fn(self, "weight_norm", args, None)
                return got if isinstance(got, NodeRef) else None
        return None

    def _param_node(self, path: str, tensor: torch.Tensor, dtype: str) -> NodeRef:
        for node in self.nodes:
            if node.kind is NodeKind.PARAM and node.path == path:
                return NodeRef(node.id)
        return self.add(NodeKind.PARAM, tuple(tensor.shape), path=path, dtype=dtype)

    def _index_buffer(self, fxn: fx.Node, path: str, tensor: torch.Tensor) -> NodeRef | _Uncovered:
        """An integer buffer read only as the indices of gathers (``table[buf.view(-1)]``,
        ``index_select``, ``F.embedding``: ``lowering.index_input``), passed to the kernels as any
        buffer is; read any other way, it declines where it is read, naming the buffer and the use."""
        what = "buffer" if path in self.buffer_paths else "parameter"
        use = _non_index_use(fxn)
        if use is not None:
            return _Uncovered(
                UnsupportedGraph(
                    f"{what} {path} is {tensor.dtype} and {_describe(use)} reads it; an integer {what} is "
                    "covered only as the indices of a gather (table[idx], index_select, embedding)",
                    op=_describe(use),
                )
            )
        dtype = _INDEX_DTYPES.get(tensor.dtype)
        if dtype is None:
            return _Uncovered(
                UnsupportedGraph(f"{what} {path} is {tensor.dtype}; gather indices are covered as int64 or int32")
            )
        return self._param_node(path, tensor, dtype)

    def tensor(self, ref: object, what: str) -> NodeRef:
        """``ref`` as a floating tensor (float32, or float16/bfloat16: computed in float32), or decline."""
        if isinstance(ref, DiagRef):
            raise UnsupportedGraph(f"{what}: torch.diag is covered only as an operand of a matrix product")
        if not isinstance(ref, NodeRef):
            raise UnsupportedGraph(f"{what} must be a tensor here, got {type(ref).__name__}")
        if self.node(ref).dtype not in ("float32", *HALF):
            raise UnsupportedGraph(
                f"{what} is {self.node(ref).dtype}; elementwise math covers float32, float16, bfloat16"
            )
        return ref

    def ew(self, op: str, *args: object, attrs: tuple[float, ...] = ()) -> NodeRef:
        """An elementwise node; its shape is the broadcast of its tensor arguments."""
        n_args, n_attrs = EW_OPS[op]
        if len(args) != n_args or len(attrs) != n_attrs:
            raise AssertionError(f"{op} takes {n_args} args and {n_attrs} attrs")
        clean: list[int | float] = []
        shapes: list[tuple[int, ...]] = []
        masks = [a for a in args if isinstance(a, NodeRef) and self.node(a).dtype == "bool"]
        if op == "where":  # picks by a bool condition between float32 values
            if not isinstance(args[0], NodeRef) or args[0] not in masks or any(a in masks for a in args[1:]):
                raise UnsupportedGraph("where picks by a bool tensor between float32 tensors or numbers", op=op)
        elif masks and (
            op not in ("mul", "add", "sub")
            or not any((isinstance(a, NodeRef) and a not in masks) or type(a) is float for a in args)
        ):  # PyTorch makes a bool tensor float32 with a float32 tensor or a float (an int gives int64)
            raise UnsupportedGraph(f"a bool tensor in {op}, not with a float32 tensor or float in mul/add/sub", op=op)
        if op == "take_last":
            return self._take_last(args[0], args[1])

        def int64(ref: NodeRef) -> bool:
            return self.node(ref).dtype == "int64"

        bound = self._position_bound(op, args)
        if bound is None:
            args = self._ints_to_float(op, args)
        for arg in args:
            if isinstance(arg, NodeRef) and bound is not None and int64(arg):
                clean.append(arg.id)  # positions from torch.arange, exact in float32 too (below 2**24)
                shapes.append(self.shape(arg))
            elif isinstance(arg, NodeRef) and op in (*COMPARISONS, "int_to_float32") and int64(arg):
                clean.append(arg.id)  # a class index compared with a number (``t != ignore_index``)
                shapes.append(self.shape(arg))
            elif isinstance(arg, NodeRef) and arg in masks:
                clean.append(arg.id)  # a bool mask, read as 0.0 / 1.0 (PyTorch promotes it so)
                shapes.append(self.shape(arg))
            elif isinstance(arg, NodeRef):
                tid = self.tensor(arg, f"an operand of {op}")
                clean.append(tid.id)
                shapes.append(self.shape(tid))
            elif isinstance(arg, int | float) and not isinstance(arg, bool):
                clean.append(float(arg))
            elif isinstance(arg, DiagRef):
                raise UnsupportedGraph(f"torch.diag as an operand of {op}: covered only in a matrix product", op=op)
            else:
                raise UnsupportedGraph(f"an operand of {op} is a {type(arg).__name__}", op=op)
        if not shapes:
            raise UnsupportedGraph(f"{op} of constants only", op=op)
        shape = _broadcast(shapes, op)
        dtype = (
            "int64"
            if bound is not None
            else CASTS[op]
            if op in CASTS
            else "bool"
            if op in COMPARISONS
            else _promoted([self.node(NodeRef(a)).dtype for a in clean if type(a) is int])
        )
        ref = self.add(NodeKind.EW, shape, op=op, args=tuple(clean), attrs=tuple(float(a) for a in attrs), dtype=dtype)
        if bound is not None:
            self._int_bounds[ref.id] = bound
        return ref

    def int_bound(self, ref: NodeRef) -> int | None:
        """The largest magnitude of an int64 node whose values come from ``torch.arange`` alone
        (through views and the integer ``add``/``sub``/``mul``/``neg``/``abs`` of such nodes and
        ints): positions and their differences, an ALiBi bias's ``j - i``. ``None`` for any other
        node (an int64 input, an index an op computed from data)."""
        node = self.node(ref)
        if node.dtype != "int64":
            return None
        if node.kind is NodeKind.VIEW and node.args and type(node.args[0]) is int:
            return self.int_bound(NodeRef(node.args[0]))
        if node.kind is NodeKind.EW and node.op == "arange":
            start, step = node.attrs
            last = start + step * max(node.numel - 1, 0)
            return int(max(abs(start), abs(last)))
        return self._int_bounds.get(node.id)

    def _position_bound(self, op: str, args: tuple[object, ...]) -> int | None:
        """The bound of ``op``'s int64 result where PyTorch computes it in int64 from nodes with an
        :meth:`int_bound` and Python ints, and every value stays below 2**24 (a kernel may carry
        them as float32, exactly then); else ``None`` (the op is lowered as before)."""
        if op not in _POSITION_OPS or not any(isinstance(a, NodeRef) for a in args):
            return None
        bounds: list[int] = []
        for arg in args:
            if isinstance(arg, NodeRef):
                b = self.int_bound(arg)
                if b is None:
                    return None
                bounds.append(b)
            elif isinstance(arg, int) and not isinstance(arg, bool):
                bounds.append(abs(arg))
            else:
                return None
        total = math.prod(bounds) if op == "mul" else sum(bounds)
        return total if total < _EXACT_INT else None

    def _take_last(self, x: object, index: object) -> NodeRef:
        """``x[..., index[...]]`` (see ``take_last`` in :data:`EW_OPS`)."""
        src = self.tensor(x, "the tensor a class index reads")
        if not isinstance(index, NodeRef) or self.node(index).dtype != "int64":
            raise UnsupportedGraph("a class index must be an int64 tensor")
        if self.shape(src)[:-1] != self.shape(index) or not self.shape(src):
            raise UnsupportedGraph(f"class indices of shape {self.shape(index)} into {self.shape(src)} are not covered")
        src = self.in_order(src)  # ``F.cross_entropy(logits.t(), labels)``: a copy in order
        if self.transposed(src):
            raise UnsupportedGraph("class indices into a view of a transposed tensor are not covered")
        return self.add(
            NodeKind.EW, self.shape(index), op="take_last", args=(src.id, index.id), dtype=self.node(src).dtype
        )

    def _ints_to_float(self, op: str, args: tuple[object, ...]) -> tuple[object, ...]:
        """``args`` with each int64 tensor converted to float32 where PyTorch computes ``op`` in a
        floating type: with a float32 tensor or a float (``ids * 0.5``), or a true division
        (``ids / n``). Otherwise an int64 operand stays, and declines unless ``op`` compares."""
        ints = [a for a in args if isinstance(a, NodeRef) and self.node(a).dtype == "int64"]
        if not ints or op not in _INT_TO_FLOAT:
            return args
        if any(isinstance(a, NodeRef) and self.node(a).dtype in HALF for a in args):
            # PyTorch's result is the half type; the conversion below would make it float32
            raise UnsupportedGraph(f"{op} of an int64 tensor and a float16/bfloat16 tensor is not covered", op=op)
        floating = any((isinstance(a, NodeRef) and self.node(a).dtype == "float32") or type(a) is float for a in args)
        if not floating and op != "div":
            raise UnsupportedGraph(f"{op} of int64 tensors and ints (an int64 result) is not covered", op=op)
        return tuple(self.ew("int_to_float32", a) if a in ints else a for a in args)

    def view(self, src: NodeRef, shape: tuple[int, ...]) -> NodeRef:
        """A reshape of ``src`` (same elements, row-major order)."""
        if math.prod(shape) != self.node(src).numel:
            raise UnsupportedGraph(f"a view from {self.shape(src)} to {shape} changes the element count")
        if tuple(shape) == self.shape(src):
            return src
        src = self.in_order(src)  # a reshape of a transpose: of its copy in row-major order
        return self.add(NodeKind.VIEW, shape, args=(src.id,), dtype=self.node(src).dtype)

    def perm(self, src: NodeRef) -> NodeRef:
        """Swap of the last two dimensions of ``src``."""
        shape = self.shape(src)
        if len(shape) < 2:
            raise UnsupportedGraph("a transpose of a tensor with fewer than two dimensions")
        return self.add(NodeKind.PERM, (*shape[:-2], shape[-1], shape[-2]), args=(src.id,), dtype=self.node(src).dtype)

    def in_order(self, ref: NodeRef) -> NodeRef:
        """``ref``, or where it is a transpose, a copy of it in row-major order (``families/strided.py``)."""
        if self.node(ref).kind is not NodeKind.PERM:
            return ref
        held = self._copies_in_order.get(ref.id)
        if held is not None:
            return held
        copy = lower_fn("in_order")
        assert copy is not None
        out = copy(self, "in_order", {"input": ref}, None)
        assert isinstance(out, NodeRef)
        self._copies_in_order[ref.id] = out
        return out

    def transposed(self, ref: NodeRef) -> bool:
        """Whether ``ref`` is a transpose, or a view of one (which cannot be reshaped again)."""
        node = self.node(ref)
        while node.kind is NodeKind.VIEW:
            node = self.nodes[node.tensor_args()[0]]
        return node.kind is NodeKind.PERM

    def column_parts(self, src: NodeRef, parts: int) -> int:
        """``parts`` (a family's split of a reduction over its rows into parts, chosen by size),
        or 1 where this lowering splits nothing (``split``) or ``src`` cannot be reshaped."""
        if parts <= 1 or self.transposed(src) or not self.split:
            return 1
        self.split_taken = True
        return parts

    def split_parts(self, op: str, src: NodeRef, dims: tuple[int, int]) -> int | None:
        """How many parts a reduction of ``src`` over ``dims`` is split into (``None``: kept whole)."""
        parts = None if self.transposed(src) or not self.split else _split(op, self.shape(src), dims)
        self.split_taken |= parts is not None
        return parts

    def red(self, op: str, src: NodeRef, dims: tuple[int, int], keepdim: bool, split_rows: bool = True) -> NodeRef:
        """A reduction of ``src`` over ``dims`` (split in two stages when its rows are few and huge,
        unless ``split_rows`` is False: the caller chose the stages, see ``families.norm.moments``)."""
        shape = self.shape(src)
        d0, d1 = dims
        out = (*shape[:d0], *([1] * (d1 - d0)), *shape[d1:]) if keepdim else (*shape[:d0], *shape[d1:])
        split = self.split_parts(op, src, dims) if split_rows else None
        if split is not None:
            # Two stages: (outer, S, R / S) reduced over its last dim gives (outer, S) partials
            # that many programs compute in parallel; reducing those over S gives the result.
            rows = shape[:d0]
            parts = self.red(
                op, self.view(src, (*rows, split, math.prod(shape[d0:]) // split)), (d0 + 1, d0 + 2), False
            )
            return self.view(self.red(op, parts, (d0, d0 + 1), False), out)
        src_dtype = self.node(src).dtype
        dtype = "int64" if op.startswith("arg") else src_dtype if src_dtype in HALF else "float32"
        return self.add(NodeKind.RED, out, op=op, args=(src.id,), dims=dims, keepdim=keepdim, dtype=dtype)

    # -- the walk --------------------------------------------------------------------------
    def lower(self) -> tuple[int, ...]:
        """Lower the whole graph; return the ids of the nodes ``forward`` returns, in order."""
        load_families()  # their spellings and lowerings, before the first node is resolved
        output: tuple[int, ...] | None = None
        for fxn in self.traced.graph_module.graph.nodes:
            if fxn.op == "output":
                output = self._output(fxn)
                continue
            value = self._node(fxn)
            self.env[fxn] = value
            written = self.written.get(fxn) or _written(fxn, self.traced.root)
            if written is not None:
                # An in-place op (``x.mul_(2)``, ``x += y``, ``nn.ReLU(inplace=True)``): every later
                # read of the tensor it wrote is of its result. Where it is not covered, reads of
                # that tensor and of every view sharing its memory decline.
                for target in self._aliases(written) if isinstance(value, _Uncovered) else (written,):
                    self.env[target] = value
                self.attrs.wrote(written, value)  # later reads of a tensor attribute see it too
        if output is None:
            raise UnsupportedGraph("forward returns nothing")
        self.attrs.check_state()
        return output

    def _output(self, fxn: fx.Node) -> tuple[int, ...]:
        """The returned tensors, in order: one, or a tuple or list of them, nested or not (each
        computed here, none an alias of another: the evaluator refuses outputs that share memory);
        their nesting goes to :attr:`returns`."""
        refs: list[Any] = []

        def nest(value: Any) -> Any:
            if isinstance(value, tuple | list):
                return ("list" if isinstance(value, list) else "tuple", *(nest(v) for v in value))
            refs.append(value)
            return len(refs) - 1

        shape = nest(self.arg(fxn.args[0]))
        if not refs or not all(isinstance(r, NodeRef) for r in refs):
            raise UnsupportedGraph("forward must return tensors (one, or tuples or lists of them)")
        self.returns = shape if isinstance(shape, tuple) else None
        for i, ref in enumerate(refs):
            if self.node(ref).kind is NodeKind.PERM and self._computed(NodeRef(self.node(ref).tensor_args()[0])):
                # a transpose of a computed tensor (``norm(y.transpose(1, 2)).transpose(1, 2)``):
                # returned as its copy in row-major order (the values PyTorch's view holds)
                refs[i] = self.in_order(ref)
        roots: list[int] = []
        for ref in refs:
            root = self.node(ref)
            while root.kind is NodeKind.VIEW:
                root = self.nodes[root.tensor_args()[0]]
            if root.kind in (NodeKind.INPUT, NodeKind.PARAM, NodeKind.PERM):
                raise UnsupportedGraph("forward returns an input or parameter without computing on it")
            roots.append(root.id)
        if len(set(roots)) != len(roots):
            raise UnsupportedGraph("forward returns two views of one tensor")
        return tuple(r.id for r in refs)

    def _computed(self, ref: NodeRef) -> bool:
        """Whether ``ref`` (through views) is computed here, not an input or parameter."""
        node = self.node(ref)
        while node.kind is NodeKind.VIEW:
            node = self.nodes[node.tensor_args()[0]]
        return node.kind not in (NodeKind.INPUT, NodeKind.PARAM, NodeKind.PERM)

    def arg(self, value: Any) -> Any:
        if isinstance(value, fx.Node):
            found = self.env[value]
            if isinstance(found, _Uncovered):
                raise found.error
            return found
        if isinstance(value, tuple | list):
            return type(value)(self.arg(v) for v in value)
        if isinstance(value, dict):
            return {k: self.arg(v) for k, v in value.items()}
        return value

    def _node(self, fxn: fx.Node) -> object:
        traced = self.traced.values.get(fxn)
        if fxn.op == "placeholder":
            if not isinstance(traced, torch.Tensor):
                raise UnsupportedGraph(f"argument {fxn.target} is not a tensor")
            # An int64 input is kept where every use (through views) reads indices or is one the
            # elementwise ops cover for int64 (:func:`_numeric_use`), or the policy keeps every op.
            use = _non_index_use(fxn, self.traced.values) if traced.dtype == torch.int64 else None
            kept = traced.dtype == torch.int64 and (
                self.keep_torch is KeepTorch.ALL or (bool(fxn.users) and use is None)
            )
            half = traced.dtype in (torch.float16, torch.bfloat16)  # attention reads them; else declined
            if use is not None and not kept:
                raise UnsupportedGraph(
                    f"input {fxn.target} is torch.int64 and {_describe(use)} reads it; an int64 input is covered as "
                    "indices (embeddings, gathers, class targets), in comparisons and in float arithmetic "
                    "(ids.float(), ids * 0.5), not with an int64 result (ids + 1, ids % n)"
                )
            if traced.dtype not in (torch.float32, torch.bool) and not kept and not half:
                raise UnsupportedGraph(
                    f"input {fxn.target} is {traced.dtype}; only float32 (and bool masks) is covered"
                )
            index = sum(1 for n in self.env if n.op == "placeholder")
            dtype = str(traced.dtype).removeprefix("torch.")
            path = FLOAT_ARG if index in self.traced.float_args else ""
            return self.add(NodeKind.INPUT, tuple(traced.shape), index=index, dtype=dtype, path=path)
        if fxn.op == "get_attr" and (attr := self.attrs.path_of(fxn)) is not None:
            return self.attrs.read(self, fxn, attr)  # a plain tensor attribute (``tensor_attrs.py``)
        if fxn.op == "get_attr":
            if str(fxn.target) not in self.param_paths:
                constant = _scalar_constant(self.traced.graph_module, str(fxn.target))
                if constant is not None:
                    return constant
            held = self.param_paths.get(str(fxn.target))
            if held is not None and not held.is_floating_point() and not held.is_complex() and held.dtype != torch.bool:
                return self._index_buffer(fxn, str(fxn.target), held)
            return self.param(str(fxn.target))
        if traced is not None and not _has_tensor(traced):
            if isinstance(traced, bool | int | float | torch.device | torch.dtype) or (
                isinstance(traced, tuple | torch.Size) and all(isinstance(v, int) for v in traced)
            ):
                return traced
            raise UnsupportedGraph(f"a non-tensor value of type {type(traced).__name__} in forward")
        try:
            return self._covered(fxn, traced)
        except UnsupportedGraph as exc:
            if self.keep_torch is KeepTorch.ALL or (self.keep_torch is KeepTorch.LAYOUT and is_layout(fxn)):
                try:
                    return keep(self, fxn, traced, self.traced.source or "")
                except UnsupportedGraph as kept:
                    return _Uncovered(kept)
            return _Uncovered(exc)  # declines only if something that is computed reads it

    def _covered(self, fxn: fx.Node, traced: Any) -> object:
        module = self.traced.root.get_submodule(str(fxn.target)) if fxn.op == "call_module" else None
        spec = resolve(fxn, module)
        if spec is None:
            what = _describe(fxn) + (f" ({type(module).__name__})" if module is not None else "")
            raise UnsupportedGraph(f"{what} is not covered by the templates", op=what)
        if spec.canon == "matmul":
            attention = explicit_attention(self, fxn)
            if attention is not None:
                self.ops.append("attention")
                return attention
        args = [self.arg(a) for a in fxn.args]
        kwargs = {k: self.arg(v) for k, v in fxn.kwargs.items()}
        bound = bind(spec, args, kwargs, module)
        if module is not None:
            bound["__path__"] = str(fxn.target)
        if bound.get("inplace") is True or spec.inplace:
            self._check_inplace(fxn)
            self.written[fxn] = fxn.args[0]  # type: ignore[assignment]  # an fx.Node: checked above
        ref = apply(self, spec.canon, bound, traced)
        if spec.canon in ("view", "alias", "perm") or (
            spec.canon == "getitem" and isinstance(bound.get("input"), NodeRef)
        ):
            self.aliasing.add(fxn)  # a slice is a view in PyTorch (a copy here): a write through it is declined
        self.ops.append(spec.canon)
        return ref

    def _check_inplace(self, fxn: fx.Node) -> None:
        """An in-place op is computed as its result, which later reads of the tensor it writes see
        (``lower``); each side of a trial runs on its own copy of the inputs, so writing an input
        is covered, and so is a whole overwrite of a plain tensor attribute (``tensor_attrs.py``).
        Not covered: writing a parameter or buffer (the model's state would change
        from call to call), a view (its base changes too), or a tensor a view was taken of before."""
        src = fxn.args[0] if fxn.args else None
        if (attr := self.attrs.path_of(src)) is not None:
            return self.attrs.check_write(fxn, attr)  # a plain tensor attribute: a whole overwrite
        if not isinstance(src, fx.Node) or src.op == "get_attr" or self._is_parameter(src):
            raise UnsupportedGraph("an in-place op on a parameter or buffer is not covered")
        if src in self.aliasing:
            raise UnsupportedGraph("an in-place op on a view is not covered")
        if any(user in self.aliasing for user in src.users):
            raise UnsupportedGraph("an in-place op on a tensor that a view was taken of is not covered")

    def _aliases(self, node: fx.Node) -> set[fx.Node]:
        """``node``, the tensor it is a view of, and every view of that taken so far."""
        root = node
        while root in self.aliasing and root.args and isinstance(root.args[0], fx.Node):
            root = root.args[0]
        found, todo = {root}, [root]
        while todo:
            for user in todo.pop().users:
                if user in self.aliasing and user not in found:
                    found.add(user)
                    todo.append(user)
        return found

    def _is_parameter(self, src: fx.Node) -> bool:
        value = self.env.get(src)
        return isinstance(value, NodeRef) and self.node(value).kind is NodeKind.PARAM


_POSITION_OPS = frozenset({"add", "sub", "mul", "neg", "abs"})
"""Ops whose int64 result is computed where their operands are positions (``Lowerer.int_bound``)."""

_EXACT_INT = 2**24
"""Integers below this magnitude are exact in float32."""

_INT_TO_FLOAT = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})
"""Elementwise ops whose int64 operands are converted to float32 where the result is floating."""

_TO_FLOAT = _INT_TO_FLOAT | {"alias"}
"""Ops whose int64 operand is converted to float32 where their result is floating (an int64 tensor
with a float32 tensor or a float, ``ids / n``, ``ids.float()``): ``Lowerer.ew``'s rule."""


def _numeric_use(canon: str, user: fx.Node, values: dict[fx.Node, Any] | None) -> bool:
    """Whether ``user`` (of canonical op ``canon``) reads an int64 tensor in a way the elementwise
    ops cover: a comparison (a bool result), or a conversion or arithmetic whose result is floating.
    Integer results (``ids + 1``, ``ids % n``, sums of ids) are not covered."""
    if values is None:
        return False
    if canon in COMPARISONS:
        return True
    result = values.get(user)
    return canon in _TO_FLOAT and isinstance(result, torch.Tensor) and result.is_floating_point()


_METADATA = ("shape", "device", "dtype", "ndim", "is_cuda")


def _metadata_use(user: fx.Node, fxn: fx.Node) -> bool:
    """Whether ``user`` reads only ``fxn``'s shape, device or dtype, not its elements."""
    if not user.args or user.args[0] is not fxn:
        return False
    if user.op == "call_method":
        return str(user.target) in ("size", "dim") and fxn not in user.args[1:]
    return (
        user.op == "call_function" and user.target is builtins.getattr and user.args[1:2] in [(n,) for n in _METADATA]
    )


def _non_index_use(fxn: fx.Node, values: dict[fx.Node, Any] | None = None, selected: bool = False) -> fx.Node | None:
    """The first use of ``fxn`` other than as the index argument of an op that reads integer
    indices (``lowering.index_input``), looking through views (``idx.view(-1)``) and basic
    selections (``ids[:, 1:]``); None if none. Given the traced ``values``, the elementwise uses
    :func:`_numeric_use` names count as indices. A selection (``selected``) may also be returned:
    it is a copy the kernels compute."""
    indexed = index_inputs()
    for user in fxn.users:
        if _metadata_use(user, fxn) or (selected and user.op == "output"):
            continue  # ``idx.size(1)``, ``idx.shape``, ``idx.device``: no element is read
        module = None
        if user.op == "call_module":
            owner = user.graph.owning_module
            if owner is None:
                return user
            module = owner.get_submodule(str(user.target))
        spec = resolve(user, module)
        if spec is not None and _numeric_use(spec.canon, user, values):
            continue
        if spec is not None and spec.canon == "getitem" and user.args[:1] == (fxn,) and _basic_index(user.args[1:2]):
            inner = _non_index_use(user, values, selected=True)  # ``ids[:, 1:]``, ``cats[:, i]``: a selection
            if inner is not None:
                return inner
            continue
        if spec is None or spec.canon not in (*indexed, "view"):
            return user
        try:
            bound = bind(spec, list(user.args), dict(user.kwargs), module)
        except UnsupportedGraph:
            return user
        param = "input" if spec.canon == "view" else indexed[spec.canon]
        if bound.get(param) is not fxn or any(_mentions(v, fxn) for k, v in bound.items() if k != param):
            return user
        if spec.canon == "view":
            inner = _non_index_use(user, values, selected)
            if inner is not None:
                return inner
    return None


def _basic_index(value: object) -> bool:
    """Whether ``value`` holds only a basic index (ints, slices of ints, ``None``, ``Ellipsis``):
    a selection, not a read of another tensor's values."""
    if isinstance(value, tuple | list):
        return all(_basic_index(v) for v in value)
    if isinstance(value, slice):
        return all(
            v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (value.start, value.stop, value.step)
        )
    return value is None or value is Ellipsis or (isinstance(value, int) and not isinstance(value, bool))


def _mentions(value: object, fxn: fx.Node) -> bool:
    if isinstance(value, tuple | list):
        return any(_mentions(v, fxn) for v in value)
    return value is fxn


def _scalar_constant(gm: fx.GraphModule, target: str) -> float | None:
    """The value of a one-element constant tensor that tracing stored (``torch.tensor(0.5)``)."""
    try:
        value = getattr(gm, target)
    except AttributeError:
        return None
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not value.is_meta
        and value.dtype in (torch.float32, torch.float64, torch.int64, torch.int32)
    ):
        return float(value.item())
    return None


def _describe(fxn: fx.Node) -> str:
    if fxn.op == "call_module":
        return f"module {fxn.target}"
    if fxn.op == "call_method":
        return f"method .{fxn.target}()"
    target = fxn.target
    if target is operator.getitem:
        return "indexing"
    name = getattr(target, "__name__", str(target))
    return f"function {getattr(target, '__module__', '') or ''}.{name}".replace("..", ".")


_AUGMENTED = frozenset(
    {
        operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
        operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
        operator.irshift,
    }
)  # fmt: skip
"""``x += y`` and its kin: on a tensor they write ``x`` (every other name of it sees the change)."""


def _written(fxn: fx.Node, root: torch.nn.Module) -> fx.Node | None:
    """The tensor ``fxn`` writes in place (``x.relu_()``, ``torch.relu_(x)``, ``F.relu(x,
    inplace=True)``, ``x += y``, a submodule built with ``inplace=True``), or None."""
    src = fxn.args[0] if fxn.args else None
    if not isinstance(src, fx.Node):
        return None
    if fxn.op == "call_module":
        return src if getattr(root.get_submodule(str(fxn.target)), "inplace", False) is True else None
    if fxn.op not in ("call_method", "call_function"):
        return None
    if fxn.target in _AUGMENTED or fxn.kwargs.get("inplace") is True:
        return src
    name = fxn.target if isinstance(fxn.target, str) else getattr(fxn.target, "__name__", "")
    return src if name.endswith("_") and not name.endswith("__") else None
