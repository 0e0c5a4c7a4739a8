"""Trusted arithmetic of the verdict, in the parent: output comparison, timing statistics, speed of light.

Inputs are numpy arrays decoded from the wire and raw timing samples; nothing here trusts a
number the worker computed about itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_runner.stats import NOISE_FACTOR, median_rel_stderr
from schemas import LOWER_PRECISION, Correctness, PrecisionMode, SpeedOfLight, TimerKind, TimingStats

Array = npt.NDArray[Any]


@dataclass
class TrialCheck:
    """How one trial's outputs compared."""

    ok: bool
    category: str | None = None
    detail: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    err64: float | None = None
    ref_err64: float | None = None
    default_err64: float | None = None
    """The reference's relative L2 error at PyTorch's defaults (where precision parity applied)."""
    mismatch_fraction: float | None = None
    first_bad: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ParityError:
    """An output's error against float64 when the reference runs with PyTorch's defaults (TF32 in
    cuDNN convolutions, say), measured by the referee: the precision the user's own model has."""

    rel_l2: float
    """Relative L2 error."""
    max_rms: float
    """Largest absolute error over the truth's RMS (scaled by each trial's own RMS)."""


PARITY_FACTOR = 3.0
"""A candidate's relative L2 error against float64 may be this many times the reference's at
PyTorch's defaults. Operands rounded to TF32 as cuDNN rounds them err about as much (1.01x on the
CPU test's matmul); Triton's TF32, which truncates them, erred 2.7x and 3.4x cuDNN's on two
KernelBench convolutions on an H200; operands rounded to bfloat16 8x (the CPU test)."""


@dataclass(frozen=True)
class PrecisionRule:
    """How far from float64 a candidate may be: ``factor`` times the IEEE float32 reference's
    error, and, per output where the referee measured it (``parity``), ``parity_factor`` times
    the error of the reference run with PyTorch's defaults (precision parity)."""

    factor: float = 10.0
    parity: tuple[ParityError | None, ...] = ()
    parity_factor: float = PARITY_FACTOR

    @property
    def mode(self) -> str:
        """``reference`` where some output's bar is the defaults' precision, else ``exact``."""
        return "reference" if any(p is not None for p in self.parity) else "exact"

    @classmethod
    def of(
        cls, factor: float, default_errors: Any, parity: bool = True, parity_factor: float = PARITY_FACTOR
    ) -> PrecisionRule:
        """The rule from the config's factor and the referee's ``default_errors`` (its
        ``task_ready``; ignored unless ``parity``)."""
        found: list[ParityError | None] = []
        if parity and isinstance(default_errors, list):
            found = [_parity_error(item) for item in default_errors]
        return cls(factor=factor, parity=tuple(found), parity_factor=parity_factor)

    def on_trial(self, measured: Any) -> PrecisionRule:
        """The rule of one trial whose inputs the referee also ran at PyTorch's defaults
        (``measured``: per output, its error against float64 there, or None): per output the rule
        grants precision to, that error instead of the task's calibration draw's. The calibration
        is one draw; the largest error of KernelBench L2-52's TF32 convolution + batch norm at the
        range scale 1e6 spans 0.008 to 0.34 of the outputs' RMS from draw to draw, and a candidate
        that erred exactly as the user's model did on its trial's inputs was refused (1 run in 12)."""
        if not isinstance(measured, list) or not any(p is not None for p in self.parity):
            return self
        parity = [
            _kept(_parity_error(measured[i]), p) if p is not None and i < len(measured) else p
            for i, p in enumerate(self.parity)
        ]
        return replace(self, parity=tuple(parity))


FALLBACK_RATIO = 100.0
"""A measure of the reference at PyTorch's defaults whose relative L2 error is this many times
below the task's calibration did not run as the user's model runs: cuDNN, short of device memory
for the workspace of its TF32 algorithm, took one without workspace, in IEEE fp32 (TF32 errs about
1e3 times IEEE fp32 on a convolution; draws of one task differ by far less). On an H100 the
referee of KernelBench L1-57 (a transposed convolution of 2 GiB in and out), started again beside
a full GPU, measured its defaults at 2.2e-07 where its first start had 2.7e-04: the TF32 the
user's model runs was refused as a downcast and the eager baseline was timed 4x slower than it
runs. Such a measure is kept out: the earlier one stands (:meth:`PrecisionRule.on_trial`,
:func:`kept_defaults`)."""


