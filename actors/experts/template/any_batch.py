"""Models at any batch size (issue 38 item 1: products, rows, convolutions, pools, every family).

The template's kernels are written for the reference's input shapes: every size is a constant.
Users call a model at other batch sizes first of all, and for most models the batch is the only
size that can change (the others are fixed by the weights). So ``analyse`` lowers the reference a
second time with one of its sizes set to another value (:func:`find`: a module-level integer that
``get_inputs`` alone reads, as the evaluator's held-out shapes move; one named like a batch first):
where the plan is the same but for the sizes, each input moves in one dimension or not at all and
no parameter moves, every dimension that moved is ``c`` times that size (``Plan.batch``).

``render`` then renders the plan once more with those dimensions symbolic (:class:`Sym`, an ``int``
whose text is an expression in ``kf_B``, the size at run time): the writers compute as they always
do, and what they print (masks, index arithmetic, grids, buffer shapes) comes out as expressions of
``kf_B`` instead of numbers. The copies take ``kf_B`` as their first argument, and ``forward`` calls
them, through ``ModelNew._kf_any_batch``, for inputs that differ from the reference's in that size
alone. Block sizes and every other tuning choice stay those of the reference's shapes.

Whether the copies hold at every size is checked where they are made: the plan is rendered at two
values (the reference's and an odd one about three times larger) and must come out as the same
text. A size that a writer turned into a plain number, a decision it took on the value (a block
as long as a reduction over the batch, a mask left out where the size divided a block): each makes
the two texts differ, and then the model has no any-batch path (``forward`` refuses other shapes,
naming the dimension, as before). Offsets are 64-bit in the copies (the size has no upper bound).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from actors.experts.template.ir import FLOAT_ARG, Arg, Node, NodeKind, Plan

NAME = "kf_B"
"""The run-time batch size: the any-batch kernels' first argument, a local of ``_kf_any_batch``."""
METHOD = "_kf_any_batch"
"""The ``ModelNew`` method that runs the any-batch kernels."""
SUFFIX = "_b"
"""Appended to each any-batch kernel's name."""


def _affine_text(a: int, b: int) -> str:
    term = NAME if a == 1 else f"{NAME} * {a}"
    if not b:
        return term if a == 1 else f"({term})"
    return f"({term} {'+' if b > 0 else '-'} {abs(b)})"


class Sym(int):
    """A size that moves with the batch: an ``int`` (its value at the batch being rendered, so the
    writers' arithmetic and decisions run as usual) whose text is an expression in ``kf_B``.
    Arithmetic with it gives another ``Sym`` (kept as ``a * kf_B + b`` while it is affine, so
    ``ceil(rows / 64)`` reads ``((kf_B + 63) // 64)``); ``str``, ``repr`` and f-strings give the
    expression."""

    expr: str
    affine: tuple[int, int] | None

    def __new__(cls, value: int, expr: str = "", affine: tuple[int, int] | None = None) -> Sym:
        obj = super().__new__(cls, value)
        obj.affine = affine
        obj.expr = _affine_text(*affine) if affine is not None else expr
        return obj

    def __repr__(self) -> str:
        return self.expr

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self.expr

    def _op(self, other: Any, sym: str, reflected: bool = False) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        x, y = (other, self) if reflected else (self, other)
        value = _APPLY[sym](int(x), int(y))
        fx, fy = _form(x), _form(y)
        if fx is not None and fy is not None:
            (a1, b1), (a2, b2) = fx, fy
            form = None
            if sym == "+":
                form = (a1 + a2, b1 + b2)
            elif sym == "-":
                form = (a1 - a2, b1 - b2)
            elif sym == "*" and (a1 == 0 or a2 == 0):
                form = (a1 * b2 + a2 * b1, b1 * b2)
            elif sym == "//" and a2 == 0 and b2 == 1:
                form = (a1, b1)
            if form is not None:
                return Sym(value, affine=form) if form[0] else form[1]
        if (fy == (0, 1) and sym in ("*", "//")) or (fy == (0, 0) and sym in ("+", "-")):
            return x  # the identities keep the text short
        if (fx == (0, 1) and sym == "*") or (fx == (0, 0) and sym == "+"):
            return y
        return Sym(value, f"({_text(x)} {sym} {_text(y)})")

    def __add__(self, other: Any) -> Any:
        return self._op(other, "+")

    def __radd__(self, other: Any) -> Any:
        return self._op(other, "+", reflected=True)

    def __sub__(self, other: Any) -> Any:
        return self._op(other, "-")

    def __rsub__(self, other: Any) -> Any:
        return self._op(other, "-", reflected=True)

    def __mul__(self, other: Any) -> Any:
        return self._op(other, "*")

    def __rmul__(self, other: Any) -> Any:
        return self._op(other, "*", reflected=True)

    def __floordiv__(self, other: Any) -> Any:
        return self._op(other, "//")

    def __rfloordiv__(self, other: Any) -> Any:
        return self._op(other, "//", reflected=True)

    def __mod__(self, other: Any) -> Any:
        return self._op(other, "%")

    def __rmod__(self, other: Any) -> Any:
        return self._op(other, "%", reflected=True)

    def __neg__(self) -> Any:
        return 0 - self

    def __truediv__(self, other: Any) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return Quotient(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return Quotient(other, self)


_APPLY: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
}


