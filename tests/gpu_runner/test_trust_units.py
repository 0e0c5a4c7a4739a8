"""Unit tests of the trusted side's own checks: the parent's clock against a candidate's timing
report, the referee's canary, input checksums recomputed from bytes, output layout, custom ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_runner.compare import host_checksum
from gpu_runner.crosscheck import canary_check, cross_check, overhead_us
from gpu_runner.pool import trial_scales
from gpu_runner.referee import Batch
from gpu_runner.sandboxed.common import checksum, pack
from gpu_runner.verdict import launches, layout_findings, runtime_findings
from schemas import CheatRule, CheckOutcome

# Measured on an H200 (bench/crosscheck_probe.py): relu of 64 MB, 36 us a call, 192 us outside the
# timed windows per call with the harness's flush and lead spin, within 2 us across batches.
CALL_MS, OUTSIDE_MS, CALLS = 0.036, 0.192, 29


def batches(callable_: str, call_ms: float, outside_ms: float, reported: float = 1.0, n: int = 12) -> list[Batch]:
    """Batches whose parent-clock wall is what the calls and the harness cost; the process reports
    ``reported`` times the true call time."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        true = [call_ms * (1 + 0.01 * rng.standard_normal()) for _ in range(CALLS)]
        wall = sum(true) + CALLS * outside_ms * (1 + 0.005 * rng.standard_normal())
        out.append(Batch(callable=callable_, calls=CALLS, wall_ms=wall, samples=[t * reported for t in true]))
    return out


def test_an_honest_report_agrees_with_the_parents_clock() -> None:
    runs = batches("candidate", CALL_MS, OUTSIDE_MS) + batches("eager", 0.036, OUTSIDE_MS)
    check, finding, excess = cross_check(runs, 25.0, 0.04)
    assert finding is None, check.detail
    assert check.outcome is CheckOutcome.PASSED
    assert excess is not None
    assert abs(excess) < 5.0


@pytest.mark.parametrize("reported", [0.5, 1 / 1.8])
def test_samples_rewritten_smaller_show_as_time_the_parent_saw(reported: float) -> None:
    # A 2 ms call reported at half or at eager's median / 1.8: the missing time is outside the windows.
    runs = batches("candidate", 2.0, OUTSIDE_MS, reported) + batches("eager", 2.0, OUTSIDE_MS)
    check, finding, excess = cross_check(runs, 25.0, 0.04)
    assert finding is not None
    assert finding.rule is CheatRule.TIMER_TAMPERING
    assert check.outcome is CheckOutcome.FAILED
    assert excess is not None
    assert excess > 800.0


def test_a_tiny_call_reported_faster_than_an_empty_kernel_is_refused() -> None:
    # An 8K-element add takes ~4.3 us on an H200; forged to a quarter it is under the parent's
    # clock's resolution, but under the ~2.5 us an empty launch takes too.
    runs = batches("candidate", 0.0043, OUTSIDE_MS, 0.25) + batches("eager", 0.0051, OUTSIDE_MS)
    _, finding, _ = cross_check(runs, 25.0, 0.04, floor_us=2.5)
    assert finding is not None
    assert "empty kernel" in finding.message
    honest = batches("candidate", 0.0043, OUTSIDE_MS) + batches("eager", 0.0051, OUTSIDE_MS)
    _, finding, _ = cross_check(honest, 25.0, 0.04, floor_us=2.5)
    assert finding is None


def test_work_done_outside_the_timed_window_is_seen() -> None:
    # The answer computed while the inputs are drawn (100 us a call), the window holds a decoy.
    runs = batches("candidate", 0.004, OUTSIDE_MS + 0.1) + batches("eager", CALL_MS, OUTSIDE_MS)
    _, finding, _ = cross_check(runs, 25.0, 0.04)
    assert finding is not None


def test_reports_that_cannot_be_measurements_are_refused() -> None:
    good = batches("eager", CALL_MS, OUTSIDE_MS)
    short = Batch(callable="candidate", calls=CALLS, wall_ms=10.0, samples=[0.01] * (CALLS - 1))
    negative = Batch(callable="candidate", calls=2, wall_ms=1.0, samples=[0.1, -0.05])
    longer = Batch(callable="candidate", calls=2, wall_ms=1.0, samples=[0.8, 0.8])
    for bad in (short, negative, longer):
        _, finding, _ = cross_check([bad, *good], 25.0, 0.04)
        assert finding is not None
        assert finding.rule is CheatRule.TIMER_TAMPERING


