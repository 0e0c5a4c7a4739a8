"""What the parent's own clock says about a timing: the check of a candidate's reported samples.

A candidate's timed batches run in its own process, beside code that may rewrite the samples the
process reports. The parent brackets every batch with its clock (``wall``: from sending the batch
to its ``timed`` frame, the device synchronised before the frame is sent) and knows how many calls
it held. The time outside the timed windows, per call, ``(wall - sum(samples)) / calls``, is the
harness's own cost (drawing the inputs, the flush and the lead spin, the events, the pipe): the
same code in the candidate's spare and in the referee, on the same GPU, one after the other. A
candidate whose process reports less time than its calls took, or that does work outside the
windows (computing answers while its inputs are drawn, finishing work after the end event), shows
that time here, as overhead the referee's batches do not have.

Measured on an H200 (``bench/crosscheck_probe.py``, 2026-11-28, one run): with the device kept
busy by the harness, the overhead per call of honest workloads spread (p10..p90 over batches)
2 us for a 64 MB relu, 7 us for a 2048 fp32 matmul and 15 us (of 2.6 ms) for a 4 GB relu; samples
halved showed up as the missing half (+18 us, +170 us, +1013 us). On calls of a few microseconds
(an 8K relu) the spread was 60-140 us, far above the call: there only the empty-kernel floor
binds. What remains trusted, and why, is in the README's anti-cheat section.

A host slow for a moment (compiles beside the timing) also shows as time outside the windows:
on an H200 two honest 64 MB row sums of a stream of eight were 44 us and 476 us over. So the
timing session (:mod:`gpu_runner.timing_session`) times a contradicted report again with
longer spins before the verdict runs this check on the new rounds alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gpu_runner.config import RunnerConfig
from gpu_runner.referee import Batch
from schemas import CheatRule, Check, CheckName, CheckOutcome, Finding, Severity


def overhead_us(batch: Batch, harness_only: bool = False) -> float:
    """Microseconds per call of the batch outside its timed windows, by the parent's clock;
    ``harness_only``: a referee's batch less its canary and L2 reset (:attr:`Batch.referee_us`),
    what the harness alone costs it."""
    outside_ms = batch.wall_ms - sum(batch.samples) - (batch.referee_us / 1e3 if harness_only else 0.0)
    return outside_ms * 1e3 / max(1, batch.calls)


def _forged(batches: Sequence[Batch]) -> str | None:
    """A report that cannot be a measurement: samples for other calls than were made, or not times."""
    for b in batches:
        if len(b.samples) != b.calls:
            return f"a batch of {b.calls} calls reported {len(b.samples)} samples"
        if any(not math.isfinite(s) or s < 0 for s in b.samples):
            return "a batch reported samples that are not times"
        if sum(b.samples) > b.wall_ms * 1.02 + 0.05:
            return f"a batch reported {sum(b.samples):.3f} ms of calls in {b.wall_ms:.3f} ms by the parent's clock"
    return None


OVERHEAD_SHARE = 0.03
"""The excess allowed as a share of the referee's own time outside the windows: that time is the
harness's (the lead and cover spins, the draws, the flush), and on an H200 two honest processes'
medians of ~1 ms differed by up to 44 us (4%) over ten batches."""


def _spread(values: list[float]) -> str:
    """p10..p90 of sorted values."""
    return f"{values[len(values) // 10]:.1f}..{values[(9 * len(values)) // 10]:.1f}"


FLOOR_SHARE = 0.5
"""A candidate's median call may not be under this share of the empty kernel's time: a call that
launches a kernel of its own cannot take less than an empty launch (with a margin for clocks)."""


def crosscheck_slack(cfg: RunnerConfig, cuda: bool) -> tuple[float, float]:
    """(microseconds, share of the median call) a candidate's time outside the windows may exceed
    the referee's by: the config's, else 25 us and 4% on CUDA, 1000 us and 25% on the CPU."""
    us = cfg.crosscheck_slack_us if cfg.crosscheck_slack_us is not None else (25.0 if cuda else 1000.0)
    ratio = cfg.crosscheck_slack_ratio if cfg.crosscheck_slack_ratio is not None else (0.04 if cuda else 0.25)
    return us, ratio


def cross_check(
    batches: Sequence[Batch],
    slack_us: float,
    slack_ratio: float,
    flush_us: float = 0.0,
    harness: str = "",
    floor_us: float | None = None,
) -> tuple[Check, Finding | None, float | None]:
    """The check of the candidate's batches against the referee's: (check, finding, excess in us).

    The excess is the median over the candidate's batches of their overhead per call minus the
    median of the referee's; it may be ``slack_us + slack_ratio`` times the candidate's median
    call (the parent's clock has jitter; a host-bound call shifts a few microseconds from the
    window to outside it), and no less than four times the referee's own spread (the median
    absolute deviation of its batches) nor :data:`OVERHEAD_SHARE` of the referee's overhead.
    With ``flush_us`` (CUDA: the L2 flush's device time, part of every call's overhead) an
    overhead that much under the referee's is flagged for review. ``harness`` (the lead and
    cover spins chosen) goes into the detail. With ``floor_us`` (the referee's empty kernel) a
    median call under :data:`FLOOR_SHARE` of it is refused: on calls of a few microseconds the
    parent's clock cannot resolve a forged report, but physics bounds it from below."""
    cand = [b for b in batches if b.callable == "candidate" and not b.warmup]
    trusted = [b for b in batches if b.callable != "candidate" and not b.warmup]
    if not cand or not trusted:
        return (
            Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.SKIPPED, detail="no timed batch"),
            None,
            None,
        )
    forged = _forged(cand)
    if forged is not None:
        finding = Finding(rule=CheatRule.TIMER_TAMPERING, severity=Severity.REJECT, message=f"timing report: {forged}")
        return Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.FAILED, detail=forged), finding, None
    call_us = statistics.median(s for b in cand for s in b.samples) * 1e3
    if floor_us and call_us < FLOOR_SHARE * floor_us:
        why = (
            f"its calls report a median of {call_us:.2f} us, under an empty kernel's {floor_us:.2f} us "
            "(the least time the events can see around one launch)"
        )
        finding = Finding(rule=CheatRule.TIMER_TAMPERING, severity=Severity.REJECT, message=f"timing report: {why}")
        return Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.FAILED, detail=why), finding, None
    o_cands = sorted(overhead_us(b) for b in cand)
    o_refs = sorted(overhead_us(b) for b in trusted)
    o_cand, o_ref = statistics.median(o_cands), statistics.median(o_refs)
    spread = statistics.median(abs(o - o_ref) for o in o_refs)
    allowed = max(slack_us, 4.0 * spread, OVERHEAD_SHARE * o_ref) + slack_ratio * call_us
    excess = o_cand - o_ref
    detail = (
        f"outside the timed windows, per call: candidate {o_cand:.1f} us [{_spread(o_cands)}], referee "
        f"{o_ref:.1f} us [{_spread(o_refs)}] (the same harness; the parent's clock over {len(cand)} + "
        f"{len(trusted)} batches); excess {excess:.1f} us, allowed {allowed:.1f} us (median call {call_us:.1f} us)"
        + (f"; {harness}" if harness else "")
    )
    # Whether the candidate skipped part of the harness is asked against the referee's harness
    # alone: its canary and L2 reset counted, honest candidates looked short of it (flagged in 19 of
    # 44 evaluations of an H200 stream, 5 of 7 correct convolutions of KernelBench L2-4). Whether
    # the parent's clock contradicts the report keeps the whole batch, as calibrated: without the
    # canary there, 2 of 8 honest 64 MB row sums and 1 of 8 honest trust-bench candidates were
    # refused on the same H200.
    o_harness = statistics.median(overhead_us(b, harness_only=True) for b in trusted)
    if flush_us > 0 and o_cand < o_harness - 0.5 * flush_us - max(5.0, 2.0 * spread):
        # Less time outside the windows than the harness costs the referee: its process skipped
        # part of the harness (the L2 flush, the lead spin). Flagged, not refused: the gain is a
        # warmer cache, and a candidate this much faster to launch is conceivable.
        finding = Finding(
            rule=CheatRule.TIMER_TAMPERING,
            severity=Severity.REVIEW,
            message=f"less time outside the timed windows than the harness takes: {detail}",
        )
        return Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.FAILED, detail=detail), finding, excess
    if excess > allowed:
        finding = Finding(
            rule=CheatRule.TIMER_TAMPERING,
            severity=Severity.REJECT,
            message=f"the parent's clock contradicts the candidate's timing: {excess:.1f} us per call more than "
            f"its process reported ({detail})",
        )
        return Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.FAILED, detail=detail), finding, excess
    return Check(name=CheckName.TIMING_CROSS_CHECK, outcome=CheckOutcome.PASSED, detail=detail), None, excess