def _form(value: int) -> tuple[int, int] | None:
    """``(a, b)`` where ``value`` is ``a * kf_B + b`` (a plain number: ``(0, value)``), else None."""
    if isinstance(value, Sym):
        return value.affine
    return (0, int(value))


def _text(value: int) -> str:
    return value.expr if isinstance(value, Sym) else repr(int(value))


class SymFloat(float):
    """A float constant that moves with the sizes (a mean's divisor over the batch): a ``float``
    worth its value at the sizes being rendered whose text (``lit``) is ``size_expr * 1.0``
    (``(kf_B * 4096.0)``), an exact product in float32 as the literal it stands for would be.
    Arithmetic on it gives a plain float, whose number then differs between the two renderings:
    the check of :func:`check_texts` refuses the path rather than keep a folded number."""

    expr: str

    def __new__(cls, value: float, expr: str) -> SymFloat:
        obj = super().__new__(cls, value)
        obj.expr = expr
        return obj


class Quotient(float):
    """``a / b`` of sizes, one of them symbolic: a ``float`` whose ``math.ceil`` and ``math.floor``
    are symbolic again (a grid of ``ceil(rows / BLOCK)`` programs)."""

    num: int
    den: int

    def __new__(cls, num: int, den: int) -> Quotient:
        obj = super().__new__(cls, int(num) / int(den))
        obj.num, obj.den = num, den
        return obj

    def __ceil__(self) -> Any:
        return (self.num + self.den - 1) // self.den

    def __floor__(self) -> Any:
        return self.num // self.den


def symbolic(plan: Plan, batch: int) -> Plan:
    """``plan`` with every batch-linked dimension a :class:`Sym` worth its size at ``batch``, and
    every batch-linked constant a :class:`SymFloat`."""

    def dim(d: int, c: int) -> int:
        return Sym(c * batch, affine=(c, 0)) if c else d

    def arg(a: Arg, c: int) -> Arg:
        return SymFloat(float(c * batch), f"({NAME} * {float(c)!r})") if c else a

    consts = plan.batch_args or tuple(() for _ in plan.nodes)
    nodes = tuple(
        replace(
            node,
            shape=tuple(dim(d, c) for d, c in zip(node.shape, links, strict=True)),
            args=tuple(arg(a, c) for a, c in zip(node.args, cs, strict=True)) if cs else node.args,
        )
        for node, links, cs in zip(plan.nodes, plan.batch, consts, strict=True)
    )
    return replace(plan, nodes=nodes)


def reference_batch(plan: Plan) -> int:
    """The batch size the plan was traced at."""
    for node, links in zip(plan.nodes, plan.batch, strict=True):
        for d, c in zip(node.shape, links, strict=True):
            if c:
                return int(d) // c
    raise ValueError("the plan has no batch-linked dimension")


def leading_input(plan: Plan) -> tuple[int, int]:
    """The position (in ``forward``'s arguments) of the first input that moves with the batch, and
    its dimension that does (0)."""
    for node in plan.inputs:
        links = plan.batch[node.id]
        if node.path != FLOAT_ARG and 1 in links:
            return node.index, links.index(1)
    raise ValueError("no input moves with the batch")


PROBE_LIMIT_S = 5.0
"""A reference whose lowering took longer (CPU seconds of the analysing thread: waiting for a busy
host's cores does not count) is not lowered again to find its batch (a recurrent
model unrolled over a long sequence: the second lowering would double an analysis of tens of
seconds, the loop's first candidate waits on it)."""
PROBES = 2
"""Sizes tried at most (those named like a batch first)."""
PROBE_BUDGET_S = 10.0
"""No further lowering is started after this long in :func:`find` (CPU seconds of the analysing
thread, as :data:`PROBE_LIMIT_S`: a wall-clock budget ran out on a host busy starting a run, and
KernelBench L3-6's first candidate on a fresh H100 machine got no any-batch copies, which the
same analysis on an idle host gives it)."""


Links = tuple[tuple[int, ...], ...]
"""Per node, per dimension (or per argument): its multiple of the batch, or 0."""


