"""Numeric constants of a kernel that may become run-time arguments (``share.py``'s ``constants``).

A whole model's kernels repeat with other sizes: DenseNet-121's dense layers differ in their input
channels, a ResNet's blocks in their widths and image sizes. Written as constants, each is a Triton
function of its own, compiled on its own (KernelBench L3-15: 714 functions, 20-26 s of compile on a
16-core host before its first verdict). Passed as arguments, kernels that differ only in such
constants are one function: compiled once per specialisation (Triton specialises an integer
argument on being 1 and on being a multiple of 16), at some cost in speed where a divisor or a
bound is no longer known to the compiler.

Only a constant whose value nowhere needs to be known when compiling may move: one that reaches,
through arithmetic, comparisons and names assigned from them, only what Triton takes at run time:
a pointer, mask or ``other`` of a load or store, the tensor operands of ``tl.where``, ``tl.dot``,
reductions and math functions, a ``range`` bound, the value cast by ``.to``. A constant inside
``tl.arange``, a shape, an axis, an ``if`` condition, a subscript, a tuple or any call not listed
here stays a constant (a kernel is then shared only with kernels where it has the same value).
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.task import parse_expression, parse_module

CONST_ARG = "kf_c"
"""Prefix of the run-time constant arguments of a shared kernel (``kf_c0``, ``kf_c1``...)."""

_ALL = frozenset(range(8))
_RUNTIME_POSITIONS: Mapping[str, frozenset[int]] = {
    "tl.load": frozenset({0}),
    "tl.store": frozenset({0, 1}),
    "tl.where": frozenset({0, 1, 2}),
    "tl.minimum": frozenset({0, 1}),
    "tl.maximum": frozenset({0, 1}),
    "tl.clamp": frozenset({0, 1, 2}),
    "tl.fma": frozenset({0, 1, 2}),
    "tl.dot": frozenset({0, 1, 2}),
    "tl.sum": frozenset({0}),
    "tl.max": frozenset({0}),
    "tl.min": frozenset({0}),
    "tl.argmax": frozenset({0}),
    "tl.argmin": frozenset({0}),
    "tl.cumsum": frozenset({0}),
    "tl.abs": frozenset({0}),
    "tl.exp": frozenset({0}),
    "tl.exp2": frozenset({0}),
    "tl.log": frozenset({0}),
    "tl.log2": frozenset({0}),
    "tl.sqrt": frozenset({0}),
    "tl.sqrt_rn": frozenset({0}),
    "tl.rsqrt": frozenset({0}),
    "tl.sigmoid": frozenset({0}),
    "tl.erf": frozenset({0}),
    "tl.cos": frozenset({0}),
    "tl.sin": frozenset({0}),
    "tl.floor": frozenset({0}),
    "tl.ceil": frozenset({0}),
    "tl.div_rn": frozenset({0, 1}),
    "tl.fdiv": frozenset({0, 1}),
    "tl.cdiv": frozenset({0, 1}),
    "tl.atomic_add": frozenset({0, 1}),
    "tl.atomic_max": frozenset({0, 1}),
    "tl.atomic_min": frozenset({0, 1}),
    "tl.multiple_of": frozenset({0}),
    "tl.max_contiguous": frozenset({0}),
    "tl.broadcast_to": frozenset({0}),
    "tl.reshape": frozenset({0}),
    "tl.expand_dims": frozenset({0}),
    "tl.trans": frozenset({0}),
    "tl.permute": frozenset({0}),
    "range": frozenset({0, 1, 2}),
    "tl.range": frozenset({0, 1, 2}),
}
"""Calls and the positional arguments of theirs that Triton takes at run time."""
_RUNTIME_KEYWORDS: Mapping[str, frozenset[str]] = {
    "tl.load": frozenset({"mask", "other"}),
    "tl.store": frozenset({"mask"}),
    "tl.dot": frozenset({"acc"}),
    "tl.atomic_add": frozenset({"mask"}),
    "tl.atomic_max": frozenset({"mask"}),
    "tl.atomic_min": frozenset({"mask"}),
}
_RUNTIME_METHODS = frozenset({"to"})
_LIBDEVICE = ".libdevice."
"""Math functions of CUDA's libdevice (``libdevice.tanh(x)``): every argument a run-time value."""


