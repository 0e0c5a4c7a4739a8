"""A candidate's timing, driven by the parent: batches in two processes, the parent's clock around each.

The candidate's spare and the referee run the same batch harness
(:mod:`gpu_runner.sandboxed.timing`) on the same fresh seeds, one batch at a time, in a rotating
order, while the parent holds the GPU exclusively. Every batch is bracketed by the parent's own
clock (send to ``timed`` frame, the device synchronised inside), so the time a candidate's
process claims is checked against time it cannot forge (:func:`gpu_runner.crosscheck.cross_check`).
The referee times a canary before each of its batches and once after the last candidate batch:
work a candidate left on the GPU shows there as a busy device.

Timed calls are judged like trials. Small outputs (up to ``timing_ship_all_bytes`` per call) come
back with every batch, inside the clocked window, and the parent keeps a random sample of them
(reservoir, :data:`JUDGED_CALLS`); larger ones stay in the candidate's process until the next
batch, and after a batch chosen at random the parent asks for one call's outputs (``ship``). Which
calls are judged is decided by the parent after the batch ended and never told to the candidate
before; the referee (or the judge, for outputs judged on the device) then computes their truth
from the seeds.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpu_runner.config import RunnerConfig
from gpu_runner.crosscheck import canary_check, cross_check, crosscheck_slack
from gpu_runner.frames import BatchOp, Op, Report, ShipOp, op_frame
from gpu_runner.memplan import KEPT_OUTPUT_BYTES, MAX_BATCH, SHIPPED_CALLS, TIMING_INPUT_BYTES
from gpu_runner.pool import decode_outputs
from gpu_runner.protocol import FrameError
from gpu_runner.referee import Batch, Referee
from gpu_runner.stats import median_rel_stderr
from schemas import Severity

logger = structlog.get_logger(__name__)

JUDGED_CALLS = 16
"""Timed calls whose outputs are judged with the trial rule, where every call's outputs come back."""
LEAD_FACTOR = 1.5
"""The lead spin is at least this many times the slowest process's host time per call."""
MAX_LEAD_US = 1000.0
"""The longest lead spin (a call whose host time is longer is timed with its launch gaps)."""
POOL_MIN_OWN = 8
"""The fewest samples of each baseline a session takes itself where it pools (the median's
standard error is known from 8)."""
RECHECK_FACTOR = 2.0
"""A re-check's lead and cover spins are this many times the first rounds' (and may reach this
many times :data:`MAX_LEAD_US`): room for a host that was slow for a moment."""


@dataclass
class Kept:
    """A timed call chosen for judgment: its seed and where its outputs are."""

    trial: int
    """The number its outputs go under (after the trials' numbers)."""
    seed: int
    skip: int
    """Its place in its batch: its inputs are the draw after ``skip`` others from ``seed``."""
    outputs: list[Any] | None = None
    """Its outputs as numpy arrays (small outputs: they came with the batch)."""
    dtypes: list[str] = field(default_factory=list)
    header: dict[str, Any] | None = None
    """The ``trial`` frame a shipped call came in (larger outputs)."""
    ship_ms: float | None = None


@dataclass(frozen=True)
class HeldOutShape:
    """A held-out shape to time the candidate at (its trial there did not raise)."""

    variant: int
    """Its place among the task's held-out shapes."""
    overrides: dict[str, int]
    """The module-level sizes its inputs are drawn with."""
    nbytes: int = 0
    """Its inputs' and outputs' bytes (what bounds a batch's calls; 0: unknown)."""


@dataclass
class HeldOutTime:
    """The candidate and the eager reference timed at one held-out shape, side by side."""

    variant: int
    candidate_ms: float | None = None
    """Median milliseconds per call (None: not timed, see ``note``)."""
    eager_ms: float | None = None
    calls: int = 0
    """Timed calls of each."""
    note: str = ""
    """Why there is no time, or what limited it."""


