"""Models at any size of their inputs: the batch and the image sizes, lengths and widths alike
(issue 38 item 1; ``any_batch.py`` moves the batch alone).

The task's free sizes (module-level integers only ``get_inputs`` reads, as the evaluator's
held-out shapes move) are each moved alone by one and by two and the reference lowered again
(:func:`find`). Where every lowering is the plan but for sizes, every dimension (and every float
constant that moved: a mean's divisor) is fitted as ``c * (a1 * s1 + b1) * (a2 * s2 + b2) ...``,
one affine factor per size it follows: the batch (``B``), a same-padded convolution's output
(``H``), an unpadded one's (``H - 2``), a flattened image (``C * (H - 2) * (W - 2)``). A strided
window's output (``(H - 3) // 2 + 1``) is a floor factor, ``(a * s + b) // q``: two steps do not
show it, so where the plan has strided windows and the affine fit fails or does not hold, every
size is moved over two periods of the windows' strides multiplied (:func:`period_bound`, where
those lowerings fit in :data:`FLOOR_BUDGET_S`) and fitted again. The fit is
checked by lowering the reference at two further sets of sizes, every size moved at once, where
every node must have exactly the predicted shape, and the reference's outputs too (on the meta
device). Parameters never move, and each size must be some input's dimension as it is. A
lowering that chooses by size (a reduction over few huge rows split in parts) is fitted as the
reference lowered without that choice (``render._size_links``, ``Sizes.plan``).

``render`` then writes the plan's kernels once more with those dimensions as :class:`SymN`
(an ``int`` whose text is the fitted expression of ``kf_<size>``, the sizes at run time) and keeps
them only where two renderings, at the reference's sizes and at distinct sizes none of which is
any other size or dimension of the plan, come out as the same text (any decision a writer took on
a value, or a size printed as a number, makes them differ). A choice that only changes speed (a
spatial sum fused into its convolution, a split-K's halving) is taken at the task's own sizes in
every rendering (:func:`at_task`), with kernels correct at every size (the images a tile spans
counted at run time). ``ModelNew._kf_any_sizes`` reads the
sizes from the inputs, refuses sizes for which a factor would be below one (the reference refuses
them too) or below the smallest the reference takes, and checks every input's whole shape.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from actors.experts.template.any_batch import _APPLY, Sym, SymFloat, _text
from actors.experts.template.ir import FLOAT_ARG, Arg, ConvSpec, Node, NodeKind, Plan, PoolSpec
from actors.experts.template.size_fits import Fit, Sizes, _affine

METHOD = "_kf_any_sizes"
"""The ``ModelNew`` method that runs the any-size kernels."""
SUFFIX = "_s"
"""Appended to each any-size kernel's name."""
MAX_SIZES = 4
"""Free sizes moved at most (the lowerings needed grow with them)."""
PROBE_LIMIT_S = 2.0
"""A reference whose first lowering took longer (CPU seconds) is not lowered again here."""
BUDGET_S = 15.0
"""No further lowering is started after this long in :func:`find` (CPU seconds of the analysing
thread: waiting for a busy host's cores does not count, as for ``any_batch.PROBE_BUDGET_S``)."""
FLOOR_BUDGET_S = 3.0
"""The most the lowerings that look for floor factors may take (estimated from the first ones)."""
MAX_PERIOD = 32
"""The longest period of a floor factor looked for (five stride-2 windows): a size the affine fit
does not explain is moved by up to twice that, one lowering per step."""


class Decided(Exception):
    """A writer compared a size that moves with the task's sizes with another (``<``, ``>``):
    a kernel chosen by such a comparison holds on one side of it only, so there is no any-size
    path (two renderings could both fall on the same side)."""


Linear = tuple[tuple[tuple[str, int], ...], int]
"""``((variable, coefficient), ...), constant``: an expression linear in the size variables."""