@dataclass(frozen=True)
class Found:
    """What :func:`find` found: ``Plan.batch``, ``Plan.batch_args`` and ``Plan.batch_name``."""

    dims: Links = ()
    args: Links = ()
    name: str = ""
    least: int = 1
    """The smallest batch the reference takes (2 where it refuses 1: batch norm's statistics)."""


def find(
    source_sizes: dict[str, int],
    plan: Plan,
    relower: Callable[[dict[str, int]], Plan],
    lowering_s: float = 0.0,
    outputs_at: Callable[[dict[str, int]], list[tuple[int, ...]]] | None = None,
) -> Found:
    """``Plan.batch`` for ``plan`` and the batch's name: the reference's sizes that ``get_inputs``
    alone reads (``source_sizes``; those named like a batch first, :data:`PROBES` at most) are each
    set to a value next to it in turn and the reference lowered again (``relower``). The first for
    which the plan is the same but for sizes, each input moving with it in its dimension 0 or not
    at all and no parameter moving, gives each dimension's multiple of the batch, once the
    reference's outputs (``outputs_at``: their shapes from a forward on the meta device) have the
    shapes that predicts at a batch of one and at one about twice the reference's; float constants
    that are the same multiple of the batch in both lowerings move with it too. Empty where none
    does, or where the first lowering took ``lowering_s`` over :data:`PROBE_LIMIT_S`."""
    if lowering_s > PROBE_LIMIT_S or not any(n.path != FLOAT_ARG for n in plan.inputs):
        return Found()
    names = sorted(source_sizes, key=lambda name: "batch" not in name.lower())[:PROBES]
    deadline = time.thread_time() + PROBE_BUDGET_S
    for name in names:
        b0 = source_sizes[name]
        # near values: a lowering that picks its form by size (a reduction split for more programs
        # below some row count) keeps it; below first, where sizes are powers of two
        for b1 in (b0 - 1, b0 + 1) if b0 > 2 else (b0 + 1,):
            if time.thread_time() > deadline:
                return Found()
            try:
                other = relower({name: b1})
            except Exception:  # noqa: BLE001 - the reference refuses that size: not this one
                break
            linked = _links(plan, other, b0, b1)
            if linked is None:
                continue
            links, consts = linked
            least = 1 if outputs_at is None else _outputs_hold(plan, links, name, b0, outputs_at)
            if least is None:
                break
            return Found(links, consts if any(any(c) for c in consts) else (), name, least)
    return Found()


def _outputs_hold(
    plan: Plan,
    links: tuple[tuple[int, ...], ...],
    name: str,
    b0: int,
    outputs_at: Callable[[dict[str, int]], list[tuple[int, ...]]],
) -> int | None:
    """The smallest batch the reference takes, where its outputs have the shapes ``links`` predicts
    at it (a batch of one, or of two where it refuses one: batch norm in training mode) and at
    ``2 * b0 + 1``; None where they do not."""
    least = None
    for small in (1, 2):
        if small >= b0:  # the reference's own batch is the smallest it was seen to take
            least = b0
            break
        try:
            if outputs_at({name: small}) != _predicted(plan, links, small):
                return None
        except Exception:  # noqa: BLE001 - the reference refuses that batch: try the next
            continue
        least = small
        break
    if least is None:
        return None
    try:
        if outputs_at({name: 2 * b0 + 1}) != _predicted(plan, links, 2 * b0 + 1):
            return None
    except Exception:  # noqa: BLE001 - the reference refuses that batch: no path that takes it
        return None
    return least


def _predicted(plan: Plan, links: Links, value: int) -> list[tuple[int, ...]]:
    """The output shapes ``links`` predicts at batch ``value``."""
    return [
        tuple(c * value if c else d for d, c in zip(plan.nodes[nid].shape, links[nid], strict=True))
        for nid in plan.outputs
    ]


def _constants(a: Node, b: Node, b0: int, b1: int) -> tuple[int, ...] | None:
    """Per argument of ``a`` (at batch ``b0``) and ``b`` (the same node at ``b1``): 0 where they
    are the same, ``c`` where both are float constants ``c`` times their batch (``c`` a whole
    number), None where they differ otherwise."""
    if len(a.args) != len(b.args):
        return None
    out: list[int] = []
    for x, y in zip(a.args, b.args, strict=True):
        if type(x) is type(y) and x == y:
            out.append(0)
            continue
        if not (isinstance(x, float) and isinstance(y, float)):
            return None
        c = x / b0
        if c != y / b1 or c < 1 or c != int(c):
            return None
        out.append(int(c))
    return tuple(out)