def test_skipping_the_harness_flush_is_flagged_for_review_on_cuda() -> None:
    # The probe's relu of 64 MB: 192 us outside the windows with the flush and lead, 118 us without;
    # the flush alone is ~40 us of device time on an H200 (120 MB memset).
    honest = batches("eager", CALL_MS, OUTSIDE_MS)
    skipped = batches("candidate", CALL_MS, 0.05)
    _, finding, _ = cross_check([*skipped, *honest], 25.0, 0.04, flush_us=40.0)
    assert finding is not None
    assert finding.severity.value == "review"
    _, finding, _ = cross_check([*skipped, *honest], 25.0, 0.04)  # no flush known (the CPU)
    assert finding is None


def test_warmup_batches_and_a_missing_baseline_are_not_judged() -> None:
    warm = Batch(callable="candidate", calls=3, wall_ms=500.0, samples=[0.01] * 3, warmup=True)
    check, finding, _ = cross_check([warm, *batches("eager", CALL_MS, OUTSIDE_MS)], 25.0, 0.04)
    assert (check.outcome, finding) == (CheckOutcome.SKIPPED, None)
    assert overhead_us(warm) == pytest.approx((500.0 - 0.03) * 1e3 / 3)


def test_the_canary_finds_another_process_s_work_on_the_gpu() -> None:
    # H200: 14 us idle, 1.7-2.3 ms while another process's kernel ran.
    idle = [Batch(callable="eager", calls=1, wall_ms=1.0, samples=[0.1], canary_us=15.0) for _ in range(5)]
    check, finding = canary_check(idle, (16.0, 0.0), 14.0, 500.0)
    assert finding is None
    assert check.outcome is CheckOutcome.PASSED
    # busy for long after a candidate's batch: refused, even once
    busy = Batch(callable="eager", calls=1, wall_ms=3.0, samples=[0.1], canary_us=2342.0, busy_ms=48.0)
    check, finding = canary_check([*idle, busy], (15.0, 0.0), 14.0, 500.0)
    assert finding is not None
    assert finding.rule is CheatRule.DEFERRED_WORK
    _, finding = canary_check(idle, (1741.0, 35.0), 14.0, 500.0)  # after the last candidate batch
    assert finding is not None
    # busy briefly, but after most of the candidate's batches: refused
    brief = Batch(callable="eager", calls=1, wall_ms=3.0, samples=[0.1], canary_us=900.0, busy_ms=2.0)
    _, finding = canary_check([brief, brief, *idle[:3]], (15.0, 0.0), 14.0, 500.0)
    assert finding is not None
    # one brief busy look among many (another process starting its context): recorded only
    check, finding = canary_check([brief, *idle, *idle], (15.0, 0.0), 14.0, 500.0)
    assert finding is None
    assert "1 of 12 found the GPU busy" in (check.detail or "")
    # ... and one among three (a session pooling its baselines looks few times): recorded only
    check, finding = canary_check([brief, idle[0]], (15.0, 0.0), 14.0, 500.0)
    assert finding is None
    assert "1 of 3 found the GPU busy" in (check.detail or "")
    _, finding = canary_check([brief, idle[0]], (900.0, 2.0), 14.0, 500.0)  # twice in three: refused
    assert finding is not None
    check, finding = canary_check([], None, None, 500.0)
    assert (check.outcome, finding) == (CheckOutcome.SKIPPED, None)


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(8193),
        torch.randint(-(2**31), 2**31 - 1, (3_000_003,), dtype=torch.int32),
        torch.randn(5, 7, dtype=torch.bfloat16),
        torch.randn(64, 33).t(),  # a transposed view: its bytes in logical order
        torch.ones(3, dtype=torch.bool),
    ],
)
def test_the_parent_recomputes_the_spares_checksum_from_the_bytes_sent(t: torch.Tensor) -> None:
    _, blobs = pack([t])
    assert host_checksum(np.frombuffer(blobs[0], dtype=np.uint8)) == checksum(t)
    changed = t.contiguous().clone()
    flat = changed.view(-1)
    flat[0] = ~flat[0] if t.dtype is torch.bool else flat[0] + 1
    _, blobs = pack([changed])
    assert host_checksum(np.frombuffer(blobs[0], dtype=np.uint8)) != checksum(t)


