"""Elementwise ops as Triton expressions, computed in float32.

Everything here must mean the same on the GPU (Triton 3.6) and in the CPU interpreter (Triton
3.9), so only core ``tl`` functions are used (no libdevice). Functions Triton lacks (``tanh``,
``expm1``, ``log1p``) are written as small ``@triton.jit`` helpers that stay accurate near zero,
where the textbook forms lose digits: a series below a threshold, the closed form above it.
NaNs propagate like PyTorch's (``where``-based clamps, ``relu`` and ``maximum``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from actors.experts.template.errors import UnsupportedGraph

_TANH_SERIES = (
    -0.3333333333333333,
    0.13333333333333333,
    -0.05396825396825397,
    0.021869488536155203,
    -0.008863235529902197,
    0.003592128036572481,
    -0.0014558343870513183,
    0.000590027440945586,
)
_EXPM1_SERIES = tuple(1.0 / math.factorial(k) for k in range(2, 11))
_LOG1P_SERIES = tuple(1.0 / (2 * k + 1) for k in range(1, 10))


def _horner(var: str, coeffs: tuple[float, ...]) -> str:
    """``1 + var*(c0 + var*(c1 + ...))`` as text."""
    expr = repr(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        expr = f"{c!r} + {var} * ({expr})"
    return f"1.0 + {var} * ({expr})"


HELPERS: dict[str, str] = {
    "_kf_tanh": f'''
@triton.jit
def _kf_tanh(x):
    """tanh: odd series below |x| = 0.5, (1 - e) / (1 + e) with e = exp(-2|x|) above."""
    a = tl.abs(x)
    a2 = a * a
    small = a * ({_horner("a2", _TANH_SERIES)})
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    t = tl.where(a < 0.5, small, big)
    return tl.where(x < 0.0, -t, t)
''',
    "_kf_expm1": f'''
@triton.jit
def _kf_expm1(x):
    """exp(x) - 1 without cancellation near zero."""
    small = x * ({_horner("x", _EXPM1_SERIES)})
    return tl.where(tl.abs(x) < 0.5, small, tl.exp(x) - 1.0)
''',
    "_kf_log1p_unit": f'''
@triton.jit
def _kf_log1p_unit(t):
    """log(1 + t) for t in [0, 1], as 2 atanh(t / (2 + t)) by its series."""
    s = t / (2.0 + t)
    s2 = s * s
    return 2.0 * s * ({_horner("s2", _LOG1P_SERIES)})
''',
    "_kf_softplus": """
@triton.jit
def _kf_softplus(x, beta, threshold):
    \"\"\"PyTorch's softplus: x above the threshold, log(1 + exp(beta x)) / beta below.\"\"\"
    z = x * beta
    sp = tl.where(z > 0.0, z, 0.0) + _kf_log1p_unit(tl.exp(-tl.abs(z)))
    return tl.where(z > threshold, x, sp / beta)
""",
    "_kf_mish": """
@triton.jit
def _kf_mish(x):
    \"\"\"Mish, x tanh(log(1 + n)) with n = exp(x), as x p / (p + 2) with p = n (n + 2): the
    identity tanh(log(1 + n)) = ((1 + n)^2 - 1) / ((1 + n)^2 + 1), one exp and one division (the
    softplus-then-tanh helpers cost about five times as many instructions, and a convolution's
    fused double Mish was bound by them). x itself above 20, where the tanh rounds to 1.\"\"\"
    n = tl.exp(tl.minimum(x, 20.0))
    p = n * (n + 2.0)
    return tl.where(x > 20.0, x, x * p / (p + 2.0))
""",
    "_kf_mul": """
@triton.jit
def _kf_mul(a, b):
    \"\"\"The combine function of a product reduction.\"\"\"
    return a * b