class SymN(Sym):
    """A size that moves with several of the task's sizes: an ``int`` worth its value at the sizes
    being rendered, whose text is an expression of them (:class:`Fit`). Arithmetic gives another
    :class:`SymN` whose text records it (the writers compute with it as with a number), linear in
    the variables (:attr:`lin`) while it stays so.

    Comparisons are where a writer decides on a value, which a kernel for every size must not.
    Between two linear expressions of the same variables with the same coefficients the answer
    is the same at every size and is given (a window's last tap against the input's length); any
    other ordering raises :class:`Decided`. Equality holds only between the same expression (a
    size that moves is never a given number: ``inner == 1`` is false, and the general form is
    written). A choice that only changes speed reads :attr:`task` (:func:`at_task`), the same in
    every rendering."""

    lin: Linear | None
    task: int
    """Its value at the task's own sizes."""

    def __new__(cls, value: int, expr: str = "", affine: tuple[int, int] | None = None) -> SymN:
        obj = int.__new__(cls, value)
        obj.affine = None
        obj.expr = expr
        obj.lin = None
        obj.task = value
        return obj

    @classmethod
    def linear(cls, value: int, expr: str, lin: Linear | None, task: int | None = None) -> SymN:
        """A size whose expression is ``lin`` (``None``: not linear), worth ``task`` at the task's
        sizes (``value`` where not given)."""
        obj = cls(value, expr)
        obj.lin = lin
        obj.task = value if task is None else task
        return obj

    def _op(self, other: Any, sym: str, reflected: bool = False) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        x, y = (other, self) if reflected else (self, other)
        value = _APPLY[sym](int(x), int(y))
        if not isinstance(y, Sym) and ((sym in ("*", "//") and int(y) == 1) or (sym in ("+", "-") and int(y) == 0)):
            return x
        if not isinstance(x, Sym) and ((sym == "*" and int(x) == 1) or (sym == "+" and int(x) == 0)):
            return y
        task = _APPLY[sym](at_task(x), at_task(y))
        return SymN.linear(value, f"({_text(x)} {sym} {_text(y)})", _combine(_lin(x), _lin(y), sym), task)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, int) or isinstance(other, bool):
            return False
        if isinstance(other, Sym) and other.expr == self.expr:
            return True
        mine, theirs = self.lin, _lin(other)
        return mine is not None and theirs is not None and mine == theirs

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.expr)

    def _order(self, other: object, sym: str) -> bool:
        theirs = _lin(other) if isinstance(other, int) and not isinstance(other, bool) else None
        if self.lin is not None and theirs is not None and self.lin[0] == theirs[0]:
            a, b = self.lin[1], theirs[1]
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[sym]
        raise Decided(f"{self.expr} compared with {other!r}")

    def __lt__(self, other: object) -> bool:
        return self._order(other, "<")

    def __le__(self, other: object) -> bool:
        return self._order(other, "<=")

    def __gt__(self, other: object) -> bool:
        return self._order(other, ">")

    def __ge__(self, other: object) -> bool:
        return self._order(other, ">=")


def at_task(x: int) -> int:
    """``x`` at the task's own sizes: for a choice that only changes speed (a kernel correct on
    either side of it), taken alike in every rendering of an any-size copy."""
    return x.task if isinstance(x, SymN) else int(x)


def _lin(x: int) -> Linear | None:
    """``x`` as a linear expression (a plain number: no variables)."""
    if isinstance(x, SymN):
        return x.lin
    if isinstance(x, Sym):
        return None
    return ((), int(x))


def _combine(a: Linear | None, b: Linear | None, sym: str) -> Linear | None:
    """The linear form of ``a sym b`` (``None`` where it is not linear)."""
    if a is None or b is None:
        return None
    if sym in ("+", "-"):
        sign = 1 if sym == "+" else -1
        coef = dict(a[0])
        for var, c in b[0]:
            coef[var] = coef.get(var, 0) + sign * c
        return tuple(sorted((v, c) for v, c in coef.items() if c)), a[1] + sign * b[1]
    if sym == "*" and (not a[0] or not b[0]):
        k, form = (a[1], b) if not a[0] else (b[1], a)
        return tuple((v, k * c) for v, c in form[0] if k * c), k * form[1]
    return None


