"""The template expert's intermediate form: a small graph of primitive operations.

The reference's FX graph is lowered (``lower.py``) into these nodes; every spelling of an op
(``torch.relu``, ``F.relu``, ``nn.ReLU()``, ``x.relu()``) becomes one canonical node, and the
composite ops (softmax, layer_norm, group_norm, logsumexp, linear) become their primitive parts.
Shapes are those traced from the reference's own ``get_inputs()``; the rendered ``ModelNew`` is
specialised to them (and checks them at run time).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from actors.experts.template import size_fits


class KeepTorch(StrEnum):
    """Which reference ops the templates do not cover may stay PyTorch calls between kernels."""

    NONE = "none"
    """None: a reference with an uncovered op is declined."""
    LAYOUT = "layout"
    """Only data movement (views, transposes, splits, slicing, ``contiguous``): allowed under every
    run policy (the evaluator admits views and copies)."""
    ALL = "all"
    """Any op the reference calls (run policy ``--torch-ops reference``)."""


class NodeKind(StrEnum):
    """What a node of the plan is."""

    INPUT = "input"
    """A positional argument of ``forward``."""
    PARAM = "param"
    """A parameter or buffer of the module (``path`` names it), or a plain tensor attribute
    (``op`` is :data:`TENSOR_ATTR`)."""
    EW = "ew"
    """An elementwise operation (``op``, ``args``, ``attrs``)."""
    RED = "red"
    """A reduction over the contiguous dimension range ``dims`` (``op`` in ``RED_OPS``)."""
    MM = "mm"
    """A (batched) matrix product of ``args[0]`` and ``args[1]``."""
    VIEW = "view"
    """A reshape of a contiguous value (same elements, new logical shape)."""
    PERM = "perm"
    """A swap of the last two dimensions (only as a matrix-product operand)."""
    CONV = "conv"
    """A (transposed) convolution of ``args[0]`` (N, C, *spatial) by the weight ``args[1]``; ``attrs``
    hold its :class:`ConvSpec`."""
    ATTN = "attn"
    """Scaled dot-product attention of ``args`` (q, k, v); ``attrs`` are (scale, causal)."""
    SCAN = "scan"
    """An inclusive scan (``op`` ``sum`` or ``prod``) of ``args[0]`` along ``dims`` (one dim);
    ``attrs[0]`` is 1.0 for a reversed scan (from the end)."""
    TORCH = "torch"
    """A reference op left to PyTorch (run policy ``reference``): ``path`` is the call as a Python
    expression with ``{i}`` standing for the i-th tensor of ``args``."""
    POOL = "pool"
    """A window pooling (``op`` ``max`` or ``avg``) over the trailing dims of ``args[0]``; ``attrs``
    hold its :class:`PoolSpec`."""
    REC = "rec"
    """A recurrent layer (``op`` ``lstm``, ``gru``, ``rnn_tanh`` or ``rnn_relu``), both directions,
    over the time steps in order; ``args`` and ``attrs`` as ``RecSpec`` (``families/_recurrent_kernel.py``)
    lays them out."""


FLOAT_ARG = "float"
"""The ``path`` of an ``INPUT`` node that ``forward`` receives as a Python float (a 0-dim float32
value in the plan; the rendered ``forward`` turns the number into one)."""

TENSOR_ATTR = "attr"
"""The ``op`` of a ``PARAM`` node that reads a plain tensor attribute of the module (set in
``__init__``, not a parameter or buffer): the rendered ``forward`` moves it to the kernels' device,
as ``.to(device)`` moves parameters and buffers but not plain attributes."""

HALF = ("float16", "bfloat16")
"""Half types the templates read and write (computing in float32, as PyTorch does inside each op)."""

EW_OPS: dict[str, tuple[int, int]] = {
    # op: (tensor-or-constant arguments, float attributes)
    "add": (2, 0),
    "sub": (2, 0),
    "mul": (2, 0),
    "div": (2, 0),
    "maximum": (2, 0),
    "minimum": (2, 0),
    "neg": (1, 0),
    "relu": (1, 0),
    "relu6": (1, 0),
    "leaky_relu": (1, 1),
    "gelu": (1, 0),
    "gelu_tanh": (1, 0),
    "sigmoid": (1, 0),
    "tanh": (1, 0),
    "silu": (1, 0),
    "mish": (1, 0),
    "softplus": (1, 2),
    "hardtanh": (1, 2),
    "clamp_min": (1, 1),
    "clamp_max": (1, 1),
    "hardswish": (1, 0),
    "hardsigmoid": (1, 0),
    "elu": (1, 1),
    "selu": (1, 0),
    "softsign": (1, 0),
    "logsigmoid": (1, 0),
    "tanhshrink": (1, 0),
    "exp": (1, 0),
    "log": (1, 0),
    "sqrt": (1, 0),
    "rsqrt": (1, 0),
    "abs": (1, 0),
    "erf": (1, 0),
    "reciprocal": (1, 0),
    "xlogx": (1, 0),
    "eq": (2, 0),
    "ne": (2, 0),
    "gt": (2, 0),
    "ge": (2, 0),
    "lt": (2, 0),
    "le": (2, 0),
    "where": (3, 0),
    "take_last": (2, 0),
    "triu": (1, 1),
    "tril": (1, 1),
    "as_float32": (1, 0),
    "int_to_float32": (1, 0),  # an int64 tensor's values as float32 (``ids.float()``, ``ids * 0.5``)
    "round_float16": (1, 0),
    "round_bfloat16": (1, 0),
}
"""Elementwise ops the templates emit, with their arity. Comparisons make ``bool`` nodes (0.0 / 1.0
inside a kernel, as loaded bool masks are); ``where`` picks by a ``bool`` first argument.
``take_last(x, t)`` reads ``x[..., t[...]]``: ``x`` (a stored tensor) of shape ``(*S, C)`` at the
int64 class index ``t`` of shape ``S`` (0.0 where ``t`` is outside ``[0, C)``). ``triu`` / ``tril``
keep ``x`` on and above (below) the diagonal ``attrs[0]`` of its last two dims and are 0.0
elsewhere (the element's own row and column, from the tile's index)."""

GATHER_OPS: dict[str, int] = {"take_last": 1}
"""Elementwise ops that read stored tensors at computed addresses, with how many of their leading
arguments they read so (0: all of them): ``take_last`` reads its first at an index loaded from its
second. The scheduler stores those tensors first and never broadcasts them. An op family adds its
own (with its ``EW_OPS`` entry and its emitter, ``emit.gather_emitter``)."""


def gathered(op: str, i: int) -> bool:
    """Whether argument ``i`` of elementwise op ``op`` is read at computed addresses."""
    count = GATHER_OPS.get(op)
    return count is not None and (count == 0 or i < count)


COMPARISONS: frozenset[str] = frozenset({"eq", "ne", "gt", "ge", "lt", "le"})

CASTS: dict[str, str] = {"as_float32": "float32", "round_float16": "float16", "round_bfloat16": "bfloat16"}
"""Conversions between the floating types (``x.half()``, ``x.to(torch.bfloat16)``, ``x.float()``) as
elementwise ops -> the type of their result: a half one rounds the value to that type (later ops
compute on the rounded value, as PyTorch's do), a float32 one keeps it."""

RED_OPS: tuple[str, ...] = ("sum", "prod", "amax", "amin", "argmax", "argmin")
"""Reductions the row template emits (mean is a sum and a division)."""


@dataclass(frozen=True)
class ConvSpec:
    """The geometry of a convolution node, kept in the node's ``attrs`` (floats) as
    ``(transposed, groups, *stride, *padding, *dilation)``."""

    transposed: bool
    groups: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    def attrs(self) -> tuple[float, ...]:
        """The spec as a node's ``attrs``."""
        return (float(self.transposed), float(self.groups), *map(float, self.stride + self.padding + self.dilation))

    @classmethod
    def from_attrs(cls, attrs: tuple[float, ...]) -> ConvSpec:
        """The inverse of :meth:`attrs`."""
        nd = (len(attrs) - 2) // 3
        ints = tuple(int(a) for a in attrs[2:])
        return cls(bool(attrs[0]), int(attrs[1]), ints[:nd], ints[nd : 2 * nd], ints[2 * nd :])


@dataclass(frozen=True)
class PoolSpec:
    """The geometry of a pooling node, kept in ``attrs`` as ``(count_include_pad, divisor_override
    (0: none), *kernel, *stride, *padding, *dilation)``. The output size (``ceil_mode``) is the
    node's traced shape."""

    count_include_pad: bool
    divisor_override: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    def attrs(self) -> tuple[float, ...]:
        """The spec as a node's ``attrs``."""
        dims = self.kernel + self.stride + self.padding + self.dilation
        return (float(self.count_include_pad), float(self.divisor_override), *map(float, dims))

    @classmethod
    def from_attrs(cls, attrs: tuple[float, ...]) -> PoolSpec:
        """The inverse of :meth:`attrs`."""
        nd = (len(attrs) - 2) // 4
        v = tuple(int(a) for a in attrs[2:])
        return cls(bool(attrs[0]), int(attrs[1]), v[:nd], v[nd : 2 * nd], v[2 * nd : 3 * nd], v[3 * nd :])


Arg = int | float
"""An argument of a node: the id of another node, or a float constant."""


@dataclass(frozen=True)
class Node:
    """One primitive operation with its traced output shape."""

    id: int
    kind: NodeKind
    shape: tuple[int, ...]
    dtype: str = "float32"
    op: str = ""
    args: tuple[Arg, ...] = ()
    attrs: tuple[float, ...] = ()
    dims: tuple[int, int] = (0, 0)
    """For ``RED``: the reduced dimensions ``[d0, d1)`` of ``args[0]``'s shape."""
    keepdim: bool = False
    index: int = 0
    """For ``INPUT``: the position in ``forward``'s arguments."""
    path: str = ""
    """For ``PARAM``: the dotted attribute path (``gemm.weight``)."""

    @property
    def numel(self) -> int:
        """Number of elements of the node's value."""
        return math.prod(self.shape)

    def tensor_args(self) -> tuple[int, ...]:
        """The ids of the nodes this node reads."""
        return tuple(a for a in self.args if isinstance(a, int) and not isinstance(a, bool))


@dataclass(frozen=True)
class Plan:
    """What ``analyse`` found: the lowered graph and what ``render`` needs around it."""

    nodes: tuple[Node, ...]
    output: int
    """Id of the node ``forward`` returns (the first, where it returns several)."""
    arg_names: tuple[str, ...]
    """Names of ``forward``'s positional arguments."""
    init_source: str
    """The reference's ``__init__`` as a method of ``ModelNew`` (same parameters, same order)."""
    prelude_source: str
    """Module-level imports and constants the ``__init__`` needs."""
    ops: tuple[str, ...]
    """Canonical ops of the reference's forward, in execution order."""
    template: str = ""
    """Kernel kinds of the fully fused schedule, e.g. ``mm+row`` (names the template)."""
    fusions: tuple[tuple[bool, bool], ...] = ((True, True),)
    """The (fuse_epilogue, fuse_prologue) settings that render, each a distinct schedule."""
    extra_outputs: tuple[int, ...] = ()
    """Ids of the further tensors ``forward`` returns, in order, where it returns a tuple or list
    (rendered nested as the reference nests them, :attr:`returns`: every tensor is judged)."""
    returns: tuple[Any, ...] | None = None
    """How ``forward`` nests what it returns where it returns a tuple or list (nested ones too: an
    ``nn.LSTM``'s ``(output, (h, c))``): ``("tuple" | "list", item, ...)``, each item a position in
    :attr:`outputs` or such a nest; ``None`` where it returns one tensor."""
    batch: tuple[tuple[int, ...], ...] = ()
    """Per node, per dimension of its shape: ``c`` where that dimension is ``c`` times the batch (the
    size :attr:`batch_name` sets), else 0 (``any_batch.py``: found by lowering the reference at a
    second batch size); empty where the plan is not the same at every batch size."""
    batch_name: str = ""
    """The reference's module-level variable that sets the batch size (where :attr:`batch` is set)."""
    batch_args: tuple[tuple[int, ...], ...] = ()
    """Per node, per argument: ``c`` where that float constant is ``c`` times the batch (a mean's
    divisor over the batch: batch norm's statistics, a loss averaged over its samples), else 0;
    empty where no constant moves with the batch (or :attr:`batch` is empty)."""
    batch_least: int = 1
    """The smallest batch the reference takes (2 where it refuses 1: batch norm in training mode)."""
    sizes: size_fits.Sizes | None = None
    """How every dimension follows all of the task's free sizes (``size_fits.Sizes``: the batch,
    image sizes, lengths); ``None`` where it does not in the form ``any_sizes`` fits."""
    split: bool = False
    """Whether a reduction over few huge rows was split in parts, as many as its size leaves room
    for (``Lowerer.split``): a choice by size, so ``any_sizes`` fits the plan lowered whole."""
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    """Per returned tensor, the reference's strides where they are not the contiguous ones (an
    einsum's permuted result, a slice of a larger tensor), else ``None``: outputs are judged in the
    reference's layout, so ``forward`` copies such a result into one of that layout."""

    @property
    def outputs(self) -> tuple[int, ...]:
        """Ids of every tensor ``forward`` returns, in order."""
        return (self.output, *self.extra_outputs)

    def node(self, node_id: int) -> Node:
        """The node with this id."""
        return self.nodes[node_id]

    @property
    def inputs(self) -> tuple[Node, ...]:
        """The ``INPUT`` nodes in argument order."""
        return tuple(sorted((n for n in self.nodes if n.kind is NodeKind.INPUT), key=lambda n: n.index))

    def live(self) -> frozenset[int]:
        """Ids of the nodes the outputs depend on."""
        seen: set[int] = set()
        stack = list(self.outputs)
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            stack.extend(self.nodes[nid].tensor_args())
        return frozenset(seen)


@dataclass(frozen=True)
class NodeRef:
    """A tensor while lowering: the id of the node that computes it (never a Python int)."""

    id: int


@dataclass(frozen=True)
class FlipRef:
    """While lowering: ``src`` flipped along ``dim`` (only a scan along that dim, or flipping it
    back, may consume it)."""

    src: NodeRef
    dim: int


@dataclass(frozen=True)
class TupleRef:
    """A traced tuple of tensors while lowering (``torch.max(x, dim)`` gives values, indices)."""

    items: tuple[NodeRef | Absent | TupleRef, ...]
    """Tensors, or tuples of them (``nn.LSTM`` returns ``(output, (h_n, c_n))``)."""


@dataclass(frozen=True)
class DiagRef:
    """``torch.diag(v)`` of a vector while lowering: the diagonal matrix is never built; only a
    matrix product reads it, as a broadcast product (``diag(v) @ b`` is ``v[:, None] * b``, with
    none of the N^3 multiplications by zero that the reference's GEMM does)."""

    vector: NodeRef


@dataclass(frozen=True)
class Absent:
    """An item of a traced tuple the templates do not compute (``MultiheadAttention``'s averaged
    weights); reading it declines with ``reason``."""

    reason: str


@dataclass(frozen=True)
class Unsupported:
    """``analyse``'s answer for a reference the templates do not cover."""

    detail: str
    """What is not covered, in plain language."""
    op: str | None = None
    """The op that stopped it, where one did."""


def broadcast_blocks(operand: tuple[int, ...], target: tuple[int, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """How an ``operand`` broadcast to ``target`` (numpy rules) is read by the target's linear index.

    Its dimensions of full size form runs ``[a, b)`` of ``target``'s dimensions (broadcast ones,
    of size one, between them); element ``lin`` of the target reads the sum over the runs of
    ``((lin // prod(target[b:])) % prod(target[a:b])) * stride``, ``stride`` being the operand's
    element count after the run. One run is the common case (a bias over channels, a row
    statistic); several come from a broadcast in the middle (``(B, 1, D)`` against ``(B, N, D)``).
    Returns ``()`` for a single value, ``None`` when the operand does not broadcast to ``target``.
    """
    rank = len(target)
    if len(operand) > rank:
        extra = operand[: len(operand) - rank]
        if any(s != 1 for s in extra):
            return None
        operand = operand[len(operand) - rank :]
    padded = (1,) * (rank - len(operand)) + tuple(operand)
    for size, full in zip(padded, target, strict=True):
        if size not in (1, full):
            return None
    runs: list[list[int]] = []
    for d in range(rank):
        if padded[d] != target[d]:  # broadcast here: a run ends
            runs.append([])
        elif not runs:
            runs.append([d])
        else:
            runs[-1].append(d)
    blocks = []
    for run in runs:
        if run and any(padded[d] != 1 for d in run):  # a run of unit dims only reads nothing
            a, b = run[0], run[-1] + 1
            blocks.append((a, b, math.prod(padded[b:])))
    return tuple(blocks)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """A plan as plain JSON-able data (the analysis child process sends it this way)."""
    data = asdict(replace(plan, sizes=None))
    data["nodes"] = [{**asdict(n), "kind": n.kind.value} for n in plan.nodes]
    data["sizes"] = size_fits.to_data(plan.sizes) if plan.sizes else None
    if plan.sizes and plan.sizes.plan is not None:
        data["sizes"]["plan"] = plan_to_dict(plan.sizes.plan)
    return data


def plan_from_dict(data: dict[str, Any]) -> Plan:
    """The inverse of :func:`plan_to_dict` (integers stay node ids, floats stay constants). A
    process that never analysed a plan reads one with :func:`actors.experts.template.lowering.read_plan`,
    which loads the op families first."""
    nodes = tuple(
        Node(
            id=int(n["id"]),
            kind=NodeKind(n["kind"]),
            shape=tuple(int(s) for s in n["shape"]),
            dtype=str(n["dtype"]),
            op=str(n["op"]),
            args=tuple(a if isinstance(a, int) else float(a) for a in n["args"]),
            attrs=tuple(float(a) for a in n["attrs"]),
            dims=(int(n["dims"][0]), int(n["dims"][1])),
            keepdim=bool(n["keepdim"]),
            index=int(n["index"]),
            path=str(n["path"]),
        )
        for n in data["nodes"]
    )
    return Plan(
        nodes=nodes,
        output=int(data["output"]),
        arg_names=tuple(str(a) for a in data["arg_names"]),
        init_source=str(data["init_source"]),
        prelude_source=str(data["prelude_source"]),
        ops=tuple(str(o) for o in data["ops"]),
        template=str(data["template"]),
        fusions=tuple((bool(f[0]), bool(f[1])) for f in data["fusions"]),
        extra_outputs=tuple(int(x) for x in data.get("extra_outputs") or ()),
        output_strides=tuple(
            None if st is None else tuple(int(x) for x in st) for st in data.get("output_strides") or ()
        ),
        returns=None if data.get("returns") is None else _returns_from(data["returns"]),
        batch=tuple(tuple(int(c) for c in dims) for dims in data.get("batch") or ()),
        batch_name=str(data.get("batch_name") or ""),
        batch_args=tuple(tuple(int(c) for c in cs) for cs in data.get("batch_args") or ()),
        batch_least=int(data.get("batch_least") or 1),
        sizes=_sizes_from(data.get("sizes")),
        split=bool(data.get("split", False)),
    )


def _sizes_from(data: Any) -> size_fits.Sizes | None:
    found = size_fits.from_data(data)
    if found and data.get("plan") is not None:
        found = replace(found, plan=plan_from_dict(data["plan"]))
    return found if found else None


def _returns_from(data: list[Any] | tuple[Any, ...]) -> tuple[Any, ...]:
    """:attr:`Plan.returns` from its JSON form (lists again tuples, positions integers)."""
    return (str(data[0]), *(_returns_from(x) if isinstance(x, list | tuple) else int(x) for x in data[1:]))
