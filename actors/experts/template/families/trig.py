"""``torch.sin``, ``torch.cos`` and ``torch.tan``, and their inverses ``asin``, ``acos`` and
``atan`` (``arcsin``, ...; functions and tensor methods): a diffusion model's timestep embedding
(``torch.cat([emb.sin(), emb.cos()], -1)``), NeRF's positional encoding, SIREN's ``sin(w0 * x)``,
rotary embeddings computed in ``forward``, ArcFace's ``cos(acos(c) + m)``.

Each is an elementwise op that fuses like any other, written with core ``tl`` arithmetic (the
same on the GPU and in the CPU interpreter, see ``exprs.py``): ``|x|`` is reduced in float64 by
the multiple ``j`` of pi/4 nearest below (rounded up to even), pi/4 in three float32-exact parts
(Cody and Waite; each product with ``j`` exact in float64 for ``j`` below 2**29), and the
remainder in ``[-pi/4, pi/4]`` goes through Cephes' single-precision sine (degree 7) or cosine
(degree 8) polynomial, chosen and signed by ``j mod 8``. Float64 is used for the three products
and differences alone (``j`` itself is a float32 integer). Within about 1.3 ulp of the correctly
rounded value (checked against float64 on sweeps up to ``|x|`` of 10**6 in the tests); beyond,
the float32 estimate of ``j`` drifts (an error of about 1e-5 at 10**7, 1e-2 past 2**24), which
the evaluator's comparison with float64 then shows. ``tan`` is ``sin / cos`` of one reduction.
NaN and infinity give NaN, as in PyTorch.

The inverses are Cephes' too: ``asin`` by its odd polynomial on ``|x| <= 0.5`` and, above,
``pi/2 - 2 asin(sqrt((1 - |x|) / 2))``; ``acos`` from ``asin`` in three ranges (``pi/2 - asin(x)``
in the middle, ``2 asin(sqrt((1 -+ x) / 2))`` near the ends, no cancellation near 1); ``atan`` by
its polynomial after the argument is reduced below tan(pi/8) (``(x - 1) / (x + 1)`` plus pi/4, or
``-1 / x`` plus pi/2). Outside ``[-1, 1]`` ``asin`` and ``acos`` give NaN, as PyTorch does.
"""

from __future__ import annotations

from typing import Any

import torch

from actors.experts.template.exprs import ew_form
from actors.experts.template.ir import EW_OPS, NodeRef
from actors.experts.template.lowering import LowerContext, lowering
from actors.experts.template.spellings import REQUIRED, Spec, spell

_OPS = ("sin", "cos", "tan", "asin", "acos", "atan")
for _op in _OPS:
    EW_OPS[_op] = (1, 0)
    _alias = _op.replace("a", "arc", 1) if _op.startswith("a") else None  # arcsin, arccos, arctan
    _names = (_op,) if _alias is None else (_op, _alias)
    spell(
        Spec(_op, (("input", REQUIRED),)),
        functions=tuple(getattr(torch, n) for n in _names),
        methods=_names,
    )

_FOUR_OVER_PI = 1.2732395447351628
_DP = (0.7853981852531433, -2.1855694143368964e-08, -8.575622550029409e-16)  # pi/4, three float32 parts
_SIN = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)