def _fit(d0: int, moved: Sequence[Sequence[int]], s0: tuple[int, ...]) -> Fit | None:
    """The fit of a quantity worth ``d0`` at ``s0`` and ``moved[i] = (at s_i + 1, at s_i + 2, ...)``
    with size ``i`` moved alone; None where it is not of the product form. A size it follows
    affinely gives an affine factor (two steps show it); one it follows by a strided window's
    floor gives a floor factor, seen over two of its periods (:func:`_floor_factor`)."""
    factors: list[tuple[int, int, int]] = []
    floors: list[tuple[int, int, int, int]] = []
    common: list[int] = []  # per moving size, what the quantity is a multiple of
    for i, seq in enumerate(moved):
        vals = [d0, *seq]
        if all(v == d0 for v in vals):
            continue
        alpha = vals[1] - d0
        if alpha and all(v == d0 + alpha * t for t, v in enumerate(vals)):
            beta = d0 - alpha * s0[i]
            g = math.gcd(alpha, beta) * (1 if alpha > 0 else -1)
            factors.append((i, alpha // g, beta // g))
            common.append(g)
            continue
        floor = _floor_factor(vals, s0[i])
        if floor is None:
            return None
        (a, b, q), k = floor
        floors.append((i, a, b, q))
        common.append(k)
    if not common:
        return Fit(scale=d0)
    scale_num = math.prod(common)
    scale_den = d0 ** (len(common) - 1)
    if scale_den == 0 or scale_num % scale_den:
        return None
    fit = Fit(scale_num // scale_den, tuple(factors), tuple(floors))
    return fit if fit.scale > 0 and fit.at(s0) == d0 else None


def _floor_factor(vals: list[int], s: int) -> tuple[tuple[int, int, int], int] | None:
    """``((a, b, q), k)`` with ``vals[t] == k * ((a * (s + t) + b) // q)`` for every ``t`` and the
    smallest period ``q`` (at least 2) that ``vals`` shows twice, or None."""
    if min(vals) <= 0:
        return None
    k = math.gcd(*vals)
    f = [v // k for v in vals]
    for q in range(2, (len(f) - 1) // 2 + 1):
        a = f[q] - f[0]
        if a <= 0 or f[2 * q] - f[q] != a:
            continue
        lo = max(q * v - a * (s + t) for t, v in enumerate(f))
        hi = min(q * v - a * (s + t) + q - 1 for t, v in enumerate(f))
        if lo <= hi and all((a * (s + t) + lo) // q == v for t, v in enumerate(f)):
            return (a, lo, q), k
    return None


def period_bound(plan: Plan) -> int:
    """How far a size must move to show the longest period a dimension can have in its floor: the
    strides of the plan's strided windows (convolutions and pools) multiplied, at most
    :data:`MAX_PERIOD` (1 where no window is strided: affine fits only)."""
    bound = 1
    for node in plan.nodes:
        if node.kind is NodeKind.CONV:
            spec = ConvSpec.from_attrs(node.attrs)
            stride = 1 if spec.transposed else max(spec.stride, default=1)
        elif node.kind is NodeKind.POOL:
            stride = max(PoolSpec.from_attrs(node.attrs).stride, default=1)
        else:
            continue
        bound = min(bound * max(stride, 1), MAX_PERIOD)
    return bound


def _same_but_sizes(a: Node, b: Node) -> bool:
    """Whether two lowerings' nodes are the same op on the same operands (sizes and float
    constants may differ)."""
    if replace(a, shape=(), args=()) != replace(b, shape=(), args=()) or len(a.shape) != len(b.shape):
        return False
    if len(a.args) != len(b.args):
        return False
    return all(
        (type(x) is type(y) and x == y) or (isinstance(x, float) and isinstance(y, float))
        for x, y in zip(a.args, b.args, strict=True)
    )


def find(
    source_sizes: Mapping[str, int],
    plan: Plan,
    relower: Callable[[dict[str, int]], Plan],
    outputs_at: Callable[[dict[str, int]], list[tuple[int, ...]]],
    lowering_s: float = 0.0,
) -> Sizes:
    """``Plan.sizes`` (see the module's doc), or an empty :class:`Sizes` where the plan does not
    follow the task's sizes in that form, or where the first lowering took ``lowering_s`` over
    :data:`PROBE_LIMIT_S`."""
    if lowering_s > PROBE_LIMIT_S or not source_sizes or len(source_sizes) > MAX_SIZES:
        return Sizes()
    if not any(n.path != FLOAT_ARG for n in plan.inputs):
        return Sizes()
    names = tuple(source_sizes)
    s0 = tuple(int(source_sizes[n]) for n in names)
    deadline = time.thread_time() + BUDGET_S
    probes: list[list[Plan]] = [[] for _ in names]  # per size, the plans at s + 1, s + 2, ...

    def probe(i: int, upto: int) -> bool:
        """Lower with size ``i`` moved by each step up to ``upto``; False where the reference
        refuses a size, lowers to another plan, or the budget ends."""
        while len(probes[i]) < upto:
            if time.thread_time() > deadline:
                return False
            try:
                other = relower({names[i]: s0[i] + len(probes[i]) + 1})
            except Exception:  # noqa: BLE001 - the reference refuses that size: no path
                return False
            if not _same_plan(plan, other):
                return False
            probes[i].append(other)
        return True

    started = time.thread_time()
    for i in range(len(names)):
        if not probe(i, 2):
            return Sizes()
    each_s = (time.thread_time() - started) / (2 * len(names))  # warm: the first lowering paid the imports
    # Two steps show an affine size. A strided window's floor may stay put over them (a pool of
    # 11 at 2048 is 186 up to 2056) or move unevenly: where the plan has strided windows and the
    # fits fail, or do not hold at the check points, every size is moved over two of the longest
    # period its windows allow, and fitted again, where those lowerings fit in FLOOR_BUDGET_S (a
    # small model's: a deep network's lowerings would hold up the first candidate).
    longest = 2 * period_bound(plan)
    for attempt in (0, 1):
        if attempt:
            if longest <= 2 or each_s * (longest - 2) * len(names) > FLOOR_BUDGET_S:
                return Sizes()
            if not all(probe(i, longest) for i in range(len(names))):
                return Sizes()
        fitted = _fits(plan, probes, s0)
        if fitted is None:
            continue
        dims, args = fitted
        found = Sizes(names, s0, tuple(dims), tuple(args) if any(any(a) for a in args) else ())
        if not _bare(plan, found):
            return Sizes()
        if all(time.thread_time() <= deadline and _holds(plan, found, p, relower, outputs_at) for p in _checks(s0)):
            break
    else:
        return Sizes()
    return replace(found, least=_least(found, outputs_at))


def _same_plan(plan: Plan, other: Plan) -> bool:
    """Whether ``other`` is ``plan`` lowered at other sizes: the same ops on the same operands."""
    if len(other.nodes) != len(plan.nodes) or other.outputs != plan.outputs or other.returns != plan.returns:
        return False
    if other.init_source != plan.init_source or other.output_strides != plan.output_strides:
        return False
    return all(_same_but_sizes(a, b) for a, b in zip(plan.nodes, other.nodes, strict=True))


def _fits(
    plan: Plan, probes: list[list[Plan]], s0: tuple[int, ...]
) -> tuple[list[tuple[Fit | None, ...]], list[tuple[Fit | None, ...]]] | None:
    """Every dimension's fit and every moving float constant's, from the plans at each size's
    steps; None where one has none (or a parameter moves)."""
    dims: list[tuple[Fit | None, ...]] = []
    args: list[tuple[Fit | None, ...]] = []
    for k, node in enumerate(plan.nodes):
        row: list[Fit | None] = []
        for j, d0 in enumerate(node.shape):
            fit = _fit(int(d0), [[int(p.nodes[k].shape[j]) for p in seen] for seen in probes], s0)
            if fit is None:
                return None
            row.append(fit if fit.moves else None)
        if node.kind is NodeKind.PARAM and any(row):
            return None
        dims.append(tuple(row))
        consts: list[Fit | None] = []
        for j, x in enumerate(node.args):
            moved = [[float(p.nodes[k].args[j]) for p in seen] for seen in probes]
            if not isinstance(x, float) or all(y == x for seq in moved for y in seq):
                consts.append(None)
                continue
            if x != int(x) or any(y != int(y) for seq in moved for y in seq):
                return None
            fit = _fit(int(x), [[int(y) for y in seq] for seq in moved], s0)
            if fit is None or not fit.moves:
                return None
            consts.append(fit)
        args.append(tuple(consts))
    return dims, args


def _bare(plan: Plan, found: Sizes) -> bool:
    """Whether every size is some input's dimension as it is, and every input dimension that moves
    is of one size (the run-time sizes are read from there)."""
    bare: set[int] = set()
    for node in plan.inputs:
        for fit in found.dims[node.id]:
            if fit is None:
                continue
            if fit.scale == 1 and len(fit.factors) == 1 and fit.factors[0][1:] == (1, 0) and not fit.floors:
                bare.add(fit.factors[0][0])
    return bare == set(range(len(found.names)))


def _checks(s0: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Two sets of sizes, every size moved at once: larger (odd, about twice) and smaller (about
    three quarters, odd), each value distinct from the others."""
    large = tuple(2 * s + 1 + 2 * i for i, s in enumerate(s0))
    small = tuple(max(1, (3 * s // 4) | 1) for s in s0)
    return [large, small] if small != s0 else [large]


def _holds(
    plan: Plan,
    found: Sizes,
    point: tuple[int, ...],
    relower: Callable[[dict[str, int]], Plan],
    outputs_at: Callable[[dict[str, int]], list[tuple[int, ...]]],
) -> bool:
    """Whether the reference lowered at ``point`` has exactly the shapes (and constants) the fits
    predict, and its outputs too."""
    changed = dict(zip(found.names, point, strict=True))
    try:
        other = relower(changed)
        outs = outputs_at(changed)
    except Exception:  # noqa: BLE001 - the reference refuses these sizes: the fit is not checked
        return False
    if len(other.nodes) != len(plan.nodes):
        return False
    for k, (a, b) in enumerate(zip(plan.nodes, other.nodes, strict=True)):
        if not _same_but_sizes(a, b):
            return False
        if tuple(b.shape) != _at(a.shape, found.dims[k], point):
            return False
        for j, x in enumerate(a.args):
            fit = found.args[k][j] if found.args else None
            if isinstance(x, float) and b.args[j] != (float(fit.at(point)) if fit is not None else x):
                return False
    return outs == [_at(plan.nodes[o].shape, found.dims[o], point) for o in plan.outputs]


def _at(shape: tuple[int, ...], fits: tuple[Fit | None, ...], point: tuple[int, ...]) -> tuple[int, ...]:
    """A shape at ``point`` by its fits."""
    return tuple(fit.at(point) if fit is not None else d for d, fit in zip(shape, fits, strict=True))


def _least(found: Sizes, outputs_at: Callable[[dict[str, int]], list[tuple[int, ...]]]) -> tuple[int, ...]:
    """Per size, 1 where the reference takes it (the others as they are), else 2 (batch norm's
    statistics refuse one value per channel); a size whose factors need more is bounded by the
    factors' own check at run time."""
    out = []
    for name in found.names:
        try:
            outputs_at({name: 1})
            out.append(1)
        except Exception:  # noqa: BLE001 - the reference refuses 1 there
            out.append(2)
    return tuple(out)


def symbolic(plan: Plan, found: Sizes, point: tuple[int, ...]) -> Plan:
    """``plan`` with every fitted dimension a :class:`SymN` worth its value at ``point``, and every
    fitted constant an ``any_batch.SymFloat``."""
    names = found.variables

    def arg(a: Arg, fit: Fit | None) -> Arg:
        return SymFloat(float(fit.at(point)), f"({fit.text(names)} * 1.0)") if fit is not None else a

    def dim(d: int, fit: Fit | None) -> int:
        if fit is None:
            return d
        lin: Linear | None = None
        if len(fit.factors) == 1 and not fit.floors:
            i, a, b = fit.factors[0]
            lin = (((names[i], fit.scale * a),), fit.scale * b)
        return SymN.linear(fit.at(point), fit.text(names), lin, fit.at(found.values))

    nodes = []
    for k, node in enumerate(plan.nodes):
        shape = tuple(dim(d, fit) for d, fit in zip(node.shape, found.dims[k], strict=True))
        consts = found.args[k] if found.args else ()
        args = tuple(arg(a, f) for a, f in zip(node.args, consts, strict=True)) if consts else node.args
        nodes.append(replace(node, shape=shape, args=args))
    return replace(plan, nodes=tuple(nodes))


def probe_points(plan: Plan, found: Sizes) -> list[tuple[int, ...]]:
    """The two sets of sizes the copies are rendered at: the reference's, and one where every size
    is odd, about three times larger, and differs from every other size and from every constant
    dimension of the plan (a writer that took a decision on two values being equal shows it)."""
    taken = {int(d) for node in plan.nodes for d in node.shape}
    other: list[int] = []
    for s in found.values:
        v = (3 * s + 1) | 1
        while v in taken or v in other:
            v += 2
        other.append(v)
    return [found.values, tuple(other)]


def check_texts(texts: list[str], found: Sizes) -> bool:
    """Whether the renderings at the probe points came out the same, naming every size."""
    return len(set(texts)) == 1 and all(v in texts[0] for v in found.variables)


def guard(plan: Plan, found: Sizes) -> list[str]:
    """The any-size method's first lines: each size read from an input dimension that is that size,
    then refused where a fitted factor would be below one or the size below the least the
    reference takes."""
    lines: list[str] = []
    names = plan.arg_names
    for i, var in enumerate(found.variables):
        node, dim = next(
            (n, j)
            for n in plan.inputs
            for j, fit in enumerate(found.dims[n.id])
            if fit is not None and fit.scale == 1 and fit.factors == ((i, 1, 0),) and not fit.floors
        )
        x = names[node.index]
        rank = len(node.shape)
        lines.append(f"{var} = {x}.shape[{dim}] if isinstance({x}, torch.Tensor) and {x}.dim() == {rank} else -1")
    factors = sorted(
        {(i, a, b) for row in found.dims for fit in row if fit is not None for (i, a, b) in fit.factors}
        | {(i, 1, 0) for i in range(len(found.names))}
    )
    conds = [f"{_affine(found.variables[i], a, b)} < 1" for i, a, b in factors]
    floors = sorted({f for row in found.dims for fit in row if fit is not None for f in fit.floors})
    conds += [f"{_affine(found.variables[i], a, b)} < {q}" for i, a, b, q in floors]  # a window past the image
    conds += [f"{var} < {least}" for var, least in zip(found.variables, found.least, strict=True) if least > 1]
    sizes = ", ".join(f"{name}={{{var}}}" for name, var in zip(found.names, found.variables, strict=True))
    lines.append(
        f"if {' or '.join(dict.fromkeys(conds))}:\n"
        f'    raise ValueError(f"sizes {sizes}: too small for this model (the reference refuses them too)")'
    )
    return lines
