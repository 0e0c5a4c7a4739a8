"""The seam between the lowerer and the op families: what a family may ask, and where it registers.

A family (``actors/experts/template/families/``) is one module: it writes its lowering as a
function ``(lw, canon, bound, traced) -> value`` and registers it for the canonical op names it
covers with :func:`lowering`. The lowerer (``lower.py``) and the core ops (``composites.py``) never
import a family by name: :func:`lower_fn` loads the families package once and looks the op up.
``lw`` is a :class:`LowerContext`, the building blocks of the plan (the lowerer is one); nothing
here imports the lowerer, so no family, and no module a family uses, depends on it.

Adding an op family: write ``families/<name>.py`` whose functions carry
``@lowering("canon", ...)``, the canonical names the spellings table (``spellings.py``) gives the
op. Where the family needs a kernel of its own, the same module writes its ``Writer`` and
registers a ``KernelTemplate`` (``kernel_kinds.py``: the writer, first parameters, the parameters
that matter), as ``families/scan.py`` does.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Protocol

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import HALF, KeepTorch, Node, NodeKind, NodeRef, Plan, plan_from_dict
from actors.experts.template.trace import Traced


class LowerContext(Protocol):
    """What a family's lowering may use of the lowerer: the traced model and the plan's building blocks."""

    traced: Traced
    keep_torch: KeepTorch
    env: dict[Any, Any]
    """FX node -> what it lowered to."""
    ops: list[str]
    """The ops met, in order (for the plan's description)."""

    def add(self, kind: NodeKind, shape: tuple[int, ...], **kw: Any) -> NodeRef: ...
    def node(self, ref: NodeRef) -> Node: ...
    def shape(self, ref: NodeRef) -> tuple[int, ...]: ...
    def param(self, path: str) -> NodeRef: ...
    def tensor(self, ref: object, what: str) -> NodeRef: ...
    def ew(self, op: str, *args: object, attrs: tuple[float, ...] = ()) -> NodeRef: ...
    def view(self, src: NodeRef, shape: tuple[int, ...]) -> NodeRef: ...
    def perm(self, src: NodeRef) -> NodeRef: ...
    def transposed(self, ref: NodeRef) -> bool: ...
    def in_order(self, ref: NodeRef) -> NodeRef: ...
    def split_parts(self, op: str, src: NodeRef, dims: tuple[int, int]) -> int | None: ...
    def column_parts(self, src: NodeRef, parts: int) -> int: ...
    def red(self, op: str, src: NodeRef, dims: tuple[int, int], keepdim: bool, split_rows: bool = True) -> NodeRef: ...
    def arg(self, value: Any) -> Any: ...


LowerFn = Callable[[LowerContext, str, dict[str, Any], Any], object]
"""A family's lowering: ``(lw, canonical op, bound arguments, the op's output on meta tensors)``."""

_REGISTRY: dict[str, LowerFn] = {}
_FAMILIES = "actors.experts.template.families"
_loaded: list[str] = []


def one_float_type(lw: LowerContext, operands: list[NodeRef], what: str) -> str:
    """The one floating type of a product's, convolution's or attention's operands: float32, or one
    half type (its tensor-core products sum in float32 and the result is stored in that type);
    declined where they differ (PyTorch refuses a mix) or are of another type."""
    dtypes = {lw.node(t).dtype for t in operands}
    if len(dtypes) == 1 and dtypes <= {"float32", *HALF}:
        return dtypes.pop()
    mix = " and ".join(sorted(dtypes))
    raise UnsupportedGraph(f"{what} of {mix} tensors is not covered (float32, float16, bfloat16)")


def lowering(*canons: str) -> Callable[[LowerFn], LowerFn]:
    """Register the decorated function as the lowering of ``canons`` (each name once, program-wide)."""
    if not canons:
        raise ValueError("lowering() needs at least one canonical op name")

    def register(fn: LowerFn) -> LowerFn:
        for canon in canons:
            held = _REGISTRY.get(canon)
            if held is not None and held is not fn:
                raise ValueError(f"the lowering of {canon!r} is registered twice: {held.__module__}, {fn.__module__}")
            _REGISTRY[canon] = fn
        return fn

    return register


INDEX_INPUTS: dict[str, str] = {}
"""Canonical op -> the argument through which it reads an int64 tensor of indices (a loss's class
``target``, an embedding's ``input``): a model input used only there may be int64."""


INDEX_DTYPES = ("int64", "int32")
"""The plan dtypes of index tensors: an input is int64; a buffer of indices int64 or int32."""


def index_input(canon: str, param: str) -> None:
    """Declare that ``canon`` reads int64 indices through its argument ``param`` (a family's call)."""
    held = INDEX_INPUTS.get(canon)
    if held is not None and held != param:
        raise ValueError(f"the index argument of {canon!r} is declared twice: {held!r}, {param!r}")
    INDEX_INPUTS[canon] = param


def index_inputs() -> dict[str, str]:
    """Every declared index argument (the families loaded first)."""
    load_families()
    return dict(INDEX_INPUTS)


def load_families() -> tuple[str, ...]:
    """Import every module of the families package once (each registers itself); their names."""
    if not _loaded:
        package = importlib.import_module(_FAMILIES)
        names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
        for name in names:
            importlib.import_module(f"{_FAMILIES}.{name}")
        _loaded.extend(names)
    return tuple(_loaded)


def read_plan(data: dict[str, Any]) -> Plan:
    """A plan from its JSON form (:func:`actors.experts.template.ir.plan_from_dict`), in a
    process that may never have analysed one: the op families are loaded first, since the ops
    they add (gathers such as a concatenation's or an embedding's) are known to scheduling and
    rendering only once they are. An embedding's plan came back from the analysis child and
    failed to render ("an operand of shape (100, 32) broadcast to (8, 32) is not covered"); on an
    H100, a second ``kfoundry run`` of KernelBench L3-15 (DenseNet-121) read its kept plan from
    the plan store so, and every request was declined ("an operand of shape (10, 64, 56, 56)
    broadcast to (10, 96, 56, 56) is not covered")."""
    load_families()
    return plan_from_dict(data)


def lower_fn(canon: str) -> LowerFn | None:
    """The registered lowering of ``canon`` (the families loaded first), or None."""
    load_families()
    return _REGISTRY.get(canon)


def registered() -> dict[str, str]:
    """Canonical op -> the module of its lowering (for tests and the coverage report)."""
    load_families()
    return {canon: fn.__module__ for canon, fn in sorted(_REGISTRY.items())}