@dataclass
class SessionRecord:
    """What a timing session leaves for the verdict."""

    batches: list[Batch] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    final_canary_us: float | None = None
    final_busy_ms: float = 0.0
    looks: list[tuple[float, float]] = field(default_factory=list)
    """The referee's canaries alone (host microseconds, busy milliseconds) after the candidate
    batches of rounds that timed no baseline (pooled baselines already known: see
    :meth:`TimingSession._settled`)."""
    superseded_looks: list[tuple[float, float]] = field(default_factory=list)
    canary_quiet_us: float | None = None
    flush_bytes: int = 0
    l2_reset: bool = False
    lead_us: float = 0.0
    flush_us: float = 0.0
    """The flush's device time as the referee measured it (a candidate skipping it saves that)."""
    empty_kernel_us: float | None = None
    """The least event time around one launched kernel, as the referee measured it."""
    cover_us: float = 0.0
    """Device spin per call queued before a batch draws its inputs (and once per batch ``cover_seed_us``)."""
    cover_seed_us: float = 0.0
    outputs_mode: str = "all"
    batch_calls: int = 0
    timer: str = "perf_counter"
    rounds: int = 0
    elapsed_s: float = 0.0
    compiled_note: str | None = None
    """Why no ``torch.compile`` baseline was timed beside the candidate where one is built aside
    (not ready yet, or its process failed)."""
    superseded: list[Batch] = field(default_factory=list)
    """Timed batches of the rounds a re-check replaced: their canaries and launch counts still
    count, their samples and clock do not."""
    pooled: dict[str, list[float]] = field(default_factory=dict)
    """Per baseline, the samples of the task's earlier sessions this one pooled with its own
    (the referee's, :class:`gpu_runner.referee.BaselineLedger`); empty where it timed both
    baselines in every round."""
    held_out: list[HeldOutTime] = field(default_factory=list)
    """The candidate and the eager reference at held-out shapes (evidence for the report: the
    verdict, its cross-check and its canaries read none of these batches)."""
    held_out_s: float = 0.0
    """The seconds the held-out timing took."""
    slowed: dict[str, str] = field(default_factory=dict)
    """Baselines this session timed slower than the task's earlier sessions beyond their noise,
    with what each measured: the verdict takes the earlier sessions' samples of these alone. A
    baseline's code does not change between sessions, and what slows it (cuDNN falling back to
    an algorithm without a workspace on a full GPU: KernelBench L1-57's eager at 27.8 ms where it
    ran 6.4 ms, a 2.2x "speedup" on an 80 GB H100) must never flatter a candidate; the faster
    time stands."""
    recheck_excess_us: float | None = None
    """Where the parent's clock contradicted the first rounds (more time outside the windows than
    allowed), by how much per call; those rounds were then timed again with longer spins, and
    only the new rounds decide the timing and the cross-check."""


class SessionAborted(Exception):
    """The candidate's process stopped answering the session (its error or death is in the record)."""