@dataclass(frozen=True)
class Number:
    """A numeric constant of the function's text: where it is and its value."""

    line: int
    """0-based line of the text."""
    start: int
    end: int
    value: int | float


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _call_takes(call: ast.Call, child: ast.AST) -> bool:
    """Whether ``call`` takes ``child`` (one of its argument expressions or keywords) as a run-time value."""
    name = _dotted(call.func)
    if isinstance(child, ast.keyword):
        return child.arg is not None and child.arg in _RUNTIME_KEYWORDS.get(name, frozenset())
    positions = _ALL if _LIBDEVICE in f".{name}" else _RUNTIME_POSITIONS.get(name)
    if positions is None:
        return False
    return any(arg is child and i in positions for i, arg in enumerate(call.args))


class _Flow:
    """Where the values of one function's body go."""

    def __init__(self, fn: ast.FunctionDef) -> None:
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(fn):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.fn = fn
        uses: dict[str, list[ast.Name]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                uses.setdefault(node.id, []).append(node)
        # A name is bad where one of its uses needs its value when compiling, or flows into a bad
        # name: the least set closed under that (a loop's names feed each other; an assumption
        # made inside such a cycle is never kept).
        sinks = {name: [self._sink(use) for use in found] for name, found in uses.items()}
        self.bad = {name for name, targets in sinks.items() if any(t is None for t in targets)}
        self.bad |= {
            a.arg for a in fn.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)
        }
        grew = True
        while grew:
            grew = False
            for name, targets in sinks.items():
                if name not in self.bad and any(t is not None and self.bad.intersection(t) for t in targets):
                    self.bad.add(name)
                    grew = True

    def runtime(self, node: ast.AST) -> bool:
        """Whether the value of ``node`` (an expression of the body) is only ever taken at run time."""
        targets = self._sink(node)
        return targets is not None and not self.bad.intersection(targets)

    def _sink(self, node: ast.AST) -> tuple[str, ...] | None:
        """Where the value of ``node`` ends: ``None`` where something needs it when compiling, else
        the names it is assigned to (``()``: only run-time uses)."""
        child: ast.AST = node
        while True:
            parent = self.parents.get(child)
            if parent is None or parent is self.fn:
                return None
            if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Compare)):
                child = parent
                continue
            if isinstance(parent, ast.Subscript):
                if parent.value is not child:
                    return None
                child = parent
                continue
            if isinstance(parent, ast.Attribute):  # a method of the value: ``(...).to(tl.float32)``
                call = self.parents.get(parent)
                if not (isinstance(call, ast.Call) and call.func is parent and parent.attr in _RUNTIME_METHODS):
                    return None
                child = call
                continue
            if isinstance(parent, ast.keyword):
                call = self.parents.get(parent)
                if not isinstance(call, ast.Call) or not _call_takes(call, parent):
                    return None
                child = call
                continue
            if isinstance(parent, ast.Call):
                if not _call_takes(parent, child):
                    return None
                child = parent
                continue
            if isinstance(parent, ast.Expr):
                return ()
            if isinstance(parent, ast.For):
                return () if parent.iter is child else None
            if isinstance(parent, (ast.Assign, ast.AugAssign)) and parent.value is child:
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                names: list[str] = []
                for target in targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    if not all(isinstance(e, ast.Name) for e in elts):
                        return None
                    names.extend(e.id for e in elts if isinstance(e, ast.Name))
                return tuple(names)
            return None


def numbers(text: str, floats: bool = False) -> list[tuple[Number, bool]]:
    """The integer constants (``floats``: and float constants) of the body of the one function
    ``text`` defines, in the text's order, each with whether it may become a run-time argument.
    ``[]`` where the text is not one function.

    A float passed at run time is an fp32 scalar, where a float constant takes the type of the
    tensor it meets: the same only where every tensor is fp32 (the caller knows).

    Whether a constant may move depends on where it stands, not on its value: the analysis
    (:func:`_analysed`) is made once per text with its numbers blanked out and kept
    (:data:`_MOVABLE`); each text is only tokenised (a whole model's render shares hundreds of
    kernels of a few dozen structures: 4.5 s for KernelBench L3-15 with the analysis per kernel)."""
    tokens = _tokens(text)
    if tokens is None:
        return []
    key = _replace(text, dict.fromkeys(tokens, "N"))
    flags = _MOVABLE.get(key)
    if flags is None:
        found = _analysed(text)
        if [n for n, _ in found] != tokens:  # the tokens and the tree disagree: nothing moves
            return []
        flags = tuple(ok for _, ok in found)
        with _MOVABLE_LOCK:  # the expert renders in worker threads
            _MOVABLE[key] = flags
            while len(_MOVABLE) > _MOVABLE_KEPT:
                _MOVABLE.pop(next(iter(_MOVABLE)))
    return [(n, ok) for n, ok in zip(tokens, flags, strict=True) if floats or type(n.value) is int]