def fell_back(measured: ParityError, task: ParityError) -> bool:
    """Whether ``measured`` is far more precise than the task's calibration ``task``
    (:data:`FALLBACK_RATIO`): the defaults' algorithm changed under memory pressure."""
    return measured.rel_l2 * FALLBACK_RATIO < task.rel_l2


def _kept(measured: ParityError | None, task: ParityError) -> ParityError:
    """A trial's own measure of the defaults where there is one and it did not fall back, else
    the task's."""
    return task if measured is None or fell_back(measured, task) else measured


def kept_defaults(first: dict[str, Any], again: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """A restarted referee's ``task_ready`` (``again``) with the first start's measures of the
    defaults (``first``) kept per output where the new one fell back (:func:`fell_back`): the
    first start measures beside an idle GPU, a restart beside spares and a running candidate.
    Returns the header and the outputs whose measure was kept (typical draws'; range scales'
    too where both starts drew at the same scales)."""
    merged = dict(again)
    kept: list[int] = []

    def merge(old: Any, new: Any) -> Any:
        if isinstance(old, list) and new is None:  # no measure at all (bit for bit IEEE, or no room)
            new = [None] * len(old)
        if not isinstance(old, list) or not isinstance(new, list) or len(old) != len(new):
            return new
        out = list(new)
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            was, now = _parity_error(a), _parity_error(b)
            if was is not None and (now is None or fell_back(now, was)):
                out[i] = a
                if i not in kept:
                    kept.append(i)
        return out

    merged["default_errors"] = merge(first.get("default_errors"), again.get("default_errors"))
    old_r, new_r = first.get("range_default_errors"), again.get("range_default_errors")
    if first.get("range_scales") == again.get("range_scales") and isinstance(old_r, list) and isinstance(new_r, list):
        merged["range_default_errors"] = [merge(a, b) for a, b in zip(old_r, new_r, strict=False)]
        merged["range_default_errors"] += new_r[len(old_r) :]
    return merged, sorted(kept)


def raise_defaults(calibration: Any, measured: Any) -> list[int]:
    """Raise a task's calibration of the reference at PyTorch's defaults (``calibration``: the
    referee's ``default_errors``, changed in place) per output to a trial's own measure on inputs
    drawn at scale 1 (``measured``) where the calibration is the one that fell back: the trial's
    measure is :data:`FALLBACK_RATIO` times above it (:func:`fell_back`, the roles swapped).
    Returns the outputs raised. The least precise genuine measure stands: on an H100 the referee
    of KernelBench L3-25 (grouped 1x1 convolutions) measured its defaults at 4.3e-07 at start-up,
    beside the spares starting (cuDNN without the workspace of its TF32 algorithm), and its later
    trials at 3.5e-04, as the user's model runs; the one-pass TF32 candidates judged on trials
    that fell back too were refused as downcasts. A measure below the calibration changes nothing
    (:meth:`PrecisionRule.on_trial` keeps such a trial to the calibration)."""
    if not isinstance(calibration, list) or not isinstance(measured, list) or len(calibration) != len(measured):
        return []
    raised: list[int] = []
    for i, (old, new) in enumerate(zip(calibration, measured, strict=True)):
        was, now = _parity_error(old), _parity_error(new)
        if was is not None and now is not None and fell_back(was, now):
            calibration[i] = dict(new)
            raised.append(i)
    return raised


def release_fallbacks(ranged: Any, calibration: list[Any]) -> list[int]:
    """A range scale's calibration (``ranged``, changed in place) with each output's measure that
    fell back beside the typical draws' raised ``calibration`` set to None (the typical draws'
    then holds at that scale: :func:`defaults_at`). Returns the outputs released."""
    if not isinstance(ranged, list) or len(ranged) != len(calibration):
        return []
    released: list[int] = []
    for i, (old, typical) in enumerate(zip(ranged, calibration, strict=True)):
        was, now = _parity_error(old), _parity_error(typical)
        if was is not None and now is not None and fell_back(was, now):
            ranged[i] = None
            released.append(i)
    return released


def _parity_error(item: Any) -> ParityError | None:
    """A referee's measure of one output's error at PyTorch's defaults (None where it is not one)."""
    ok = isinstance(item, dict) and all(
        isinstance(item.get(k), int | float) and np.isfinite(item[k]) and item[k] >= 0 for k in ("rel_l2", "max_rms")
    )
    return ParityError(float(item["rel_l2"]), float(item["max_rms"])) if ok else None


def precision_rule(
    cfg: Any, info: dict[str, Any], mode: str | None = None, scale: float = 1.0, measured: Any = None
) -> PrecisionRule:
    """The rule of a task's trials drawn at ``scale``: ``cfg`` (a
    :class:`gpu_runner.config.RunnerConfig`: its factor, its ``precision`` mode, its parity
    factor), the job's ``mode`` (None: the config's) and the referee's ``task_ready`` ``info``;
    ``measured``: the trial's own error at PyTorch's defaults (:meth:`PrecisionRule.on_trial`)."""
    parity = (mode or cfg.precision) == "reference"
    defaults = defaults_at(info, scale)
    return PrecisionRule.of(cfg.precision_factor, defaults, parity, cfg.precision_parity_factor).on_trial(measured)


def parity_outputs(info: dict[str, Any]) -> list[bool]:
    """Per output, whether the referee measured the reference's error at PyTorch's defaults at
    some scale (``task_ready`` ``info``): the outputs whose trials it measures again, on each
    trial's own inputs."""
    base = info.get("default_errors")
    if not isinstance(base, list):
        return []
    found = [isinstance(item, dict) for item in base]
    for ranged in info.get("range_default_errors") or []:
        if isinstance(ranged, list) and len(ranged) == len(found):
            found = [f or isinstance(item, dict) for f, item in zip(found, ranged, strict=True)]
    return found if any(found) else []


def defaults_at(info: dict[str, Any], scale: float) -> Any:
    """The referee's measure of the reference's error at PyTorch's defaults for trials drawn at
    ``scale``: at a range trial's scale, the one it took there (``range_default_errors``, beside
    ``range_scales``), per output, the typical draws' where it has none; else the typical draws'."""
    base = info.get("default_errors")
    if scale == 1.0 or not isinstance(base, list):
        return base
    for at, found in zip(info.get("range_scales") or [], info.get("range_default_errors") or [], strict=False):
        if float(at) == scale and isinstance(found, list) and len(found) == len(base):
            return [f if f is not None else b for f, b in zip(found, base, strict=True)]
    return base


def as_rule(rule: PrecisionRule | float) -> PrecisionRule:
    return rule if isinstance(rule, PrecisionRule) else PrecisionRule(factor=float(rule))


CHUNK = 1 << 20
"""Elements compared per step. Each numpy call gives the GIL back and takes it again; with 1 << 18
a 16M-element output took ~1000 such round trips, and comparisons in several threads beside a
busy event loop stretched from 0.2 s to several seconds (convoying on the GIL). 8 MB float64
temporaries per step are the price."""


CHECKSUM_CHUNK = 1 << 24
"""Words per step of :func:`host_checksum` (the same steps as the worker's ``checksum``)."""


def host_checksum(array: Array) -> int:
    """The worker's ``gpu_runner.sandboxed.common.checksum`` of a tensor, computed here from its
    bytes: int32 words weighted by ``position % 65521 + 1``, summed in int64 per step (wrapping as
    torch's sum does), the steps added exactly."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, dtype=np.uint8)])
    words = raw.view(np.int32)
    total = 0
    with np.errstate(over="ignore"):
        for lo in range(0, words.size, CHECKSUM_CHUNK):
            part = words[lo : lo + CHECKSUM_CHUNK].astype(np.int64)
            weights = np.arange(lo, lo + part.size, dtype=np.int64) % 65521 + 1
            total += int(np.multiply(part, weights).sum(dtype=np.int64))
    return total


def compare_trial(*args: Any) -> TrialCheck:
    """Compare one trial (see :func:`_compare_trial`); garbage outputs may hold any bit pattern."""
    with np.errstate(all="ignore"):
        return _compare_trial(*args)


@dataclass
class _Scan:
    """What one pass over an output found (sums of squares for the errors against float64)."""

    size: int
    nan_bad: int = 0
    nan_first: int | None = None
    outside: int = 0
    outside_first: int | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    sq_err: float = 0.0
    sq_ref_err: float = 0.0
    sq_exact: float = 0.0
    truth_excess: float = float("-inf")
    """Over the elements outside the tolerance: the most by which one misses the float64 truth
    (``|c - t| - (atol + rtol * |t|)``); -inf when none is outside or there is no truth."""
    ref_err_max: float = 0.0
    """The eager reference's largest absolute error against the float64 truth."""


def _noise(scan: _Scan, outside: Array, err: Array, exact: Array, d64: Array, atol: float, rtol: float) -> None:
    """Add a chunk's :attr:`_Scan.truth_excess` and :attr:`_Scan.ref_err_max` (``err`` is ``c - t``)."""
    if d64.size:
        scan.ref_err_max = max(scan.ref_err_max, float(np.abs(d64).max()))
    if outside.any():
        miss = np.abs(err[outside]) - (atol + rtol * np.abs(exact[outside]))
        scan.truth_excess = max(scan.truth_excess, float(miss.max()))


def _first(mask: Array, offset: int) -> int | None:
    hits = np.flatnonzero(mask)
    return offset + int(hits[0]) if hits.size else None


def _scan(c: Array, r: Array, residual: Array | None, atol: float, rtol: float) -> _Scan:
    """One chunked pass: finiteness, element-wise tolerance, and the error sums against float64.

    ``residual`` is the float64 truth minus the reference, so the truth is ``r + residual``.
    """
    cf, rf = c.reshape(-1), r.reshape(-1)
    df = residual.reshape(-1) if residual is not None else None
    scan = _Scan(size=cf.size)
    for lo in range(0, cf.size, CHUNK):
        hi = min(lo + CHUNK, cf.size)
        d = None if df is None else df[lo:hi]
        if not _fast_chunk(scan, lo, cf[lo:hi], rf[lo:hi], d, atol, rtol):
            _exact_chunk(scan, lo, cf[lo:hi], rf[lo:hi], d, atol, rtol)
    return scan


def _fast_chunk(scan: _Scan, lo: int, c: Array, r: Array, d: Array | None, atol: float, rtol: float) -> bool:
    """A chunk where everything is finite, in few passes; False (nothing added) where it is not.

    ``|c - r|`` in float64 is finite exactly when both are (float32 or float16 values cannot
    overflow the difference), so its maximum stands in for two ``isfinite`` passes; the same
    holds for the sums of squares of the residual and the truth. A chunk that fails goes to
    :func:`_exact_chunk`, which locates the NaN/Inf.
    """
    c64, r64 = c.astype(np.float64), r.astype(np.float64)
    diff = np.subtract(c64, r64)
    np.abs(diff, out=diff)
    top = float(diff.max()) if diff.size else 0.0
    if not np.isfinite(top):
        return False
    sq = (0.0, 0.0, 0.0)
    truth: tuple[Array, Array, Array] | None = None
    if d is not None:
        d64 = d.astype(np.float64)
        exact = np.add(r64, d64)
        err = np.subtract(c64, exact, out=c64)
        sq = (
            float(np.einsum("i,i->", err, err)),
            float(np.einsum("i,i->", d64, d64)),
            float(np.einsum("i,i->", exact, exact)),
        )
        if not all(np.isfinite(x) for x in sq):
            return False
        truth = (err, exact, d64)
    r_abs = np.abs(r64, out=r64)
    bound = np.multiply(r_abs, rtol)
    bound += atol
    outside = np.greater(diff, bound)
    n_out = int(np.count_nonzero(outside))
    if truth is not None:
        _noise(scan, outside, *truth, atol, rtol)
    if n_out:
        scan.outside += n_out
    if diff.size:
        scan.max_abs = max(scan.max_abs, top)
        np.maximum(r_abs, atol, out=r_abs)
        scan.max_rel = max(scan.max_rel, float(np.divide(diff, r_abs, out=diff).max()))
    scan.sq_err += sq[0]
    scan.sq_ref_err += sq[1]
    scan.sq_exact += sq[2]
    if n_out and scan.outside_first is None:
        scan.outside_first = _first(outside, lo)
    return True


def _exact_chunk(scan: _Scan, lo: int, c: Array, r: Array, d: Array | None, atol: float, rtol: float) -> None:
    """A chunk with NaN/Inf somewhere: where they disagree, and the rest compared where the reference is finite."""
    c64, r64 = c.astype(np.float64), r.astype(np.float64)
    c_fin, r_fin = np.isfinite(c64), np.isfinite(r64)
    nan_bad = (c_fin != r_fin) | (np.isnan(c64) != np.isnan(r64))
    n_bad = int(np.count_nonzero(nan_bad))
    if n_bad:
        scan.nan_bad += n_bad
        if scan.nan_first is None:
            scan.nan_first = _first(nan_bad, lo)
    # Where the reference is NaN/Inf (and the candidate matches it) nothing more is compared.
    c64, r64 = np.where(r_fin, c64, 0.0), np.where(r_fin, r64, 0.0)
    diff = np.abs(np.subtract(c64, r64))
    r_abs = np.abs(r64)
    outside = diff > r_abs * rtol + atol
    n_out = int(np.count_nonzero(outside))
    if n_out:
        scan.outside += n_out
        if scan.outside_first is None:
            scan.outside_first = _first(outside, lo)
    if diff.size:
        scan.max_abs = max(scan.max_abs, float(diff.max()))
        scan.max_rel = max(scan.max_rel, float((diff / np.maximum(r_abs, atol)).max()))
    if d is not None:
        d64 = d.astype(np.float64)
        exact = r64 + d64
        fin = np.isfinite(exact) & r_fin
        exact, d64, c64 = np.where(fin, exact, 0.0), np.where(fin, d64, 0.0), np.where(fin, c64, 0.0)
        err = c64 - exact
        scan.sq_err += float(np.einsum("i,i->", err, err))
        scan.sq_ref_err += float(np.einsum("i,i->", d64, d64))
        scan.sq_exact += float(np.einsum("i,i->", exact, exact))
        _noise(scan, outside & fin, err, exact, d64, atol, rtol)


def _rel(sq_num: float, sq_den: float) -> float:
    num = float(np.sqrt(sq_num))
    return num / float(np.sqrt(sq_den)) if sq_den > 0 else num


def _index(flat: int | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if flat is None:
        return None
    return tuple(int(x) for x in np.unravel_index(flat, shape)) if shape else ()


def _compare_trial(
    cand: list[Array],
    cand_dtypes: list[str],
    ref: list[Array],
    ref_dtypes: list[str],
    residuals: list[Array | None] | None,
    tolerances: dict[str, tuple[float, float]],
    floors: dict[str, float],
    factor: PrecisionRule | float,
) -> TrialCheck:
    """Compare one trial: count, shape, dtype, NaN/Inf, element-wise tolerance, precision vs float64.

    ``residuals[i]`` (when given) is the float64 reference's output ``i`` minus the reference's
    own output, so the exact values are ``ref[i] + residuals[i]`` (sent this way because the
    difference fits float32 without loss that matters, at half the bytes of float64).
    """

    def residual_of(i: int) -> Array | None:
        residual = residuals[i] if residuals is not None and i < len(residuals) else None
        return residual if residual is not None and residual.shape == ref[i].shape else None

    def exact(i: int) -> tuple[int, int | None]:
        bad = (cand[i] != ref[i]).reshape(-1)
        return int(np.count_nonzero(bad)), _first(bad, 0)

    def scan(i: int, atol: float, rtol: float) -> _Scan:
        return _scan(cand[i], ref[i], residual_of(i), atol, rtol)

    return decide(
        [tuple(c.shape) for c in cand],
        cand_dtypes,
        [tuple(r.shape) for r in ref],
        ref_dtypes,
        [residual_of(i) is not None for i in range(len(ref))] if len(cand) == len(ref) else [],
        exact,
        scan,
        tolerances,
        floors,
        factor,
    )


def scan_from_wire(info: dict[str, Any]) -> _Scan:
    """A :class:`_Scan` as the judge sends it (numbers only; anything else is a protocol error)."""

    def opt(key: str) -> int | None:
        value = info.get(key)
        return None if value is None else int(value)

    return _Scan(
        size=int(info["size"]),
        nan_bad=int(info["nan_bad"]),
        nan_first=opt("nan_first"),
        outside=int(info["outside"]),
        outside_first=opt("outside_first"),
        max_abs=float(info["max_abs"]),
        max_rel=float(info["max_rel"]),
        sq_err=float(info["sq_err"]),
        sq_ref_err=float(info["sq_ref_err"]),
        sq_exact=float(info["sq_exact"]),
        truth_excess=float(info["truth_excess"]),
        ref_err_max=float(info["ref_err_max"]),
    )


def decide(
    cand_shapes: list[tuple[int, ...]],
    cand_dtypes: list[str],
    ref_shapes: list[tuple[int, ...]],
    ref_dtypes: list[str],
    has_residual: list[bool],
    exact: Any,
    scan: Any,
    tolerances: dict[str, tuple[float, float]],
    floors: dict[str, float],
    factor: PrecisionRule | float,
) -> TrialCheck:
    """The verdict on one trial from its outputs' shapes and dtypes and, per output, ``exact(i)``
    (mismatches and the first, for outputs compared exactly) or ``scan(i, atol, rtol)`` (the
    tolerance and float64 sums); the scans may come from numpy here or from the judge's GPU."""
    if len(cand_shapes) != len(ref_shapes):
        return TrialCheck(
            False, "incorrect.shape", f"{len(cand_shapes)} outputs, the reference returns {len(ref_shapes)}"
        )
    rule = as_rule(factor)
    worst = TrialCheck(True)
    for i, (cs, rs, cd, rd) in enumerate(zip(cand_shapes, ref_shapes, cand_dtypes, ref_dtypes, strict=True)):
        if cs != rs:
            return TrialCheck(False, "incorrect.shape", f"output {i}: shape {list(cs)}, expected {list(rs)}")
        if cd != rd:
            return TrialCheck(False, "incorrect.precision", f"output {i}: dtype {cd}, expected {rd}")
        if rd not in tolerances:
            mismatches, first = exact(i)
            if mismatches:
                size = int(np.prod(rs)) if rs else 1
                return TrialCheck(
                    False,
                    "incorrect.other",
                    f"output {i} ({rd}) differs",
                    first_bad=_index(first, rs),
                    mismatch_fraction=mismatches / max(1, size),
                )
            continue
        atol, rtol = tolerances[rd]
        with_residual = i < len(has_residual) and has_residual[i]
        scan_i: _Scan = scan(i, atol, rtol)
        # Elements outside the tolerance around the reference are forgiven when each is within it
        # around the float64 truth plus the reference's own error (``gpu_runner.stats.NOISE_FACTOR``).
        # Under precision parity the reference's own error is the one it has at PyTorch's
        # defaults where that is larger (scaled to this trial's outputs).
        par = rule.parity[i] if i < len(rule.parity) else None
        noise = scan_i.ref_err_max
        if par is not None and scan_i.size and scan_i.sq_exact > 0:
            noise = max(noise, par.max_rms * math.sqrt(scan_i.sq_exact / scan_i.size))
        forgiven = with_residual and scan_i.truth_excess <= NOISE_FACTOR * noise
        outside = 0 if forgiven else scan_i.outside
        if scan_i.nan_bad:
            frac = scan_i.nan_bad / scan_i.size
            return TrialCheck(
                False,
                "incorrect.nan_inf",
                f"output {i}: NaN/Inf not where the reference has them (where it has none, or finite values "
                f"where it has NaN/Inf: {frac:.1%} of elements)",
                first_bad=_index(scan_i.nan_first, rs),
                mismatch_fraction=frac,
            )
        worst.max_abs, worst.max_rel = max(worst.max_abs, scan_i.max_abs), max(worst.max_rel, scan_i.max_rel)
        frac = outside / scan_i.size if scan_i.size else 0.0
        # A few elements outside the tolerance point at an indexing or boundary bug: say where.
        # Many, together with a large error against float64, point at the precision.
        if with_residual and not (outside and frac < 0.05):
            err, ref_err = _rel(scan_i.sq_err, scan_i.sq_exact), _rel(scan_i.sq_ref_err, scan_i.sq_exact)
            worst.err64 = max(worst.err64 or 0.0, err)
            worst.ref_err64 = max(worst.ref_err64 or 0.0, ref_err)
            bar = max(rule.factor * ref_err, floors.get(rd, 0.0))
            if par is not None:
                worst.default_err64 = max(worst.default_err64 or 0.0, par.rel_l2)
                bar = max(bar, rule.parity_factor * par.rel_l2)
            if err > bar:
                has = (
                    f"the reference has {ref_err:.2e} in IEEE float32 and {par.rel_l2:.2e} at PyTorch's defaults"
                    if par is not None
                    else f"the eager reference has {ref_err:.2e}"
                )
                return TrialCheck(
                    False,
                    "incorrect.precision",
                    f"output {i}: relative L2 error {err:.2e} against float64, {has} (bar {bar:.2e}): "
                    f"{LOWER_PRECISION} (TF32/bf16?)",
                    max_abs=scan_i.max_abs,
                    max_rel=scan_i.max_rel,
                    err64=err,
                    ref_err64=ref_err,
                    default_err64=worst.default_err64,
                    mismatch_fraction=frac,
                )
        if outside:
            category = "incorrect.boundary" if frac < 0.05 else "incorrect.other"
            return TrialCheck(
                False,
                category,
                f"output {i}: {frac:.2%} of elements outside atol={atol:g} rtol={rtol:g} "
                f"(max abs error {scan_i.max_abs:.3g})",
                max_abs=scan_i.max_abs,
                max_rel=scan_i.max_rel,
                err64=worst.err64,
                ref_err64=worst.ref_err64,
                mismatch_fraction=frac,
                first_bad=_index(scan_i.outside_first, rs),
            )
    return worst


def correctness(
    trials: list[TrialCheck],
    expected: int,
    tolerance: tuple[float, float],
    precision: PrecisionMode = PrecisionMode.EXACT,
) -> Correctness:
    """Aggregate trial checks into the schema's :class:`Correctness` (judged at ``precision``)."""
    passed = sum(t.ok for t in trials)
    first_bad = next((t for t in trials if not t.ok), None)
    err64 = [t.err64 for t in trials if t.err64 is not None]
    ref64 = [t.ref_err64 for t in trials if t.ref_err64 is not None]
    default64 = [t.default_err64 for t in trials if t.default_err64 is not None]
    detail = first_bad.detail if first_bad else (None if len(trials) == expected else "not every trial ran")
    return Correctness(
        trials=len(trials),
        passed_trials=passed,
        atol=tolerance[0],
        rtol=tolerance[1],
        max_abs_err=max((t.max_abs for t in trials), default=None),
        max_rel_err=max((t.max_rel for t in trials), default=None),
        err_vs_fp64=max(err64) if err64 else None,
        ref_err_vs_fp64=max(ref64) if ref64 else None,
        precision=precision,
        ref_default_err_vs_fp64=max(default64) if default64 else None,
        mismatch_fraction=first_bad.mismatch_fraction if first_bad else None,
        first_bad_index=first_bad.first_bad if first_bad else None,
        detail=detail,
    )


def timing_stats(
    samples: list[float], timer: TimerKind, wall: list[float] | None = None, earlier: int = 0
) -> TimingStats | None:
    """Statistics of raw per-call times (ms); ``earlier`` of them from the task's earlier timing sessions."""
    values = np.asarray([s for s in samples if np.isfinite(s) and s >= 0], dtype=np.float64)
    if values.size == 0:
        return None
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    med_err = median_rel_stderr(values.tolist())
    return TimingStats(
        median_ms=float(np.median(values)),
        mean_ms=mean,
        std_ms=std,
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        p10_ms=float(np.percentile(values, 10)),
        p90_ms=float(np.percentile(values, 90)),
        reps=int(values.size),
        earlier_reps=earlier,
        rel_stderr=std / np.sqrt(values.size) / mean if mean > 0 else float("inf"),
        median_rel_stderr=med_err if np.isfinite(med_err) else None,
        timer=timer,
        wall_ms=float(np.median(wall)) if wall else None,
    )


def speed_of_light(
    info: dict[str, Any],
    peaks: dict[str, Any],
    cfg_tflops: float | None,
    cfg_gbps: float | None,
    median_ms: float | None,
    tf32: bool = False,
) -> SpeedOfLight | None:
    """The bound from the reference's FLOPs and bytes and the device's ceilings (``tf32``: float32
    products at one TF32 pass, where precision parity admits the reference's own TF32)."""
    flops, nbytes = info.get("flops"), info.get("bytes_moved")
    sixteen = info.get("out_dtype") in ("float16", "bfloat16")
    kind = "tflops_16" if sixteen else "tflops_tf32" if tf32 and peaks.get("tflops_tf32") else "tflops_fp32"
    tflops = cfg_tflops or peaks.get(kind)
    gbps = cfg_gbps or peaks.get("gbps")
    if nbytes is None or not gbps or not tflops:
        return None
    flops = int(flops or 0)
    compute_ms = flops / (float(tflops) * 1e12) * 1e3
    memory_ms = int(nbytes) / (float(gbps) * 1e9) * 1e3
    bound = max(compute_ms, memory_ms)
    return SpeedOfLight(
        flops=flops,
        bytes_moved=int(nbytes),
        peak_tflops=float(tflops),
        peak_gbps=float(gbps),
        bound_ms=bound,
        limiter="compute" if compute_ms > memory_ms else "memory",
        fraction=bound / median_ms if median_ms else None,
    )