class TimingSession:
    """One candidate's timing against the referee's baselines."""

    def __init__(
        self,
        cfg: RunnerConfig,
        device: str,
        referee: Referee,
        reader: Any,
        first_timed_trial: int,
        in_bytes: int,
        out_bytes: int,
        shippable: int,
        compiled: Referee | None = None,
        compiled_note: str | None = None,
        held_out: Sequence[HeldOutShape] = (),
        held_out_bar_ms: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.referee = referee
        self.compiled = compiled if compiled is not None else referee if referee.compiled else None
        """Where the ``torch.compile`` baseline is timed: its own process (built beside the
        referee) or the referee; None: no such baseline for this session."""
        self.reader = reader
        """The candidate's :class:`gpu_runner.run_reader.ReportReader` (its frames, its record)."""
        self.next_trial = first_timed_trial
        self.in_bytes = in_bytes
        self.out_bytes = out_bytes
        self.shippable = shippable
        """Output buffers the spare has for shipped calls (larger outputs)."""
        self.rec = SessionRecord(canary_quiet_us=referee.info.get("canary_quiet_us"))
        self.cycles_per_us = float(referee.info.get("cycles_per_us") or 0.0)
        """The GPU's spin rate as the referee measured it: every process spins the same cycles."""
        self.draw = random.SystemRandom()
        self.callables = ["candidate", "eager"] + (["compiled"] if self.compiled is not None else [])
        self.rec.compiled_note = compiled_note if self.compiled is None else None
        self.baselines = self.callables[1:]
        self.pool: dict[str, list[float]] = {}
        """The earlier sessions' baseline samples while they count (then each round times the
        candidate and one baseline)."""
        self.pool_dropped = False
        self.kept_slowed: dict[str, list[float]] = {}
        """The earlier sessions' samples of the baselines this session timed slower (the verdict's)."""
        self.cover_factor = LEAD_FACTOR
        self.held_out = list(held_out)
        """Held-out shapes to time the candidate at, after its own timing (none: not asked)."""
        self.held_out_bar_ms = held_out_bar_ms
        """Time them only where the candidate's median at the task's shape is under this (None: always)."""
        self.shipped = 0
        self.seen = 0
        """Timed calls whose outputs came back so far (the reservoir's count, across a re-check)."""

    def _op(
        self, callable_: str, seed: int, calls: int, warmup: bool, outputs: str, overrides: dict[str, int] | None = None
    ) -> BatchOp:
        rate = self.cycles_per_us
        op = BatchOp(
            callable=callable_,
            seed=seed,
            calls=calls,
            warmup=warmup,
            # A pooled baseline was timed in the task's last session: its warm-up is its calls alone
            # (three 25 ms warm-ups were ~50 ms more a candidate than one, of ~300 ms on an H200).
            warmup_min_s=0.0 if callable_ in self.pool else self.cfg.warmup_min_s,
            predraw=self._memory_cap() if warmup else 0,
            lead_cycles=int(self.rec.lead_us * rate),
            cover_cycles=0 if warmup else int((self.rec.cover_seed_us + self.rec.cover_us * calls) * rate),
            outputs=outputs,
            canary=callable_ != "candidate" and self.device == "cuda",
        )
        if overrides:
            op["overrides"] = dict(overrides)
        return op

    async def _candidate_batch(self, op: BatchOp, timeout_s: float) -> tuple[Batch, dict[str, Any], list[Any]]:
        worker = self.reader.worker
        t0 = time.perf_counter()
        async with asyncio.timeout(timeout_s):
            await worker.send(op_frame(Op.BATCH, op))
            got = await self.reader.take(Report.TIMED)
        wall = (time.perf_counter() - t0) * 1e3
        if got is None:
            raise SessionAborted("the candidate's process stopped during a timed batch")
        header, blobs = got
        samples = header.get("samples")
        if not isinstance(samples, list) or not all(isinstance(x, int | float) for x in samples):
            raise FrameError("a timed batch's samples are not numbers")
        batch = Batch.from_report("candidate", header, wall, op["warmup"])
        return batch, header, blobs

    async def _batch(
        self,
        callable_: str,
        seed: int,
        calls: int,
        warmup: bool,
        deadline: float,
        shape: HeldOutShape | None = None,
    ) -> tuple[Batch, Any]:
        """One batch of ``callable_``, kept in the record (at a held-out ``shape``: returned only,
        its outputs not sent)."""
        outputs = "none" if warmup or shape is not None else self.rec.outputs_mode
        op = self._op(callable_, seed, calls, warmup, outputs, shape.overrides if shape is not None else None)
        timeout = max(0.5, deadline - time.perf_counter())
        if callable_ == "candidate":
            batch, header, blobs = await self._candidate_batch(op, timeout)
            extra: Any = (header, blobs)
        else:
            source = self.compiled if callable_ == "compiled" and self.compiled is not None else self.referee
            batch, header = await source.batch(op, timeout)
            extra = None
            self.rec.flush_bytes = int(header.get("flush_bytes") or 0)
            self.rec.l2_reset = self.rec.l2_reset or bool(header.get("l2_reset"))
            self.rec.timer = str(header.get("timer") or self.rec.timer)
        if shape is None:
            self.rec.batches.append(batch)
        return batch, extra

    def _memory_cap(self) -> int:
        """Most calls in one batch by memory: every call's inputs are drawn first, and where
        outputs stay for a ship every call's outputs live until the next batch."""
        n = MAX_BATCH
        if self.in_bytes:
            n = min(n, max(1, TIMING_INPUT_BYTES // self.in_bytes))
        if self.rec.outputs_mode == "keep" and self.out_bytes:
            n = min(n, max(1, KEPT_OUTPUT_BYTES // self.out_bytes))
        return n

    def _plan_batches(self, warm: dict[str, Batch]) -> int:
        """Calls per batch, from the warm-up's per-call time as the parent's clock saw it."""
        per_call = max(b.wall_ms / max(1, b.calls) for b in warm.values())
        n = int(self.cfg.timing_batch_s * 1e3 / max(per_call, 1e-3))
        return max(1, min(self._memory_cap(), n))

    async def run(self, budget_s: float) -> SessionRecord:
        """Warm-up, then rounds until every callable's median is known to the target error, the
        repetitions or the budget run out; then the final canary."""
        cfg = self.cfg
        started = time.perf_counter()
        deadline = started + budget_s
        self.rec.outputs_mode = "all" if self.out_bytes <= cfg.timing_ship_all_bytes else "keep"
        self.rec.lead_us = cfg.timing_lead_us if self.device == "cuda" else 0.0
        self.rec.flush_us = float(self.referee.info.get("flush_us") or 0.0)
        floor = self.referee.info.get("empty_kernel_us")
        self.rec.empty_kernel_us = float(floor) if isinstance(floor, int | float) else None
        self.pool = self.referee.ledger.pooled(self.baselines)
        warm: dict[str, Batch] = {}
        warm_calls = max(1, min(cfg.warmup_min_calls, self._memory_cap()))  # then round its inputs
        for name in self.callables:
            warm[name], _ = await self._batch(name, secrets.randbits(62), warm_calls, True, deadline)
        n = self._plan_batches(warm)
        self.rec.batch_calls = n
        if self.device == "cuda":
            # The lead spin must outlast the host's work per call in every process, and a spin
            # before the draws the host's drawing (a candidate that claims less only makes its
            # own batches host-bound: more time outside its windows, against it), so the batches
            # are device-bound and the time outside the windows is the device's, the same for all.
            host = max((b.host_us or 0.0) for b in warm.values())
            self.rec.lead_us = min(MAX_LEAD_US, max(cfg.timing_lead_us, LEAD_FACTOR * host))
            self._size_cover(list(warm.values()))
        logger.debug(
            "timing_harness",
            calls=n,
            host_us={k: round(b.host_us or 0.0, 1) for k, b in warm.items()},
            draw_us={k: round(b.draw_us or 0.0, 1) for k, b in warm.items()},
            lead_us=round(self.rec.lead_us, 1),
            cover_us=round(self.rec.cover_us, 1),
            pooled={k: len(v) for k, v in self.pool.items()},
        )
        first_s = await self._rounds(n, deadline)
        excess = self._contradicted()
        if excess is not None and deadline - time.perf_counter() > 2 * first_s:
            # Before calling the report forged, time it again with room for a host that was slow
            # for a moment (compiles beside it, say): a forged report stays short of the parent's
            # clock however long the spins, and only the new rounds' samples count.
            self.rec.recheck_excess_us = excess
            logger.info("timing_recheck", excess_us=round(excess, 1), first_s=round(first_s, 3))
            self.rec.superseded = [b for b in self.rec.batches if not b.warmup]
            self.rec.batches = [b for b in self.rec.batches if b.warmup]
            self.rec.superseded_looks, self.rec.looks = self.rec.looks, []
            self.rec.lead_us = min(RECHECK_FACTOR * MAX_LEAD_US, RECHECK_FACTOR * self.rec.lead_us)
            self.cover_factor = RECHECK_FACTOR * LEAD_FACTOR
            self._size_cover(self.rec.superseded)
            await self._rounds(n, deadline)
        if self.held_out and self._worth_held_out():
            t_held = time.perf_counter()
            await self._held_out_times(min(deadline, t_held + cfg.held_out_timing_s), deadline)
            self.rec.held_out_s = time.perf_counter() - t_held
        if self.device == "cuda":
            self.rec.final_canary_us, self.rec.final_busy_ms = await self.referee.canary()
        self._settle_pool()
        self.rec.elapsed_s = time.perf_counter() - started
        return self.rec

    def _worth_held_out(self) -> bool:
        """Whether the candidate's median at the task's own shape is under the bar (or there is none)."""
        own = self._own("candidate")
        if not own:
            return False
        return self.held_out_bar_ms is None or statistics.median(own) < self.held_out_bar_ms

    async def _held_out_times(self, end: float, deadline: float) -> None:
        """The candidate and the eager reference at each held-out shape, in alternating batches of
        the same fresh inputs (the same harness as at the task's own shape), until both medians
        are known to ten times the target error, six rounds or ``end`` (no batch starts that its
        warm-up says would end past it). Each shape's batches are cross-checked on their own
        against the parent's clock: a contradicted report gives no time there (the verdict is the
        task's own shape's, timed before)."""
        slack_us, slack_ratio = crosscheck_slack(self.cfg, cuda=self.device == "cuda")
        target = 10 * self.cfg.timing_target_rel_err
        # a call at a held-out shape (no larger than the task's) takes at most about this long
        own_s = sum(statistics.median(x) for x in (self._own("candidate"), self._own("eager")) if x) / 1e3
        for shape in self.held_out:
            got = HeldOutTime(variant=shape.variant)
            self.rec.held_out.append(got)
            cap = MAX_BATCH if not shape.nbytes else max(1, min(MAX_BATCH, TIMING_INPUT_BYTES // shape.nbytes))
            warm_calls = min(self.cfg.warmup_min_calls, cap)
            if time.perf_counter() + warm_calls * own_s + 2 * self.cfg.warmup_min_s >= end:
                got.note = "out of time"
                continue
            warm = [
                (await self._batch(name, secrets.randbits(62), warm_calls, True, deadline, shape))[0]
                for name in ("candidate", "eager")
            ]
            per_call_s = max(b.wall_ms / max(1, b.calls) for b in warm) / 1e3
            n = max(1, min(cap, int(self.cfg.timing_batch_s / max(per_call_s, 1e-6))))
            samples: dict[str, list[float]] = {"candidate": [], "eager": []}
            batches: list[Batch] = []
            for rounds in range(1, 7):
                if time.perf_counter() + 2.5 * n * per_call_s > end:
                    got.note = "out of time" if rounds == 1 else f"{rounds - 1} round(s) in the time"
                    break
                seed = secrets.randbits(62)
                for name in ("candidate", "eager") if rounds % 2 else ("eager", "candidate"):
                    batch, _ = await self._batch(name, seed, n, False, deadline, shape)
                    samples[name] += batch.samples
                    batches.append(batch)
                if rounds >= 2 and all(len(x) >= 3 and median_rel_stderr(x) <= target for x in samples.values()):
                    break
            if not samples["candidate"] or not samples["eager"]:
                continue
            _, finding, _ = cross_check(batches, slack_us, slack_ratio, self.rec.flush_us, "", self.rec.empty_kernel_us)
            if finding is not None and finding.severity is Severity.REJECT:
                got.note = f"not kept: {finding.message}"
                continue
            got.candidate_ms = statistics.median(samples["candidate"])
            got.eager_ms = statistics.median(samples["eager"])
            got.calls = min(len(samples["candidate"]), len(samples["eager"]))

    def _own(self, name: str) -> list[float]:
        return [x for b in self.rec.batches if b.callable == name and not b.warmup for x in b.samples]

    def _agrees(self, name: str) -> bool:
        """Whether this session's own samples of baseline ``name`` agree with the pooled ones."""
        own, pool = self._own(name), self.pool[name]
        if not own:
            return False
        m_own, m_pool = statistics.median(own), statistics.median(pool)
        err = math.hypot(median_rel_stderr(own), median_rel_stderr(pool))
        agree = self.cfg.timing_pool_agree  # widened by noise, never past 5x (a CPU's medians can be 30% unsure)
        allowed = max(agree, min(3 * err, 5 * agree))
        return m_pool > 0 and abs(m_own - m_pool) / m_pool <= allowed

    def _slower(self, name: str) -> bool:
        """Whether this session's own ``name`` is slower than the pooled one (read where they disagree)."""
        own, pool = self._own(name), self.pool[name]
        return bool(own) and statistics.median(own) > statistics.median(pool)

    def _keep_pool_over_slowed(self, name: str) -> None:
        """This session's ``name`` came out slower than the earlier sessions': the verdict takes
        theirs (:attr:`SessionRecord.slowed`, their samples kept in ``rec.pooled``), the ledger
        keeps them and this session's join it not. The rounds go on as where the pool is dropped
        (every callable timed in turn, none settled from the pool): timing the candidate alone
        from here let a forged clock through the cross-check on the CPU (``hostile_patch_clock``
        judged correct, tests/gpu_runner/test_baseline_pool.py)."""
        own, pool = self._own(name), self.pool[name]
        detail = (
            f"{name} timed {statistics.median(own):.4g} ms in this session ({len(own)} calls), "
            f"{statistics.median(pool):.4g} ms in earlier ones ({len(pool)} calls): the earlier time is used"
        )
        self.rec.slowed[name] = detail
        self.kept_slowed[name] = list(pool)
        self.pool = {}
        logger.warning("baseline_slowed", detail=detail)

    def _drop_pool(self, name: str) -> None:
        """The pool disagrees with this session's own ``name``: neither counts for the other (the
        ledger is emptied; the next session seeds it afresh)."""
        own, pool = self._own(name), self.pool[name]
        detail = (
            f"earlier sessions' {name} ({statistics.median(pool):.4g} ms, {len(pool)} calls) disagreed with this "
            f"session's ({statistics.median(own) if own else math.nan:.4g} ms, {len(own)} calls): not pooled"
        )
        logger.info("baseline_pool_dropped", detail=detail)
        self.pool, self.pool_dropped = {}, True
        self.referee.ledger.clear()

    def _settle_pool(self) -> None:
        """Record what was pooled, and add this session's baselines to the ledger where its
        canaries refuse nothing and nothing disagreed."""
        for name in list(self.pool):
            if self.pool and not self._agrees(name):
                if self._slower(name):
                    self._keep_pool_over_slowed(name)
                else:
                    self._drop_pool(name)
        self.rec.pooled = dict(self.pool) or dict(self.kept_slowed)
        own = {name: self._own(name) for name in self.baselines}
        final = None if self.rec.final_canary_us is None else (self.rec.final_canary_us, self.rec.final_busy_ms)
        # The referee waits out a busy GPU before its batches, so a brief busy look (a spare
        # starting its CUDA context: in most 8 GB relu sessions on an H200) leaves its samples
        # clean; a session refused for work left running (KF104) is not kept.
        _, left_work = canary_check(
            self.rec.batches + self.rec.superseded,
            final,
            self.rec.canary_quiet_us,
            self.cfg.canary_busy_us,
            self.rec.looks + self.rec.superseded_looks,
        )
        if not self.pool_dropped and not self.rec.slowed and left_work is None:
            self.referee.ledger.add(own)

    def _settled(self, drop: bool = False) -> bool:
        """While the pool counts: whether every baseline's median is known (at least
        :data:`POOL_MIN_OWN` samples of its own, agreeing with the pool, and its own and the pool's
        together to the target error); ``drop``: a baseline that disagrees ends the pooling (the
        pool emptied, or, where this session's is the slower, kept for the verdict alone:
        :attr:`SessionRecord.slowed`).
        Rounds after that time the candidate alone, and the referee looks with its canary after
        each candidate batch (a baseline batch would look first too): on an 8 GB row sum, 30 rounds
        of a candidate batch and a baseline batch, each drawing its 8 GB of fresh inputs, were
        twice cd37ca4's timing time per candidate on an H200."""
        if not self.pool:
            return False
        target = self.cfg.timing_target_rel_err
        for name in self.baselines:
            own = self._own(name)
            if len(own) < POOL_MIN_OWN:
                return False
            if not self._agrees(name):
                if drop and self._slower(name):
                    self._keep_pool_over_slowed(name)
                elif drop:
                    self._drop_pool(name)
                return False
            if median_rel_stderr(own + self.pool[name]) > target:
                return False
        return True

    def _converged(self, samples: dict[str, list[float]]) -> bool:
        """Every callable's median known to the target error: the candidate's from its samples,
        each baseline's from its own, or, while the pool counts, as :meth:`_settled` says."""
        target = self.cfg.timing_target_rel_err
        if median_rel_stderr(samples["candidate"]) > target:
            return False
        if self.pool:
            return self._settled(drop=True)
        return all(median_rel_stderr(samples[name]) <= target for name in self.baselines)

    async def _rounds(self, n: int, deadline: float) -> float:
        """Rounds of ``n`` calls per callable until every callable's median is known to the
        target error, the repetitions or the budget run out; the seconds they took."""
        cfg = self.cfg
        started = time.perf_counter()
        min_rounds = max(1, math.ceil(cfg.timing_min_reps / n))
        max_rounds = max(min_rounds, math.ceil(cfg.timing_max_reps / n))
        ship_rounds: set[int] = set()
        can_ship = min(self.shippable, SHIPPED_CALLS) - self.shipped
        if self.rec.outputs_mode == "keep" and can_ship > 0:
            ship_rounds = set(self.draw.sample(range(min_rounds), min(min_rounds, can_ship)))
        samples: dict[str, list[float]] = {name: [] for name in self.callables}
        timing_budget = cfg.timing_budget_s
        rounds = 0
        while True:
            seed = secrets.randbits(62)  # fresh inputs for the round, the same for every callable
            look = False
            if self._settled():  # the candidate alone, then the referee's canary
                order, look = ["candidate"], self.device == "cuda"
            elif self.pool:  # one baseline a round, after the candidate: a referee batch follows every candidate batch
                order = ["candidate", self.baselines[rounds % len(self.baselines)]]
            else:
                order = self.callables[rounds % len(self.callables) :] + self.callables[: rounds % len(self.callables)]
            for name in order:
                batch, extra = await self._batch(name, seed, n, False, deadline)
                samples[name] += batch.samples
                if name != "candidate":
                    continue
                if self.rec.outputs_mode == "all":
                    self.seen = self._reservoir(extra, seed, n, self.seen)
                elif rounds in ship_rounds:
                    await self._ship(self.draw.randrange(n), seed, deadline)
            if look:
                self.rec.looks.append(await self.referee.canary())
            rounds += 1
            if self.device == "cuda" and rounds == 1:
                self._size_cover(self.rec.batches[-len(order) :], shrink_only=True)
            spent = time.perf_counter() - started
            if rounds >= min_rounds:
                converged = self._converged(samples)
                if converged or rounds >= max_rounds or spent > timing_budget:
                    break
            elif spent > 2 * timing_budget and rounds >= 3:
                break
        self.rec.rounds += rounds
        return time.perf_counter() - started

    def _contradicted(self) -> float | None:
        """The excess per call outside the windows where the parent's clock contradicts the
        candidate's report beyond what is allowed (None: it does not, or the report is refused on
        other grounds that no re-timing changes)."""
        slack_us, slack_ratio = crosscheck_slack(self.cfg, cuda=self.device == "cuda")
        _, finding, excess = cross_check(
            self.rec.batches, slack_us, slack_ratio, self.rec.flush_us, "", self.rec.empty_kernel_us
        )
        if finding is None or finding.severity is not Severity.REJECT:
            return None
        return excess

    def _size_cover(self, batches: list[Batch], shrink_only: bool = False) -> None:
        """The cover spins from the host's drawing in ``batches`` (the slowest process's, times
        :data:`LEAD_FACTOR`, or :data:`RECHECK_FACTOR` times that on a re-check): from the warm-up
        (whose measured draw comes after a draw as large as any timed batch's, so the allocator's
        first blocks are paid for), then, ``shrink_only``, from the first timed round where that
        drew faster. Never after every round: covers that change from round to round spread the
        referee's own time outside the windows, and the allowed excess grows with that spread. On
        an H200 a first timed round of 8 calls of 64 MB inputs, drawn into fresh blocks, sized the
        cover at 381 us a call (and the allowed excess at 496 us) against ~80 us. The callables
        of one round always share one cover."""
        f, top = self.cover_factor, MAX_LEAD_US * self.cover_factor / LEAD_FACTOR
        cover = min(top, f * max((b.draw_us or 0.0) for b in batches))
        seed = min(10 * top, f * max((b.seed_us or 0.0) for b in batches))
        if shrink_only:
            cover, seed = min(cover, self.rec.cover_us), min(seed, self.rec.cover_seed_us)
        self.rec.cover_us, self.rec.cover_seed_us = cover, seed

    def _reservoir(self, extra: Any, seed: int, calls: int, seen: int) -> int:
        """Keep a uniform sample of :data:`JUDGED_CALLS` of the timed calls whose outputs came back."""
        header, blobs = extra
        metas = list(header.get("tensors") or [])
        per_call = len(metas) // calls if calls and len(metas) % calls == 0 else 0
        arrays = decode_outputs(header, blobs) if per_call else []
        for k in range(calls):
            seen += 1
            outs = arrays[k * per_call : (k + 1) * per_call] if per_call else []
            dtypes = [str(m.get("dtype")) for m in metas[k * per_call : (k + 1) * per_call]] if per_call else []
            item = Kept(trial=-1, seed=seed, skip=k, outputs=outs, dtypes=dtypes)
            if len(self.rec.kept) < JUDGED_CALLS:
                self.rec.kept.append(item)
            else:
                j = self.draw.randrange(seen)
                if j < JUDGED_CALLS:
                    self.rec.kept[j] = item
        return seen

    async def _ship(self, call: int, seed: int, deadline: float) -> None:
        """Ask for one call's outputs of the last batch (larger outputs), chosen after it ended."""
        trial = self.next_trial
        self.next_trial += 1
        kept = Kept(trial=trial, seed=seed, skip=call)
        self.reader.timed_seeds[trial] = (seed, call)
        t0 = time.perf_counter()
        async with asyncio.timeout(max(0.5, deadline - time.perf_counter())):
            await self.reader.worker.send(op_frame(Op.SHIP, ShipOp(call=call, trial=trial)))
            got = await self.reader.take(Report.TRIAL)
        if got is None:
            raise SessionAborted("the candidate's process stopped while shipping a timed call")
        kept.header = got[0]
        kept.ship_ms = (time.perf_counter() - t0) * 1e3
        self.shipped += 1
        self.rec.kept.append(kept)