BUSY_SHARE = 0.3
"""Busy canaries in this share of the referee's looks (or more) mean the candidate habitually leaves work."""
BUSY_LOOKS = 2
"""... and at least this many: a session that pools its baselines may look only three times, and on
an H200 one honest 64 MB relu of a stream of eight found the GPU busy once (a spare starting its
CUDA context beside the timing, say), 1 of 3."""
BUSY_MS = 20.0
"""Work still running this long after a candidate's batch returned is refused however rare."""


def canary_limit_us(quiet_us: float | None, busy_us: float) -> float:
    """A canary above this found another process's work holding the GPU: ``busy_us`` (the
    config's) and 20 times the canary's quiet median, whichever is more."""
    return max(busy_us, 20.0 * (quiet_us or 0.0))


def canary_check(
    batches: Sequence[Batch],
    final: tuple[float, float] | None,
    quiet_us: float | None,
    busy_us: float,
    looks: Sequence[tuple[float, float]] = (),
) -> tuple[Check, Finding | None]:
    """Whether the GPU was idle whenever the referee looked (before each of its batches and after
    the candidate's last; ``looks``: its canaries alone, after candidate batches no baseline batch
    followed). Where it was busy the referee waited for it before timing, so nothing
    left running reached a baseline; work that stays busy for :data:`BUSY_MS` or that comes back
    in :data:`BUSY_SHARE` of the looks (:data:`BUSY_LOOKS` at least) is the candidate's process
    leaving work behind its report.
    An isolated short busy moment (a spare starting its CUDA context, say) is only recorded."""
    seen = [(b.canary_us, b.busy_ms) for b in batches if b.canary_us is not None]
    seen += list(looks)
    if final is not None:
        seen.append(final)
    if not seen:
        return (
            Check(name=CheckName.DEFERRED_WORK_GUARD, outcome=CheckOutcome.SKIPPED, detail="no canary on the CPU"),
            None,
        )
    limit = canary_limit_us(quiet_us, busy_us)
    busy = [(us, ms) for us, ms in seen if us > limit]
    longest = max((ms for _, ms in busy), default=0.0)
    detail = (
        f"canary before each baseline batch, after every candidate batch no baseline followed and after the "
        f"last: {len(busy)} of {len(seen)} "
        f"found the GPU busy (up to {max(us for us, _ in seen):.0f} us, busy for up to {longest:.1f} ms; "
        f"idle {quiet_us or 0.0:.0f} us, limit {limit:.0f} us)"
    )
    if busy and (longest >= BUSY_MS or len(busy) >= max(BUSY_LOOKS, BUSY_SHARE * len(seen))):
        finding = Finding(
            rule=CheatRule.DEFERRED_WORK,
            severity=Severity.REJECT,
            message=f"work left running on the GPU after the candidate's timed batch returned: {detail}",
        )
        return Check(name=CheckName.DEFERRED_WORK_GUARD, outcome=CheckOutcome.FAILED, detail=detail), finding
    return Check(name=CheckName.DEFERRED_WORK_GUARD, outcome=CheckOutcome.PASSED, detail=detail), None