_MOVABLE: dict[str, tuple[bool, ...]] = {}
"""A kernel's text with its numbers blanked out → whether each of its numbers may move."""
_MOVABLE_KEPT = 4096
_MOVABLE_LOCK = threading.Lock()


_NUMBER = re.compile(r"(?<![\w.])(?:0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)(?![\w.])")
"""A Python int or float literal (the emitters write no other kind). One inside a string would be
found too: the tree then disagrees with what this finds, and nothing of that kernel moves."""


def _tokens(text: str) -> list[Number] | None:
    """The numeric constants of ``text`` (``None``: one is neither an int nor a float)."""
    found: list[Number] = []
    for i, line in enumerate(text.split("\n")):
        for match in _NUMBER.finditer(line):
            try:
                value = ast.literal_eval(parse_expression(match.group(0)))
            except (ValueError, SyntaxError):
                return None
            if type(value) not in (int, float):
                return None
            found.append(Number(i, match.start(), match.end(), value))
    return found


def _analysed(text: str) -> list[tuple[Number, bool]]:
    """Every numeric constant of the body of the one function ``text`` defines, with whether it
    may move (the analysis of :class:`_Flow`)."""
    try:
        module = parse_module(text)
    except SyntaxError:
        return []
    fns = [node for node in module.body if isinstance(node, ast.FunctionDef)]
    if len(fns) != 1:
        return []
    fn = fns[0]
    flow = _Flow(fn)
    found: list[tuple[Number, bool]] = []
    for statement in fn.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.end_col_offset is not None:
                value = node.value
                assert isinstance(value, int | float)  # the type checked above
                number = Number(node.lineno - 1, node.col_offset, node.end_col_offset, value)
                found.append((number, node.lineno == node.end_lineno and flow.runtime(node)))
    found.sort(key=lambda f: (f[0].line, f[0].start))
    return found


HOLE = "\x00"
"""What stands for a movable constant in a kernel's skeleton."""


def skeleton(text: str, found: list[tuple[Number, bool]]) -> str:
    """``text`` with each movable constant replaced by :data:`HOLE` and its type (the others kept)."""
    return _replace(text, {n: HOLE + type(n.value).__name__[0] for n, movable in found if movable})


def with_args(text: str, moved: Mapping[Number, str]) -> str:
    """``text`` with the constants of ``moved`` replaced by their argument names, which join the
    signature (:func:`insert_params`)."""
    if not moved:
        return text
    return insert_params(_replace(text, dict(moved)), list(dict.fromkeys(moved.values())))


_DEF = re.compile(r"^def (\w+)\((.*)\):$")


def params_of(def_line: str) -> list[str]:
    """The parameters of a one-line ``def`` (``ValueError`` where the signature spans lines)."""
    match = _DEF.match(def_line)
    if match is None:
        raise ValueError("its def is not on one line")
    return [p.strip() for p in match.group(2).split(",") if p.strip()]


def insert_params(text: str, extra: Sequence[str]) -> str:
    """``text`` (one function) with ``extra`` parameters after its last parameter that is not a
    ``tl.constexpr`` (the run-time offsets of ``share.with_offsets``, then the constants moved here)."""
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("def "))
    params = params_of(lines[at])
    split = next((i for i, p in enumerate(params) if "constexpr" in p), len(params))
    name = lines[at][4 : lines[at].index("(")]
    lines[at] = f"def {name}({', '.join([*params[:split], *extra, *params[split:]])}):"
    return "\n".join(lines)


def _replace(text: str, by: Mapping[Number, str]) -> str:
    lines = text.split("\n")
    for number in sorted(by, key=lambda n: (n.line, n.start), reverse=True):
        line = lines[number.line]
        lines[number.line] = line[: number.start] + by[number] + line[number.end :]
    return "\n".join(lines)
