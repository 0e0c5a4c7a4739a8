"""Where the time goes, and what each kernel gained (Amdahl's law).

The referee times the reference's forward op by op (``Baselines.profile``: each family's share of
the reference's time); the candidate's process times its own kernels one by one
(``Profile.kernel_times``). Put together per family: the reference's time in that family's ops,
the candidate's time in its kernels of that family, the family's speedup, and what it alone would
make of the whole forward (``1 / (1 - share + share / speedup)``). The end-to-end speedup stays
the verdict's, timed from outside the candidate's process; this breakdown explains it.

It also steers the search (:func:`steering_shares`): where a candidate's kernels were timed, the
families its own time goes to (what is left to gain), else the reference's shares.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from schemas import EvalResult, KernelTime, OpFamily, OpTime

KERNELS_LISTED = 24
"""The candidate's kernels a breakdown lists (largest first)."""
OPS_LISTED = 12
"""The reference's (module, op) pairs a breakdown lists (largest first)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FamilyTime(_Frozen):
    """One family of work: its share of the reference and what the candidate's kernels made of it."""

    family: OpFamily
    reference_us: float | None = None
    """Time per forward of the reference's ops of this family (``None``: the reference has none)."""
    reference_share: float | None = None
    """Their fraction of the reference's op time."""
    kernels: tuple[str, ...] = ()
    """The candidate's kernels of this family (empty: its work, if any, is fused into kernels of
    other families, as an elementwise epilogue is into a product or a convolution)."""
    candidate_us: float | None = None
    """Time per forward of those kernels (``None``: none launched, or not timed)."""
    speedup: float | None = None
    """``reference_us / candidate_us``."""
    alone: float | None = None
    """The whole forward's speedup if only this family had changed, by Amdahl's law."""


class TimeBreakdown(_Frozen):
    """The best kernel's time, family by family, beside the reference's."""

    reference_timer: str | None = None
    """How the reference's ops were timed (``None``: no profile of the reference)."""
    reference_ops_us: float | None = None
    """The reference's op times added up (the shares' denominator)."""
    kernel_timer: str | None = None
    """How the candidate's kernels were timed (``None``: they were not)."""
    candidate_kernels_us: float | None = None
    """The candidate's kernel times added up."""
    families: tuple[FamilyTime, ...] = ()
    """Largest share of the reference first, then families only the candidate has."""
    kernels: tuple[KernelTime, ...] = ()
    """The candidate's largest kernels."""
    reference_ops: tuple[OpTime, ...] = ()
    """The reference's largest (module, op) pairs."""
    torch_ops: tuple[OpTime, ...] = ()
    """Reference ops the candidate left to PyTorch (run policy ``reference``), with their share."""


def _family_times(kernels: tuple[KernelTime, ...]) -> dict[OpFamily, tuple[float, tuple[str, ...]]]:
    out: dict[OpFamily, tuple[float, tuple[str, ...]]] = {}
    for k in kernels:
        if k.family is None:
            continue
        us, names = out.get(k.family, (0.0, ()))
        out[k.family] = (us + k.time_us, (*names, k.name))
    return out


