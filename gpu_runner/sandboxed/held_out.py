"""Held-out shapes: other input shapes a task's reference accepts, drawn by the evaluator.

A candidate is checked at the reference's own input shapes and at a few others (issue 38), so a
kernel whose sizes are constants cannot pass for one a user can call at another batch size or
image size. The other shapes come from the task's own ``get_inputs``: a module-level integer that
only ``get_inputs`` reads (``batch_size``, ``height``, ``seq_len``; not one the model's
construction or forward reads, which would change the model) is set to another value while the
inputs are drawn (:func:`sized`). Which input dimensions each such size moves is found by drawing
the inputs on the meta device with it changed. The variants (:func:`derive`):

- the leading dimension halved and made odd (a random odd value between a quarter and a half);
- the other sizes changed by a non-power-of-two amount (to about three quarters, odd), with the
  leading dimension halved as above;
- a leading dimension of one;
- where the other sizes cannot all change at once (the reference refuses it), each alone.

A task may declare its dynamic dimensions instead, ``DYNAMIC_DIMS = {0: (1, 4096)}`` (a dimension
of its first tensor input, or the name of a module-level size, with the range it may take): then
only those move, to the range's ends and a random value between them. Each variant is kept only
where the reference's forward accepts it on the meta device (its outputs' shapes and dtypes come
from there) and where its inputs and outputs are no larger than the reference's own shapes' (the
memory plan counted those) nor than :data:`CAP_BYTES` or an eighth of them (a large task's
halved batch becomes fewer rows, still odd). Runs in the worker that measures the task, which never sees a
candidate; the random draws use the evaluator's own generator.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gpu_runner.sandboxed.common import flatten_outputs


class DeclarationError(ValueError):
    """The task's ``DYNAMIC_DIMS`` cannot be used as written (the task's fault: said in one line)."""


MAX_VARIANTS = 3
CAP_BYTES = 64 << 20
"""A held-out shape's inputs and outputs at most, or an eighth of the reference's where that is
more (the parent compares them on the host; the spare holds them beside its trials): edges and
odd sizes need no gigabytes."""

SHRINK_TRIES = 3
"""Times every moving size of a shape still too large is shrunk before the shape is dropped."""

BUDGET_S = 5.0
"""Seconds the derivation may take in all (the task's measurement has a bound: ``reference_first_run_s``)."""
DECLARED = "DYNAMIC_DIMS"


@contextlib.contextmanager
def sized(ns: dict[str, Any], overrides: Mapping[str, int] | None) -> Iterator[None]:
    """The task's module-level sizes set to ``overrides`` while inside (restored after)."""
    if not overrides:
        yield
        return
    saved = {name: ns[name] for name in overrides}
    try:
        ns.update({name: int(v) for name, v in overrides.items()})
        yield
    finally:
        ns.update(saved)


def _names_read(code: types.CodeType) -> set[str]:
    """Global names a code object and the code nested in it read."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names_read(const)
    return out


def _code_objects(value: Any, seen: set[int]) -> Iterator[types.CodeType]:
    """The code of a module-level function, or of a class's methods (nested classes too)."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, types.FunctionType):
        yield value.__code__
    elif isinstance(value, type):
        for attr in vars(value).values():
            inner = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
            if isinstance(inner, property):
                for f in (inner.fget, inner.fset, inner.fdel):
                    if f is not None:
                        yield from _code_objects(f, seen)
            else:
                yield from _code_objects(inner, seen)


def free_sizes(ns: dict[str, Any]) -> list[str]:
    """Module-level positive integers that ``get_inputs`` reads and no other code of the file does
    (the model's construction, its forward, ``get_init_inputs``, helpers: changing one of those
    changes the model, not only its inputs)."""
    get_inputs = ns.get("get_inputs")
    if not isinstance(get_inputs, types.FunctionType):
        return []
    read_by_inputs = _names_read(get_inputs.__code__)
    read_elsewhere: set[str] = set()
    seen: set[int] = {id(get_inputs)}
    module = ns.get("__name__")
    for name, value in ns.items():
        if name.startswith("__") or getattr(value, "__module__", module) != module:
            continue
        for code in _code_objects(value, seen):
            read_elsewhere |= _names_read(code)
    return [
        name
        for name, value in ns.items()
        if type(value) is int and value >= 1 and name in read_by_inputs and name not in read_elsewhere
    ]


def _tensor_shapes(values: list[Any]) -> list[tuple[int, ...] | None]:
    return [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in values]


def _draw(ns: dict[str, Any], overrides: Mapping[str, int] | None) -> list[Any]:
    with sized(ns, overrides), torch.device("meta"):
        values = list(ns["get_inputs"]())
    return [v.to("meta") if isinstance(v, torch.Tensor) else v for v in values]


def _moves(ns: dict[str, Any], name: str, base: list[tuple[int, ...] | None]) -> set[tuple[int, int]]:
    """The (input, dimension) pairs whose size follows ``name`` (drawn with it changed)."""
    value = int(ns[name])
    probe = value + 3 if value > 1 else 5
    try:
        moved = _tensor_shapes(_draw(ns, {name: probe}))
    except Exception:  # noqa: BLE001 - a size get_inputs cannot take another value of
        return set()
    out: set[tuple[int, int]] = set()
    for i, (a, b) in enumerate(zip(base, moved, strict=False)):
        if a is None or b is None or len(a) != len(b):
            continue
        out |= {(i, d) for d, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}
    return out


def _odd_half(value: int, rng: random.Random) -> int:
    """A random odd value between a quarter and a half of ``value`` (1 for 2 or 3)."""
    lo, hi = max(1, value // 4), max(1, value // 2)
    return rng.randrange(lo | 1, max(lo | 1, hi) + 1, 2) if hi > 1 else 1


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"


def _odd(value: int) -> int:
    """``value`` made odd (down), at least 1."""
    return max(1, value - 1 if value > 1 and value % 2 == 0 else value)


def _three_quarters(value: int) -> int:
    """About three quarters of ``value``, odd: a non-power-of-two change."""
    return max(1, (value * 3 // 4) | 1) if value > 2 else value


def _nbytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _metas(outs: list[Any]) -> list[dict[str, Any]]:
    return [
        {"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape), "nbytes": o.numel() * o.element_size()}
        for o in outs
        if isinstance(o, torch.Tensor)
    ]


def _declared(ns: dict[str, Any], moves: dict[str, set[tuple[int, int]]]) -> dict[str, tuple[int, int]] | str:
    """``DYNAMIC_DIMS`` as ranges per module-level size, or why it cannot be used."""
    spec = ns.get(DECLARED)
    if not isinstance(spec, dict) or not spec:
        return f"{DECLARED} must be a dict of dimension (or size name) to (low, high), got {spec!r}"
    out: dict[str, tuple[int, int]] = {}
    for key, bounds in spec.items():
        if not (isinstance(bounds, tuple | list) and len(bounds) == 2 and all(type(b) is int for b in bounds)):
            return f"{DECLARED}[{key!r}] must be (low, high) integers, got {bounds!r}"
        lo, hi = int(bounds[0]), int(bounds[1])
        if not 1 <= lo <= hi:
            return f"{DECLARED}[{key!r}] must have 1 <= low <= high, got {bounds!r}"
        if isinstance(key, str):
            if key not in moves:
                return f"{DECLARED} names {key!r}, which is not a module-level size only get_inputs reads"
            out[key] = (lo, hi)
            continue
        if type(key) is not int:
            return f"{DECLARED} keys are dimensions of the first tensor input or size names, got {key!r}"
        owners = [name for name, dims in moves.items() if (0, key) in dims]
        if not owners:
            return (
                f"{DECLARED}[{key}]: no module-level size that only get_inputs reads sets dimension {key} of "
                "the first input (name the size instead)"
            )
        out[owners[0]] = (lo, hi)
    return out


def derive(
    ns: dict[str, Any],
    rng: random.Random | None = None,
    *,
    base_bytes: int | None = None,
    forward_s: float = 0.0,
    budget_s: float = BUDGET_S,
    cap_bytes: int = CAP_BYTES,
    model: Any = None,
    base_inputs: list[Any] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The task's held-out shapes (each: ``overrides``, ``label``, ``inputs``, ``out_metas``,
    ``nbytes``) and a note on how they were drawn (or why there are none); raises
    :class:`DeclarationError` where the task's ``DYNAMIC_DIMS`` cannot be used.

    ``base_bytes``: one trial's inputs and outputs at the reference's shapes (measured here where
    not given); ``forward_s``: how long the reference's meta forward took; ``model`` and
    ``base_inputs``: the measurement's meta model and inputs (built here where not given). A shape whose forward
    would end past ``budget_s`` is not tried (the task's measurement is bounded as a whole). A
    shape's inputs and outputs together are at most the reference's own and ``cap_bytes`` or an
    eighth of the reference's, whichever is more: where a halved batch is larger, fewer rows (odd)
    are drawn."""
    rng = rng or random.Random()
    started = time.monotonic()
    if base_inputs is None:
        base_inputs = _draw(ns, None)
    if not any(isinstance(v, torch.Tensor) for v in base_inputs):
        return [], "no tensor input"
    first = next(i for i, v in enumerate(base_inputs) if isinstance(v, torch.Tensor))
    base = _tensor_shapes(base_inputs)
    moves = {name: m for name in free_sizes(ns) if (m := _moves(ns, name, base))}
    proposals: list[dict[str, int]] = []
    lead: list[str] = []
    if DECLARED in ns:
        declared = _declared(ns, moves)
        if isinstance(declared, str):
            raise DeclarationError(declared)
        for pick in ("low", "draw", "high"):
            over = {}
            for name, (lo, hi) in declared.items():
                over[name] = lo if pick == "low" else hi if pick == "high" else rng.randint(lo, hi)
            proposals.append(over)
        how = f"{DECLARED} {dict(ns[DECLARED])!r}"
    else:
        if not moves:
            return [], "get_inputs reads no module-level size that only it reads (its shapes are fixed)"
        lead = [name for name, dims in moves.items() if (first, 0) in dims]
        rest = [name for name in moves if name not in lead]
        halved = {name: _odd_half(int(ns[name]), rng) for name in lead}
        if halved:
            proposals.append(halved)
        others = {name: _three_quarters(int(ns[name])) for name in rest}
        if others:
            proposals.append({**halved, **others})
        if lead:
            proposals.append(dict.fromkeys(lead, 1))
        if len(others) > 1:  # where they cannot all move at once: one at a time (if room is left)
            proposals += [{**halved, name: value} for name, value in others.items()]
        how = "module-level sizes " + ", ".join(f"{n}={ns[n]}" for n in moves)
    if model is None:  # the measurement's own meta model, where it passes it
        with torch.device("meta"):
            model = ns["Model"](*list(ns["get_init_inputs"]()))
    if base_bytes is None:
        t0 = time.monotonic()
        base_bytes = _nbytes(base_inputs) + _nbytes(_forward(model, base_inputs))
        forward_s = time.monotonic() - t0
    limit = min(base_bytes, max(cap_bytes, base_bytes // 8))
    variants: list[dict[str, Any]] = []
    seen: set[tuple[tuple[int, ...] | None, ...]] = {tuple(base)}
    dropped: list[str] = []

    def attempt(over: dict[str, int]) -> tuple[list[Any], list[Any]] | str:
        """The inputs and outputs at ``over``, or why there are none."""
        if time.monotonic() - started + forward_s > budget_s:
            return f"the reference's meta forward takes {forward_s:.1f} s: out of time"
        try:
            inputs = _draw(ns, over)
            return inputs, _forward(model, inputs)
        except Exception as exc:  # noqa: BLE001 - the reference does not take this shape: not a check
            return f"the reference refuses it: {type(exc).__name__}"

    for proposal in proposals:
        over = {k: v for k, v in proposal.items() if v != ns[k]}
        got = attempt(over)
        nbytes = _nbytes(got[0]) + _nbytes(got[1]) if not isinstance(got, str) else 0
        shrink = [name for name in lead if name in over and over[name] > 1]
        if nbytes > limit and shrink:  # a large task: fewer rows, still odd
            over = {**over, **{name: _odd(int(over[name] * limit / nbytes)) for name in shrink}}
            got = attempt(over)
            nbytes = _nbytes(got[0]) + _nbytes(got[1]) if not isinstance(got, str) else 0
        for _ in range(SHRINK_TRIES):
            if nbytes <= limit or DECLARED in ns:
                break
            # still too large where a tensor's size is not the rows' (a product's K x N weight):
            # every moving size shrinks by the square root of the excess (odd), so a large
            # product is still checked at shapes of its own (KernelBench L1-2: its halved M drew
            # 143 MiB against 64 MiB, and no shape was checked)
            scale = math.sqrt(limit / nbytes) * 0.95
            over = {
                **over,
                **{n: _odd(int(over.get(n, ns[n]) * scale)) for n in moves if int(over.get(n, ns[n])) > 2},
            }
            got = attempt(over)
            nbytes = _nbytes(got[0]) + _nbytes(got[1]) if not isinstance(got, str) else 0
        label = ", ".join(f"{k}={v}" for k, v in over.items())
        if isinstance(got, str):
            dropped.append(f"{label} ({got})")
            continue
        inputs, outs = got
        shapes = tuple(_tensor_shapes(inputs))
        if not over or shapes in seen:
            continue
        if nbytes > limit:
            dropped.append(f"{label} (its inputs and outputs, {_size(nbytes)}, exceed {_size(limit)})")
            continue
        seen.add(shapes)
        drawn = ", ".join(str(tuple(s)) for s in shapes if s is not None)
        variants.append(
            {
                "overrides": over,
                "label": f"{label}: inputs {drawn}",
                "inputs": [list(s) for s in shapes if s is not None],
                "out_metas": _metas(outs),
                "nbytes": nbytes,
            }
        )
        if len(variants) >= MAX_VARIANTS:
            break
    note = how + ("; not checked: " + "; ".join(dropped) if dropped else "")
    return variants, note


def _forward(model: Any, inputs: list[Any]) -> list[Any]:
    with torch.no_grad():
        return flatten_outputs(model(*inputs))