def _links(plan: Plan, other: Plan, b0: int, b1: int) -> tuple[Links, Links] | None:
    """Each dimension's multiple of the batch, and each float constant's, where ``other`` (traced
    at ``b1``) is ``plan`` (at ``b0``) but for sizes and such constants; None where it is not, or
    where an input moves other than in one dimension, as the batch itself (a weight passed as an
    input stays as it is)."""
    if len(plan.nodes) != len(other.nodes) or plan.outputs != other.outputs or plan.returns != other.returns:
        return None
    if plan.output_strides != other.output_strides or plan.init_source != other.init_source:
        return None
    out: list[tuple[int, ...]] = []
    consts: list[tuple[int, ...]] = []
    for a, b in zip(plan.nodes, other.nodes, strict=True):
        if replace(a, shape=(), args=()) != replace(b, shape=(), args=()) or len(a.shape) != len(b.shape):
            return None
        moved = _constants(a, b, b0, b1)
        if moved is None:
            return None
        consts.append(moved)
        dims: list[int] = []
        for da, db in zip(a.shape, b.shape, strict=True):
            if da == db:
                dims.append(0)
                continue
            if da % b0 or db % b1 or da // b0 != db // b1:
                return None
            dims.append(da // b0)
        if a.kind is NodeKind.PARAM and any(dims):
            return None
        if a.kind is NodeKind.INPUT and any(dims) and (dims[0] != 1 or any(dims[1:])):
            # an input moves with the batch in its dimension 0 alone, or not at all: a size of
            # another dimension (a length a pool or a strided convolution reads in windows) can
            # leave a result's size the same at the sizes next to it and change it further away
            return None
        out.append(tuple(dims))
    if not any(any(out[n.id]) for n in plan.inputs):
        return None
    return tuple(out), tuple(consts)


def sized(plan: Plan) -> bool:
    """Whether a plan's shapes hold symbolic sizes (the writers then always take 64-bit offsets:
    the batch, and with it every size, has no upper bound)."""
    return any(isinstance(d, Sym) for node in plan.nodes for d in node.shape)


_DEF = re.compile(r"^def (\w+)\(", re.M)


def batched_source(source: str, names: dict[str, str], variables: tuple[str, ...] = (NAME,)) -> str:
    """A kernel's source with ``variables`` (``kf_B``, or the any-size copies' ``kf_<size>``) as its
    first parameters and every kernel renamed (``names``). They are not specialised on (Triton
    would compile a batch of 1, and batches divisible by 16, apart): one compile serves every size,
    at a user's first call and in the evaluator's compile stage, which compiles the copies at each
    held-out shape."""
    listed = ", ".join(f'"{v}"' for v in variables)
    source = source.replace("@triton.jit\n", f"@triton.jit(do_not_specialize=[{listed}])\n", 1)
    source = _DEF.sub(lambda m: f"def {m.group(1)}({', '.join(variables)}, ", source, count=1)
    return renamed(source, names)


_WORD = re.compile(r"\b[A-Za-z_]\w*\b")


def renamed(source: str, names: Mapping[str, str]) -> str:
    """``source`` with every identifier that ``names`` maps replaced, in one pass (each identifier
    looked up). A pattern per name compiled for every kernel was 49 of 51 s of one rendering of
    KernelBench L3-15 (543 kernels in each of two probes' copies, each searched for every name)."""
    return _WORD.sub(lambda m: names.get(m.group(0), m.group(0)), source) if names else source


def guard(first: str, rank: int, dim: int, least: int = 1) -> list[str]:
    """The any-batch method's first lines: the batch from its leading input's dimension ``dim``,
    and a clear refusal of a batch of 0 (the kernels' grids start at one program), or below
    ``least`` where the reference itself refuses it."""
    lines = [
        f"{NAME} = {first}.shape[{dim}] if isinstance({first}, torch.Tensor) and {first}.dim() == {rank} else -1",
        f"if {NAME} == 0:\n"
        f'    raise ValueError("{first} has a batch of 0: this ModelNew\'s kernels take a batch of at least 1")',
    ]
    if least > 1:
        lines.append(
            f"if 0 < {NAME} < {least}:\n"
            f'    raise ValueError(f"{first} has a batch of {{{NAME}}}: the reference refuses a batch below {least} '
            f'(its forward raised at a batch of 1), and so does this ModelNew")'
        )
    return lines


def check_texts(texts: list[str]) -> bool:
    """Whether the renderings at different batch sizes came out the same (see the module's doc)."""
    return len(set(texts)) == 1 and NAME in texts[0]


def probe_batches(plan: Plan) -> tuple[int, int]:
    """The two batch sizes the any-batch copies are rendered at: the reference's, and an odd one
    about three times larger (a decision on the batch's value, or a size printed as a number,
    differs between them)."""
    b0 = reference_batch(plan)
    return b0, 3 * b0 + 2 if b0 % 2 else 3 * b0 + 1