""",
}
"""Helper functions by name; ``HELPER_DEPS`` says which helpers each one calls."""

HELPER_DEPS: dict[str, tuple[str, ...]] = {
    "_kf_tanh": (),
    "_kf_expm1": (),
    "_kf_log1p_unit": (),
    "_kf_softplus": ("_kf_log1p_unit",),
    "_kf_mish": (),
    "_kf_mul": (),
}


def lit(value: float) -> str:
    """A float constant as Triton source text (an expression where it moves with the batch,
    ``any_batch.SymFloat``)."""
    expr = getattr(value, "expr", None)
    if isinstance(expr, str):
        return expr
    if math.isnan(value):
        raise UnsupportedGraph("a NaN constant is not covered")
    if math.isinf(value):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(float(value))


def _clamp(x: str, lo: float | None, hi: float | None) -> str:
    """``min(max(x, lo), hi)`` as PyTorch orders it (``hi`` wins when ``lo > hi``)."""
    expr = x
    if lo is not None:
        expr = f"tl.where({x} < {lit(lo)}, {lit(lo)}, {x})"
    if hi is not None:
        expr = f"tl.where({expr} > {lit(hi)}, {lit(hi)}, {expr})"
    return expr


_CMP = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
"""Comparisons, whose bool results are 0.0 / 1.0 inside a kernel."""


EwForm = Callable[[list[str], tuple[float, ...], set[str]], str]
"""An op family's Triton form of its own elementwise op: ``(argument expressions, attrs, used
helpers) -> expression``, registered with :func:`ew_form` (``families/trig.py``)."""

EW_FORMS: dict[str, EwForm] = {}


def ew_form(op: str, helpers: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> Callable[[EwForm], EwForm]:
    """Register the decorated function as the Triton form of elementwise ``op`` (an op family's),
    with the ``@triton.jit`` helpers it calls: name -> (source, the helpers that one calls)."""

    def register(fn: EwForm) -> EwForm:
        if op in EW_FORMS:
            raise ValueError(f"the Triton form of {op!r} is registered twice")
        for name, (source, deps) in (helpers or {}).items():
            if HELPERS.get(name, source) != source:
                raise ValueError(f"the helper {name!r} is registered twice with different sources")
            HELPERS[name] = source
            HELPER_DEPS[name] = deps
        EW_FORMS[op] = fn
        return fn

    return register


def ew_expr(op: str, a: list[str], attrs: tuple[float, ...], used: set[str]) -> str:
    """The Triton expression of elementwise ``op`` on argument expressions ``a``.

    Arguments must be variable names or literals (they may be repeated in the expression).
    Helper functions the expression calls are added to ``used``.
    """
    x = a[0]
    simple = {
        "add": lambda: f"{a[0]} + {a[1]}",
        "sub": lambda: f"{a[0]} - {a[1]}",
        "mul": lambda: f"{a[0]} * {a[1]}",
        "div": lambda: f"{a[0]} / {a[1]}",
        "maximum": lambda: f"tl.where(({a[0]} > {a[1]}) | ({a[0]} != {a[0]}), {a[0]}, {a[1]})",
        "minimum": lambda: f"tl.where(({a[0]} < {a[1]}) | ({a[0]} != {a[0]}), {a[0]}, {a[1]})",
        "neg": lambda: f"-{x}",
        "as_float32": lambda: x,
        "int_to_float32": lambda: f"{x}.to(tl.float32)",
        "round_float16": lambda: f"{x}.to(tl.float16).to(tl.float32)",
        "round_bfloat16": lambda: f"{x}.to(tl.bfloat16).to(tl.float32)",
        "relu": lambda: f"tl.where({x} < 0.0, 0.0, {x})",
        "relu6": lambda: _clamp(x, 0.0, 6.0),
        "leaky_relu": lambda: f"tl.where({x} > 0.0, {x}, {x} * {lit(attrs[0])})",
        "gelu": lambda: f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))",
        "sigmoid": lambda: f"1.0 / (1.0 + tl.exp(-{x}))",
        "silu": lambda: f"{x} / (1.0 + tl.exp(-{x}))",
        "hardtanh": lambda: _clamp(x, attrs[0], attrs[1]),
        "clamp_min": lambda: _clamp(x, attrs[0], None),
        "clamp_max": lambda: _clamp(x, None, attrs[0]),
        "hardswish": lambda: f"{x} * ({_clamp(f'({x} + 3.0)', 0.0, 6.0)}) / 6.0",
        "hardsigmoid": lambda: f"({_clamp(f'({x} + 3.0)', 0.0, 6.0)}) / 6.0",
        "softsign": lambda: f"{x} / (1.0 + tl.abs({x}))",
        "exp": lambda: f"tl.exp({x})",
        "log": lambda: f"tl.log({x})",
        "sqrt": lambda: f"tl.sqrt({x})",
        "rsqrt": lambda: f"1.0 / tl.sqrt({x})",
        "abs": lambda: f"tl.abs({x})",
        "erf": lambda: f"tl.erf({x})",
        "reciprocal": lambda: f"1.0 / {x}",
        "xlogx": lambda: f"tl.where({x} == 0.0, 0.0, {x} * tl.log({x}))",
        "where": lambda: f"tl.where({a[0]} != 0.0, {a[1]}, {a[2]})",
    }
    if op in _CMP:
        return f"tl.where({a[0]} {_CMP[op]} {a[1]}, 1.0, 0.0)"
    if op in simple:
        return f"({simple[op]()})"
    if op == "tanh":
        used.add("_kf_tanh")
        return f"_kf_tanh({x})"
    if op == "tanhshrink":
        used.add("_kf_tanh")
        return f"({x} - _kf_tanh({x}))"
    if op == "gelu_tanh":
        used.add("_kf_tanh")
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"(0.5 * {x} * (1.0 + _kf_tanh({inner})))"
    if op in ("elu", "selu"):
        used.add("_kf_expm1")
        alpha, scale = (attrs[0], None) if op == "elu" else (1.6732632423543772, 1.0507009873554805)
        core = f"tl.where({x} > 0.0, {x}, {lit(alpha)} * _kf_expm1({x}))"
        return f"({lit(scale)} * {core})" if scale is not None else f"({core})"
    if op == "softplus":
        used.update(("_kf_softplus", "_kf_log1p_unit"))
        return f"_kf_softplus({x}, {lit(attrs[0])}, {lit(attrs[1])})"
    if op == "mish":
        used.add("_kf_mish")
        return f"_kf_mish({x})"
    if op == "logsigmoid":
        used.add("_kf_log1p_unit")
        return f"(tl.where({x} < 0.0, {x}, 0.0) - _kf_log1p_unit(tl.exp(-tl.abs({x}))))"
    form = EW_FORMS.get(op)
    if form is not None:
        return f"({form(a, attrs, used)})"
    raise UnsupportedGraph(f"no Triton form for elementwise op {op!r}", op=op)


def helpers_source(used: set[str]) -> str:
    """Source of the helpers in ``used`` and the helpers they call, dependencies first."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dep in HELPER_DEPS[name]:
            visit(dep)
        order.append(name)

    for name in sorted(used):
        visit(name)
    return "".join(HELPERS[name] for name in order)


def attr_path(path: str) -> str:
    """``self.<path>`` as Python, with list indices (``layers.0`` -> ``self.layers[0]``)."""
    expr = "self"
    for part in path.split("."):
        expr += f".{part}" if part.isidentifier() else f"[{int(part)}]" if part.isdigit() else f"[{part!r}]"
    return expr
