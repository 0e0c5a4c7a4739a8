"""Canonical ops to primitive nodes: what each covered op means, written as the plan's nodes.

The decompositions follow PyTorch's own arithmetic where it matters for rounding: ``mean`` is a
sum divided by the count, ``softmax`` subtracts the row maximum, ``layer_norm`` uses the two-pass
variance and ``1 / sqrt(var + eps)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from actors.experts.template.errors import UnsupportedGraph, number
from actors.experts.template.ir import CASTS, COMPARISONS, HALF, Absent, DiagRef, NodeKind, NodeRef, TupleRef
from actors.experts.template.lowering import INDEX_DTYPES, LowerContext, lower_fn
from actors.experts.template.products import product

_UNARY = frozenset(
    {
        "relu",
        "relu6",
        "sigmoid",
        "tanh",
        "silu",
        "mish",
        "hardswish",
        "hardsigmoid",
        "selu",
        "softsign",
        "logsigmoid",
        "tanhshrink",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "abs",
        "erf",
        "reciprocal",
        "neg",
    }
)


_FOLDED = frozenset({"sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "erf", "reciprocal", "neg"})
"""Unary ops folded on a number (``torch.log(torch.tensor(100.0))``), in float32 as PyTorch computes them."""


def _is_id(value: object) -> bool:
    return isinstance(value, NodeRef)


def reduce_dims(shape: tuple[int, ...], dim: object) -> tuple[int, int]:
    """Normalise a ``dim`` argument into a contiguous range ``[d0, d1)`` of ``shape``."""
    rank = len(shape)
    if rank == 0:
        raise UnsupportedGraph("a reduction of a zero-dimensional tensor")
    if dim is None or dim == () or dim == []:
        dims = list(range(rank))
    elif isinstance(dim, int) and not isinstance(dim, bool):
        dims = [dim]
    elif isinstance(dim, tuple | list) and all(isinstance(d, int) for d in dim):
        dims = list(dim)
    else:
        raise UnsupportedGraph(f"reduction dim {dim!r} is not covered")
    norm = sorted({d % rank for d in dims if -rank <= d < rank})
    if len(norm) != len(dims):
        raise UnsupportedGraph(f"reduction dims {dim!r} repeat or fall outside rank {rank}")
    if norm != list(range(norm[0], norm[-1] + 1)):
        raise UnsupportedGraph(f"reduction over non-adjacent dims {dim!r} is not covered")
    return norm[0], norm[-1] + 1


def _reduced_view(lw: LowerContext, ref: NodeRef, src_shape: tuple[int, ...], dims: tuple[int, int]) -> NodeRef:
    """A keepdim result viewed without the reduced dims."""
    return lw.view(ref, (*src_shape[: dims[0]], *src_shape[dims[1] :]))


def param_or_arg(lw: LowerContext, bound: dict[str, Any], name: str) -> NodeRef | None:
    """A weight/bias given as an argument, or read from the module at ``__path__``."""
    if "__path__" in bound:
        module = lw.traced.root.get_submodule(bound["__path__"])
        if getattr(module, name, None) is None:
            return None
        return lw.param(f"{bound['__path__']}.{name}")
    value = bound.get(name)
    if value is None:
        return None
    return lw.tensor(value, name)


def apply(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    """Build the nodes of one canonical op; return what the FX node stands for."""
    if canon == "tensor_const":
        data, dtype = b["data"], b.get("dtype")
        if isinstance(data, bool) or not isinstance(data, int | float) or dtype not in (None, torch.float32):
            raise UnsupportedGraph("torch.tensor in forward of other than a float32 number is not covered")
        return float(data)
    x = b.get("input")
    if canon in _UNARY:
        if isinstance(x, float) and canon in _FOLDED:
            return float(getattr(torch, canon)(torch.tensor(x, dtype=torch.float32)))
        if canon in ("neg", "abs") and isinstance(x, NodeRef) and lw.node(x).dtype == "int64":
            return lw.ew(canon, x)  # positions from torch.arange (``Lowerer.int_bound``), else declined there
        return lw.ew(canon, lw.tensor(x, canon))
    if canon in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
        return _binary(lw, canon, b)
    if canon in COMPARISONS:
        return lw.ew(canon, _comparand(lw, x, canon), _comparand(lw, b["other"], canon, number_ok=True))
    if canon == "masked_fill":  # x where the mask is false, the value where it is true
        return lw.ew("where", b["mask"], _tensor_or_number(lw, b["value"], canon), lw.tensor(x, canon))
    if canon == "where":
        return lw.ew("where", b["condition"], _tensor_or_number(lw, x, canon), _tensor_or_number(lw, b["other"], canon))
    if canon in ("sum", "prod", "mean", "amax", "amin", "argmax", "argmin", "max", "min", "logsumexp"):
        return _reduction(lw, canon, b)
    if canon in ("linear", "matmul"):
        return _matmul(lw, canon, b)
    if canon == "diag":
        return _diag(lw, b)
    if canon == "cosine_similarity":
        return _cosine_similarity(lw, b)
    if canon in ("triu", "tril"):
        mask = isinstance(x, NodeRef) and lw.node(x).dtype == "bool"  # a bool mask: zeroed off the triangle
        x = x if mask and isinstance(x, NodeRef) else lw.tensor(x, canon)
        k = b.get("diagonal", 0)
        if len(lw.shape(x)) < 2 or isinstance(k, bool) or not isinstance(k, int):
            raise UnsupportedGraph(f"{canon} of shape {lw.shape(x)} with diagonal={k!r} is not covered")
        if mask:
            return lw.add(NodeKind.EW, lw.shape(x), op=canon, args=(x.id,), attrs=(float(k),), dtype="bool")
        return lw.ew(canon, x, attrs=(float(k),))
    if canon == "einsum":
        return _einsum(lw, b, traced)
    family = lower_fn(canon)  # an op family's own module (``families/``), registered by name
    if family is not None:
        return family(lw, canon, b, traced)
    return _other(lw, canon, b, traced)


def _activation(lw: LowerContext, canon: str, x: NodeRef, b: dict[str, Any]) -> NodeRef:
    if canon == "gelu":
        approximate = b["approximate"]
        if approximate not in ("none", "tanh"):
            raise UnsupportedGraph(f"gelu(approximate={approximate!r}) is not covered")
        return lw.ew("gelu" if approximate == "none" else "gelu_tanh", x)
    if canon == "square":
        return lw.ew("mul", x, x)
    if canon == "leaky_relu":
        return lw.ew("leaky_relu", x, attrs=(number(b["negative_slope"], "negative_slope"),))
    if canon == "softplus":
        return lw.ew("softplus", x, attrs=(number(b["beta"], "beta"), number(b["threshold"], "threshold")))
    if canon == "hardtanh":
        return lw.ew("hardtanh", x, attrs=(number(b["min_val"], "min_val"), number(b["max_val"], "max_val")))
    if canon == "elu":
        return lw.ew("elu", x, attrs=(number(b["alpha"], "alpha"),))
    if canon == "clamp":
        lo, hi = b.get("min"), b.get("max")
        if lo is None and hi is None:
            raise UnsupportedGraph("clamp without bounds")
        if lo is None:
            return lw.ew("clamp_max", x, attrs=(number(hi, "clamp max"),))
        if hi is None:
            return lw.ew("clamp_min", x, attrs=(number(lo, "clamp min"),))
        return lw.ew("hardtanh", x, attrs=(number(lo, "clamp min"), number(hi, "clamp max")))
    raise UnsupportedGraph(f"{canon} is not covered", op=canon)


def _tensor_or_number(lw: LowerContext, value: object, what: str) -> NodeRef | float:
    """A float32 tensor operand, or a Python number (a 0-dim constant of the trace counts as one)."""
    if isinstance(value, NodeRef):
        return lw.tensor(value, f"an operand of {what}")
    return number(value, what)


def _comparand(lw: LowerContext, value: object, what: str, number_ok: bool = False) -> NodeRef | float:
    """An operand of a comparison: a floating tensor, an int64 tensor (``pred == target``, ``ids !=
    pad``: compared as PyTorch compares them, int64 with int64, else in float32) or, where
    ``number_ok``, a number."""
    if isinstance(value, NodeRef) and lw.node(value).dtype == "int64":
        return value
    return _tensor_or_number(lw, value, what) if number_ok else lw.tensor(value, what)


def _binary(lw: LowerContext, canon: str, b: dict[str, Any]) -> object:
    x, other = b["input"], b["other"] if canon != "pow" else b["exponent"]
    if canon == "pow":
        return power(lw, x, other)
    if canon == "div" and b.get("rounding_mode") is not None:
        raise UnsupportedGraph("division with a rounding mode is not covered")
    alpha = b.get("alpha", 1)
    if alpha != 1:
        other = lw.ew("mul", other, number(alpha, "alpha")) if _is_id(other) else number(other, "b") * alpha
    return lw.ew(canon, x, other)


def power(lw: LowerContext, x: object, exponent: object) -> NodeRef:
    """``x ** exponent`` for a number exponent (``torch.pow``; local response norm's ``beta``)."""
    if not isinstance(x, NodeRef) or _is_id(exponent):
        raise UnsupportedGraph("pow with a tensor exponent is not covered")
    e = number(exponent, "exponent")
    if e == 0.5:
        return lw.ew("sqrt", x)
    if e == -0.5:
        return lw.ew("rsqrt", x)
    if not math.isfinite(e) or abs(e) > 64:
        raise UnsupportedGraph(f"pow with exponent {e} is not covered (finite, at most 64 in size)")
    if e == 0:
        return lw.ew("where", lw.ew("eq", x, x), 1.0, 1.0)  # 1 everywhere, NaN and inf too, as PyTorch
    # x^e = x^n * x^f, n = floor(|e|) by products (squaring), f = |e| - n in [0, 1) as sqrt (0.5) or
    # exp(f * log(x)) (a negative x gives NaN there, as PyTorch gives for a fractional exponent);
    # the reciprocal for a negative e. Splitting keeps the exponential's error to f * log(x).
    n, f = int(abs(e)), abs(e) - int(abs(e))
    result: NodeRef | None = _whole_power(lw, x, n) if n else None
    if f:
        frac = lw.ew("sqrt", x) if f == 0.5 else lw.ew("exp", lw.ew("mul", lw.ew("log", x), f))
        result = frac if result is None else lw.ew("mul", result, frac)
    assert result is not None
    if result is x:
        result = lw.ew("mul", x, 1.0)
    return lw.ew("reciprocal", result) if e < 0 else result


def _whole_power(lw: LowerContext, x: NodeRef, n: int) -> NodeRef:
    """``x ** n`` for ``n >= 1`` by squaring: about log2(n) products."""
    result: NodeRef | None = None
    square = x
    while n:
        if n & 1:
            result = square if result is None else lw.ew("mul", result, square)
        n >>= 1
        if n:
            square = lw.ew("mul", square, square)
    assert result is not None
    return result


def _reduction(lw: LowerContext, canon: str, b: dict[str, Any]) -> object:
    if canon in ("max", "min"):
        if b.get("other") is not None or _is_id(b.get("dim")) or isinstance(b.get("dim"), float):
            other = b["other"] if b.get("other") is not None else b["dim"]
            return lw.ew("maximum" if canon == "max" else "minimum", b["input"], other)
        x = lw.tensor(b["input"], canon)
        if b["dim"] is None:
            return lw.red("amax" if canon == "max" else "amin", x, reduce_dims(lw.shape(x), None), False)
        dims = reduce_dims(lw.shape(x), b["dim"])
        keep = bool(b["keepdim"])
        values = lw.red("amax" if canon == "max" else "amin", x, dims, keep)
        indices = lw.red("argmax" if canon == "max" else "argmin", x, dims, keep)
        return TupleRef((values, indices))
    x = lw.tensor(b["input"], canon)
    if b.get("dtype") is not None:
        raise UnsupportedGraph(f"{canon} with a dtype argument is not covered")
    shape = lw.shape(x)
    dims = reduce_dims(shape, b["dim"])
    keep = bool(b["keepdim"])
    if canon in ("argmax", "argmin") and b["dim"] is None and keep:
        raise UnsupportedGraph("argmax over all dims with keepdim is not covered")
    if canon in ("sum", "prod", "amax", "amin", "argmax", "argmin"):
        return lw.red(canon, x, dims, keep)
    if canon == "mean":
        count = float(math.prod(shape[dims[0] : dims[1]]))
        return lw.ew("div", lw.red("sum", x, dims, keep), count)
    # logsumexp
    m = lw.red("amax", x, dims, True)
    s = lw.red("sum", lw.ew("exp", lw.ew("sub", x, m)), dims, True)
    out = lw.ew("add", lw.ew("log", s), m)
    return out if keep else _reduced_view(lw, out, shape, dims)


def _cosine_similarity(lw: LowerContext, b: dict[str, Any]) -> NodeRef:
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))`` over ``dim`` (PyTorch clamps each norm
    by ``eps``): the three sums reduce the same rows, so one kernel reads them once."""
    x1, x2 = lw.tensor(b["x1"], "cosine_similarity"), lw.tensor(b["x2"], "cosine_similarity")
    if lw.shape(x1) != lw.shape(x2):
        raise UnsupportedGraph(f"cosine_similarity of shapes {lw.shape(x1)} and {lw.shape(x2)} is not covered")
    eps, dim = b["eps"], b["dim"]
    if isinstance(eps, bool) or not isinstance(eps, int | float) or isinstance(dim, bool) or not isinstance(dim, int):
        raise UnsupportedGraph("cosine_similarity with a non-number eps or dim is not covered")
    dims = reduce_dims(lw.shape(x1), dim)

    def norm(x: NodeRef) -> NodeRef:
        return lw.ew("maximum", lw.ew("sqrt", lw.red("sum", lw.ew("mul", x, x), dims, False)), float(eps))

    dot = lw.red("sum", lw.ew("mul", x1, x2), dims, False)
    return lw.ew("div", dot, lw.ew("mul", norm(x1), norm(x2)))


def _diag(lw: LowerContext, b: dict[str, Any]) -> DiagRef:
    """``torch.diag`` of a vector (a matrix-product operand, see :class:`DiagRef`)."""
    v = lw.tensor(b["input"], "diag")
    if len(lw.shape(v)) != 1 or b.get("diagonal", 0) != 0:
        raise UnsupportedGraph("torch.diag is covered for a vector on the main diagonal only")
    return DiagRef(v)


def _diag_product(lw: LowerContext, a: object, w: object) -> NodeRef:
    """A matrix product with a :class:`DiagRef` operand: each row (or column) of the other one
    scaled by the vector. Equal to the reference's product for finite values (its other terms are
    exact zeros); an infinity in the other operand gives the reference NaN where this keeps it."""
    if isinstance(a, DiagRef) and isinstance(w, DiagRef):
        raise UnsupportedGraph("a product of two torch.diag matrices is not covered")
    left = isinstance(a, DiagRef)
    diag, other = (a, lw.tensor(w, "matmul operand")) if left else (w, lw.tensor(a, "matmul operand"))
    assert isinstance(diag, DiagRef)
    n, shape = lw.shape(diag.vector)[0], lw.shape(other)
    if len(shape) < 2 or shape[-2 if left else -1] != n:
        raise UnsupportedGraph(f"matmul of diag({n}) and {shape} does not match")
    # diag(v) @ b scales b's rows: v as a column; b @ diag(v) its columns: v broadcasts as a row
    return lw.ew("mul", lw.view(diag.vector, (n, 1)) if left else diag.vector, other)


def _matmul(lw: LowerContext, canon: str, b: dict[str, Any]) -> NodeRef:
    if canon == "matmul" and (isinstance(b["input"], DiagRef) or isinstance(b["other"], DiagRef)):
        return _diag_product(lw, b["input"], b["other"])
    x = lw.tensor(b["input"], canon)
    if canon == "linear":
        weight = param_or_arg(lw, b, "weight")
        if weight is None:
            raise UnsupportedGraph("linear without a weight")
        out = product(lw, x, lw.perm(weight))
        bias = param_or_arg(lw, b, "bias")
        return lw.ew("add", out, bias) if bias is not None else out
    return product(lw, x, lw.tensor(b["other"], "matmul operand"))


def _einsum(lw: LowerContext, b: dict[str, Any], traced: Any) -> object:
    """An ``einsum`` of two operands that is a matrix product as it stands; any other einsum is
    lowered by ``families/einsum.py`` (pairwise contractions)."""
    equation, operands = b.get("equation"), b.get("operands")
    if isinstance(equation, str) and isinstance(operands, tuple | list) and len(operands) == 2:
        done = _einsum_product(lw, equation, operands[0], operands[1])
        if done is not None:
            return done
    family = lower_fn("einsum")
    if family is None:
        raise UnsupportedGraph(f"einsum {equation!r} is not a matrix product the templates cover")
    return family(lw, "einsum", b, traced)


def _einsum_product(lw: LowerContext, equation: str, a: object, w: object) -> NodeRef | None:
    """One index contracted, the last of the first operand with the first (``...c,cn``) or last
    (``...c,nc``) of a matrix, or a batched product ``Pmc,Pcn->Pmn``; the output lists the free
    indices in operand order (``None``: another einsum)."""
    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq or eq.count(",") != 1:
        return None
    lhs, out = eq.split("->")
    x, y = lhs.split(",")
    a, w = lw.tensor(a, "einsum operand"), lw.tensor(w, "einsum operand")
    if len(set(x)) != len(x) or len(set(y)) != len(y) or len(x) != len(lw.shape(a)) or len(y) != len(lw.shape(w)):
        return None
    c = x[-1]
    if len(x) >= 2 and len(y) == 2 and c in y and set(x) & set(y) == {c}:
        n = y.replace(c, "")
        if out == x[:-1] + n:
            return product(lw, a, w if y[0] == c else lw.perm(w))
    batch = x[:-2]
    shared = set(x) & set(y) == {*batch, c}
    if len(x) >= 3 and y[:-2] == batch and y[-2] == c and shared and out == batch + x[-2] + y[-1]:
        return product(lw, a, w)
    return None


def _present(item: NodeRef | Absent | TupleRef) -> NodeRef | TupleRef:
    if isinstance(item, Absent):
        raise UnsupportedGraph(item.reason)
    return item


def _whole_slice(lw: LowerContext, x: object, index: object, traced: Any) -> bool:
    """Whether indexing ``x`` by ``index`` selects all of it, in order (plain slices from the start,
    step 1, that the traced result shows to end at each extent)."""
    if not isinstance(x, NodeRef) or not isinstance(traced, torch.Tensor) or tuple(traced.shape) != lw.shape(x):
        return False
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is Ellipsis or (isinstance(p, slice) and p.start in (None, 0) and p.step in (None, 1)) for p in parts)


_CAST_OPS = {target: op for op, target in CASTS.items()}


def _converted(lw: LowerContext, x: object, traced: Any) -> NodeRef:
    """``x.contiguous()``, ``.clone()``, ``.float()``, ``.half()``, ``.to(dtype)``, ``.type_as(y)``:
    ``x`` itself, or a conversion between float32, float16 and bfloat16 (an elementwise op,
    :data:`CASTS`); a bool mask becomes 1.0 where it is true and 0.0 elsewhere (``(x > 0).float()``),
    an int64 tensor its values as float32 (``ids.float()``, rounded as PyTorch rounds them)."""
    if not isinstance(traced, torch.Tensor) or not isinstance(x, NodeRef):
        raise UnsupportedGraph("a conversion of something that is not a tensor")
    target = str(traced.dtype).removeprefix("torch.")
    source = lw.node(x).dtype
    if target == source:
        return x
    if source in ("bool", "int64") and target in _CAST_OPS:
        values = lw.ew("where", x, 1.0, 0.0) if source == "bool" else lw.ew("int_to_float32", x)
        return values if target == "float32" else lw.ew(_CAST_OPS[target], values)
    if target not in _CAST_OPS or source not in ("float32", *HALF):
        raise UnsupportedGraph(f"a conversion from {source} to {target} is not covered (float32, float16, bfloat16)")
    return lw.ew(_CAST_OPS[target], x)


def _dims_arg(value: object, rank: int, what: str) -> list[int]:
    items = list(value) if isinstance(value, tuple | list) else [value]
    dims = [d for d in items if isinstance(d, int) and not isinstance(d, bool) and -max(rank, 1) <= d < max(rank, 1)]
    if len(dims) != len(items):
        raise UnsupportedGraph(f"{what} {value!r} of a {rank}-dim tensor is not valid")
    return [d % max(rank, 1) for d in dims]


def _dim_order(canon: str, b: dict[str, Any], rank: int) -> list[int]:
    """The source dim of each output dim of a transpose (``perm``: ``transpose``, ``swapaxes``,
    ``swapdims``, ``t``), a ``permute`` or a ``movedim``/``moveaxis``, as PyTorch orders them."""
    order = list(range(rank))
    if canon == "perm":
        a, c = _dims_arg([b["dim0"], b["dim1"]], rank, "transposing dims")
        if rank:
            order[a], order[c] = order[c], order[a]
        return order
    if canon == "permute":
        dims = _dims_arg(b["dims"], rank, "permuting dims")
        if sorted(dims) != order:
            raise UnsupportedGraph(f"permute by {b['dims']!r} of a {rank}-dim tensor is not a permutation")
        return dims
    source = _dims_arg(b["source"], rank, "movedim source")
    destination = _dims_arg(b["destination"], rank, "movedim destination")
    if len(source) != len(destination) or len(set(source)) != len(source) or len(set(destination)) != len(source):
        raise UnsupportedGraph(f"movedim from {b['source']!r} to {b['destination']!r} is not valid")
    moved = dict(zip(destination, source, strict=True))
    rest = iter(d for d in order if d not in source)
    return [moved[i] if i in moved else next(rest) for i in order]


def _other(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
    x = b.get("input")
    if canon == "view":
        if not isinstance(traced, torch.Tensor) or not isinstance(x, NodeRef):
            raise UnsupportedGraph("a view of something that is not a tensor")
        return lw.view(x, tuple(traced.shape))
    if canon == "alias":
        return _converted(lw, x, traced)
    if canon == "dropout":
        if number(b["p"], "p") != 0.0 and b["training"]:
            raise UnsupportedGraph("dropout with p > 0 in training mode is random; not covered")
        return lw.tensor(x, "dropout input")
    if canon in ("perm", "permute", "movedim"):
        t = lw.tensor(x, "transpose input")
        order = _dim_order(canon, b, len(lw.shape(t)))
        rank = len(order)
        if order == list(range(rank)):
            return t
        if order == [*range(rank - 2), rank - 1, rank - 2]:
            return lw.perm(t)  # read by strides where a product takes it; copied in order elsewhere
        permute = lower_fn("permute_dims")  # a copy in the permuted order: ``families/strided.py``
        assert permute is not None
        return permute(lw, "permute_dims", {"input": t, "dims": order}, traced)
    if canon == "getitem":
        if isinstance(x, TupleRef) and isinstance(b["index"], int):
            return _present(x.items[b["index"]])
        if _whole_slice(lw, x, b["index"], traced):
            return x  # ``mask[:, :, :T, :T]`` where T is the whole extent: the tensor itself
        index = b["index"]
        rows = lower_fn("index_select")
        int_rows = isinstance(index, NodeRef) and lw.node(index).dtype in INDEX_DTYPES and len(lw.shape(index)) == 1
        if isinstance(x, NodeRef) and int_rows and rows is not None:
            return rows(lw, "index_select", {"input": x, "dim": 0, "index": index}, traced)  # ``x[idx]``
        sliced = lower_fn("slice")  # ints, slices, None, Ellipsis: ``families/slicing.py``
        if isinstance(x, NodeRef) and sliced is not None:
            return sliced(lw, "slice", {"input": x, "index": index}, traced)
        raise UnsupportedGraph("indexing or slicing a tensor is not covered", op="getitem")
    if canon == "getattr":
        name = b["name"]
        if isinstance(x, TupleRef) and name in ("values", "indices"):
            return _present(x.items[0 if name == "values" else 1])
        if _is_id(x) and name in ("T", "mT"):
            t = lw.tensor(x, name)
            if name == "T" and len(lw.shape(t)) != 2:
                raise UnsupportedGraph(".T of a tensor that is not two-dimensional")
            return lw.perm(t)
        raise UnsupportedGraph(f"attribute .{name} is not covered")
    if _is_id(x):
        return _activation(lw, canon, lw.tensor(x, canon), b)
    raise UnsupportedGraph(f"{canon} is not covered", op=canon)