def breakdown(result: EvalResult) -> TimeBreakdown | None:
    """The breakdown of one evaluated candidate (``None``: neither side was profiled)."""
    ref = result.baselines.profile if result.baselines is not None else None
    kernels = result.profile.kernel_times if result.profile is not None else ()
    if ref is None and not kernels:
        return None
    ours = _family_times(kernels)
    rows: list[FamilyTime] = []
    seen: set[OpFamily] = set()
    for f in ref.families if ref is not None else ():
        seen.add(f.family)
        cand_us, names = ours.get(f.family, (None, ()))
        speedup = f.time_us / cand_us if cand_us else None
        alone = 1.0 / (1.0 - f.share + f.share / speedup) if speedup else None
        rows.append(
            FamilyTime(
                family=f.family,
                reference_us=f.time_us,
                reference_share=f.share,
                kernels=names,
                candidate_us=cand_us,
                speedup=speedup,
                alone=alone,
            )
        )
    for family, (us, names) in ours.items():
        if family not in seen:
            rows.append(FamilyTime(family=family, kernels=names, candidate_us=us))
    torch_names = {name.split("::")[-1] for name in result.torch_ops}
    return TimeBreakdown(
        reference_timer=ref.timer if ref is not None else None,
        reference_ops_us=ref.ops_us if ref is not None else None,
        kernel_timer=result.profile.kernel_timer if result.profile is not None and kernels else None,
        candidate_kernels_us=sum(k.time_us for k in kernels) if kernels else None,
        families=tuple(rows),
        kernels=kernels[:KERNELS_LISTED],
        reference_ops=ref.ops[:OPS_LISTED] if ref is not None else (),
        torch_ops=tuple(o for o in (ref.ops if ref is not None else ()) if o.op.split("::")[-1] in torch_names),
    )


def steering_shares(result: EvalResult | None) -> dict[OpFamily, float]:
    """Where improving a candidate pays most, as a share per family: its own kernels' times where
    they were measured (what is left to gain), else the reference's op times (empty: neither)."""
    if result is None:
        return {}
    kernels = result.profile.kernel_times if result.profile is not None else ()
    ours = {f: us for f, (us, _) in _family_times(kernels).items()}
    total = sum(ours.values())
    if total > 0:
        return {f: us / total for f, us in ours.items()}
    ref = result.baselines.profile if result.baselines is not None else None
    return {f.family: f.share for f in ref.families} if ref is not None else {}


def breakdown_lines(b: TimeBreakdown, limit: int = 6) -> list[str]:
    """A few lines for a person (the run's summary) or an expert's prompt: each family's share of
    the reference and, where measured, its speedup and what it alone makes of the whole; the
    candidate's largest kernels; the reference's largest ops and where they are called."""
    lines: list[str] = []
    named = any(k.family is not None for k in b.kernels)
    for row in b.families[:limit]:
        share = "not in the reference"
        if row.reference_share is not None:
            share = f"{row.reference_share:.0%} of the reference's time"
        what = ""
        if row.candidate_us is not None and row.speedup is not None and row.alone is not None:
            what = f"; its {len(row.kernels)} kernel(s) {row.speedup:.2f}x on it, {row.alone:.2f}x on the whole alone"
        elif row.candidate_us is not None:
            what = f"; its {len(row.kernels)} kernel(s) {row.candidate_us:.0f} us"
        elif named:
            what = "; no kernel of its own (fused into others, or left to PyTorch)"
        lines.append(f"{row.family.value}: {share}{what}")
    if b.kernels and b.candidate_kernels_us:
        total = b.candidate_kernels_us
        top = ", ".join(f"{k.name} {k.time_us / total:.0%}" for k in b.kernels[:limit])
        lines.append(f"the candidate's kernels by share of their time: {top}")
    if b.reference_ops:
        top = ", ".join(
            f"{o.op.split('::')[-1]} in {o.module or 'forward'} {o.share:.0%}" for o in b.reference_ops[:limit]
        )
        lines.append(f"the reference's largest ops: {top}")
    for op in b.torch_ops[:limit]:
        lines.append(f"left to PyTorch: {op.op} in {op.module or 'forward'}, {op.share:.0%} of the reference")
    return lines


def family_weights(shares: Mapping[OpFamily, float], families: set[str], floor: float = 0.05) -> dict[str, float]:
    """Draw weights over ``families`` (kernel kinds with something to mutate): each one's share plus
    ``floor``, so a family with no measured share is still tried now and then."""
    known = {f.value for f in OpFamily}
    return {f: floor + max(0.0, float(shares.get(OpFamily(f), 0.0))) for f in sorted(families) if f in known}