def test_outputs_must_have_the_references_layout() -> None:
    ref = [{"shape": [64, 128], "stride": [128, 1], "dtype": "float32"}]
    good = [{"trial": 0, "strides": [[128, 1]]}]
    column_major = [{"trial": 0, "strides": [[1, 64]]}]
    findings, check = layout_findings(good, ref)
    assert (findings, check.outcome) == ([], CheckOutcome.PASSED)
    findings, check = layout_findings(column_major, ref)
    assert check.outcome is CheckOutcome.FAILED
    assert findings[0].rule is CheatRule.OUTPUT_LAYOUT
    # a dimension of size 1 may have any stride
    findings, _ = layout_findings([{"trial": 0, "strides": [[5, 1]]}], [{"shape": [1, 128], "stride": [128, 1]}])
    assert findings == []


def test_custom_ops_count_as_own_kernels_only_when_its_native_code_registers_them() -> None:
    python_op = {"trial": 0, "own_launches": 0, "custom_ops": {"kfhack::relu": 1}, "foreign_ops": {}}
    findings = runtime_findings([python_op], set(), frozenset(), ())
    rules = {f.rule for f in findings}
    assert CheatRule.TORCH_COMPUTE in rules
    assert CheatRule.NO_KERNEL_LAUNCHED in rules
    native = dict(python_op, custom_ops={"myext::relu": 1})
    assert runtime_findings([native], set(), frozenset(), ("myext",)) == []
    assert launches(native, ("myext",)) == 1


def test_range_trials_follow_the_typical_draws_and_never_replace_all_of_them() -> None:
    assert trial_scales(5, [1e6, 1e-6]) == [1.0, 1.0, 1.0, 1e6, 1e-6]
    assert trial_scales(3, [1e6, 1e-6]) == [1.0, 1e6, 1e-6]
    assert trial_scales(2, [1e6, 1e-6]) == [1.0, 1e6]
    assert trial_scales(5, []) == [1.0] * 5


def test_a_checksum_of_several_steps_matches_the_hosts() -> None:
    """Past one step the worker's checksum takes its weights from a window at each step's phase."""
    g = torch.Generator().manual_seed(11)
    t = torch.randint(-(2**31), 2**31 - 1, ((1 << 24) + 70_001,), dtype=torch.int32, generator=g)
    assert checksum(t) == host_checksum(t.numpy())
    t[(1 << 24) + 5] += 1  # a word in the second step
    assert checksum(t) == host_checksum(t.numpy())


def test_the_referees_canary_and_reset_are_not_counted_as_its_harness() -> None:
    """A referee batch's wall holds its canary and its L2 reset, which a candidate's batch does
    not: whether a candidate skipped the harness is asked against the referee's harness alone
    (counted, honest candidates looked short of it and were flagged for review), while the clock's
    contradiction keeps the whole batch, as calibrated. One call a batch (an 11 ms convolution),
    60 us of canary and reset a batch."""
    rng = np.random.default_rng(3)
    extra_ms = 0.060

    def one(callable_: str, extra: float) -> Batch:
        call = 11.0 * (1 + 0.001 * rng.standard_normal())
        wall = call + OUTSIDE_MS * (1 + 0.005 * rng.standard_normal()) + extra
        return Batch(callable=callable_, calls=1, wall_ms=wall, samples=[call])

    cand = [one("candidate", 0.0) for _ in range(30)]
    refs = [one("eager", extra_ms) for _ in range(16)]
    check, finding, _ = cross_check(cand + refs, 25.0, 0.04, flush_us=30.0)
    assert finding is not None, check.detail  # the canary read as harness: the honest one looks short of it
    for b in refs:
        b.referee_us = extra_ms * 1e3
    assert overhead_us(refs[0], harness_only=True) == pytest.approx(overhead_us(refs[0]) - extra_ms * 1e3)
    check, finding, excess = cross_check(cand + refs, 25.0, 0.04, flush_us=30.0)
    assert finding is None, check.detail
    assert excess is not None
    assert excess == pytest.approx(-extra_ms * 1e3, abs=5.0)  # the contradiction test: the whole batch
    skipped = [one("candidate", -0.1) for _ in range(30)]  # 100 us of harness skipped: still flagged
    _, finding, _ = cross_check(skipped + refs, 25.0, 0.04, flush_us=30.0)
    assert finding is not None
    header = {"calls": 1, "samples": [1.0], "referee_extra_us": 500.0}
    assert Batch.from_report("candidate", header, 2.0, False).referee_us == 0.0  # never from a candidate
    assert Batch.from_report("eager", header, 2.0, False).referee_us == 500.0