_REDUCE = f'''
@triton.jit
def _kf_trig_reduce(x):
    """|x| less the multiple j of pi/4 (|x| * 4/pi rounded down, then up to even; an integer in
    float32 below 2**24), the products with j's three parts exact in float64; returns the remainder
    r in [-pi/4, pi/4], r * r, and j mod 8 (0, 2, 4, 6)."""
    a = tl.abs(x)
    j = tl.floor(a * {_FOUR_OVER_PI!r})
    j = j + (j - 2.0 * tl.floor(j * 0.5))
    d = j.to(tl.float64)
    r = (((a.to(tl.float64) - d * {_DP[0]!r}) - d * {_DP[1]!r}) - d * {_DP[2]!r}).to(tl.float32)
    m = j - 8.0 * tl.floor(j * 0.125)
    return r, r * r, m
'''
_POLYS = f'''
@triton.jit
def _kf_sin_poly(r, z):
    """sin(r) for r in [-pi/4, pi/4], z = r * r."""
    return (({_SIN[0]!r} * z + {_SIN[1]!r}) * z + {_SIN[2]!r}) * z * r + r


@triton.jit
def _kf_cos_poly(z):
    """cos(r) for r in [-pi/4, pi/4], z = r * r."""
    return (({_COS[0]!r} * z + {_COS[1]!r}) * z + {_COS[2]!r}) * z * z - 0.5 * z + 1.0
'''
_SIN_FN = '''
@triton.jit
def _kf_sin(x):
    """sin(x): the polynomial j mod 8 picks (0: sin, 2: cos, 4: -sin, 6: -cos), x's sign."""
    r, z, m = _kf_trig_reduce(x)
    m4 = m - 4.0 * tl.floor(m * 0.25)
    y = tl.where(m4 == 2.0, _kf_cos_poly(z), _kf_sin_poly(r, z))
    y = tl.where(m >= 4.0, -y, y)
    return tl.where(x < 0.0, -y, y)
'''
_COS_FN = '''
@triton.jit
def _kf_cos(x):
    """cos(x) (even): 0: cos, 2: -sin, 4: -cos, 6: sin."""
    r, z, m = _kf_trig_reduce(x)
    m4 = m - 4.0 * tl.floor(m * 0.25)
    y = tl.where(m4 == 2.0, _kf_sin_poly(r, z), _kf_cos_poly(z))
    return tl.where((m == 2.0) | (m == 4.0), -y, y)
'''
_ASIN = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)
_ATAN = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_INVERSES = f'''
@triton.jit
def _kf_asin_unit(a):
    """asin(a) for a in [0, 1] (NaN above): the odd polynomial below 0.5, pi/2 - 2 asin(sqrt((1 - a) / 2)) above."""
    big = a > 0.5
    z = tl.where(big, 0.5 * (1.0 - a), a * a)
    t = tl.where(big, tl.sqrt(z), a)
    p = (((({_ASIN[0]!r} * z + {_ASIN[1]!r}) * z + {_ASIN[2]!r}) * z + {_ASIN[3]!r}) * z + {_ASIN[4]!r}) * z * t + t
    return tl.where(big, 1.5707963267948966 - (p + p), p)


@triton.jit
def _kf_asin(x):
    y = _kf_asin_unit(tl.abs(x))
    return tl.where(x < 0.0, -y, y)


@triton.jit
def _kf_acos(x):
    """pi/2 - asin(x) in [-0.5, 0.5]; 2 asin(sqrt((1 - x) / 2)) above, pi - 2 asin(sqrt((1 + x) / 2)) below."""
    mid = 1.5707963267948966 - _kf_asin(x)
    t = _kf_asin_unit(tl.sqrt(0.5 * (1.0 - tl.abs(x))))
    end = tl.where(x > 0.0, 2.0 * t, 3.141592653589793 - 2.0 * t)
    return tl.where(tl.abs(x) <= 0.5, mid, end)


@triton.jit
def _kf_atan(x):
    """atan: |x| reduced below tan(pi/8) ((a - 1) / (a + 1) plus pi/4, or -1 / a plus pi/2), then the odd polynomial."""
    a = tl.abs(x)
    high = a > 2.414213562373095
    middle = (a > 0.41421356237309503) & (a <= 2.414213562373095)
    base = tl.where(high, 1.5707963267948966, tl.where(middle, 0.7853981633974483, 0.0))
    t = tl.where(high, -1.0 / a, tl.where(middle, (a - 1.0) / (a + 1.0), a))
    z = t * t
    y = base + ((({_ATAN[0]!r} * z + {_ATAN[1]!r}) * z + {_ATAN[2]!r}) * z + {_ATAN[3]!r}) * z * t + t
    return tl.where(x < 0.0, -y, y)
'''
_TAN_FN = '''
@triton.jit
def _kf_tan(x):
    """sin(x) / cos(x) from one reduction: the two polynomials as _kf_sin and _kf_cos pick them."""
    r, z, m = _kf_trig_reduce(x)
    m4 = m - 4.0 * tl.floor(m * 0.25)
    p = _kf_sin_poly(r, z)
    q = _kf_cos_poly(z)
    s = tl.where(m4 == 2.0, q, p)
    s = tl.where(m >= 4.0, -s, s)
    c = tl.where(m4 == 2.0, p, q)
    c = tl.where((m == 2.0) | (m == 4.0), -c, c)
    t = s / c
    return tl.where(x < 0.0, -t, t)
'''
_HELPERS = {
    "_kf_inverse_trig": (_INVERSES, ()),
    "_kf_tan": (_TAN_FN, ("_kf_trig_reduce", "_kf_trig_polys")),
    "_kf_trig_reduce": (_REDUCE, ()),
    "_kf_trig_polys": (_POLYS, ()),
    "_kf_sin": (_SIN_FN, ("_kf_trig_reduce", "_kf_trig_polys")),
    "_kf_cos": (_COS_FN, ("_kf_trig_reduce", "_kf_trig_polys")),
}


@ew_form("sin", _HELPERS)
def _sin_form(a: list[str], attrs: tuple[float, ...], used: set[str]) -> str:
    used.add("_kf_sin")
    return f"_kf_sin({a[0]})"


@ew_form("cos")
def _cos_form(a: list[str], attrs: tuple[float, ...], used: set[str]) -> str:
    used.add("_kf_cos")
    return f"_kf_cos({a[0]})"


@ew_form("tan")
def _tan_form(a: list[str], attrs: tuple[float, ...], used: set[str]) -> str:
    used.add("_kf_tan")
    return f"_kf_tan({a[0]})"


for _op in ("asin", "acos", "atan"):

    def _inverse_form(a: list[str], attrs: tuple[float, ...], used: set[str], name: str = _op) -> str:
        used.add("_kf_inverse_trig")
        return f"_kf_{name}({a[0]})"

    ew_form(_op)(_inverse_form)


@lowering(*_OPS)
def _trig(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> NodeRef:
    return lw.ew(canon, lw.tensor(b.get("input"), f"the input of {canon}"))
