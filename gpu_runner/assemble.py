"""Assemble an :class:`schemas.EvalResult` from what the gate, the compile stage and the run collected."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from gpu_runner.compare import TrialCheck, correctness, precision_rule, speed_of_light, timing_stats
from gpu_runner.compiler import CompileOutcome
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.crosscheck import canary_check, cross_check, crosscheck_slack
from gpu_runner.gate import GateReport
from gpu_runner.kernel_times import read_kernel_times
from gpu_runner.pool import ReferenceData
from gpu_runner.protocol import Blob
from gpu_runner.timing_session import SessionRecord
from gpu_runner.verdict import (
    RunRecord,
    checks_from_infos,
    error_status,
    kept_ops,
    launches,
    layout_findings,
    profile_findings,
    runtime_findings,
    truncate,
)
from schemas import (
    Baselines,
    CheatRule,
    Check,
    CheckName,
    CheckOutcome,
    DeviceInfo,
    EvalResult,
    EvalStatus,
    Finding,
    PrecisionMode,
    Profile,
    ReferenceProfile,
    Severity,
    ShapeCheck,
    StageTimes,
    TimerKind,
)

logger = structlog.get_logger(__name__)

R = CheatRule


@dataclass
class Collected:
    """Everything known about one evaluation when the verdict is made."""

    job: EvalJob
    cfg: RunnerConfig
    gate: GateReport
    checks: list[Check] = field(default_factory=list)
    compile: CompileOutcome | None = None
    compile_pending: bool = False
    """The candidate was compiled before the task's held-out shapes were known: compiled at them
    too once they are (``EvaluationService._compile_late``)."""
    reference: ReferenceData | None = None
    record: RunRecord | None = None
    device: dict[str, Any] | None = None
    peaks: dict[str, Any] = field(default_factory=dict)
    stages: StageTimes = field(default_factory=StageTimes)
    timed_out: str | None = None
    planned_bytes: int | None = None
    """Device bytes the memory plan gave the candidate's process (None off the GPU or unplanned)."""
    trials: int | None = None
    """Trials the spare prepared (the memory plan may cut them below the configuration's)."""
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """Trials whose outputs the judge compares after the run (trial, frame header)."""
    compares: list[asyncio.Task[TrialCheck]] = field(default_factory=list)
    """Trial comparisons running in threads, in trial order (gathered before the verdict)."""
    compare_times: list[tuple[float, float, float]] = field(default_factory=list)
    """Per trial: seconds reading its outputs, queued for a comparer, comparing (for logs)."""
    session: SessionRecord | None = None
    """The timing session: every batch with the parent's clock, the canaries, the calls kept for judgment."""
    timed_frames: dict[int, tuple[dict[str, Any], list[Blob], Any]] = field(default_factory=dict)
    """Shipped timed calls' frames (trial number: header, blobs, pending bulk read), host-compared."""
    timed_checks: list[TrialCheck] = field(default_factory=list)
    """The judged timed calls' comparisons."""
    shape_compares: dict[int, asyncio.Task[TrialCheck]] = field(default_factory=dict)
    """Held-out shapes' comparisons running in threads (gathered with the trials')."""


def _expected(c: Collected) -> int:
    return c.trials if c.trials is not None else c.cfg.trials


def _base(c: Collected, status: EvalStatus, summary: str, **kw: Any) -> EvalResult:
    job = c.job
    device = DeviceInfo.model_validate(c.device) if c.device else None
    share = _nonfinite_share(c.reference)
    if share and status in (EvalStatus.CORRECT, EvalStatus.INCORRECT):  # what its outputs were judged against
        summary += f" (the reference's outputs hold NaN/Inf, {share:.1%} of elements: judged on matching positions)"
    mutated = c.reference.info.get("mutated_inputs") if c.reference is not None else None
    if mutated and isinstance(mutated, list) and status in (EvalStatus.CORRECT, EvalStatus.INCORRECT):
        which = ", ".join(str(i) for i in mutated if isinstance(i, int))
        summary += (
            f" (the reference modifies its input(s) {which} in place: judged on its outputs alone, each side "
            "on its own copy; a candidate may not modify its inputs)"
        )
    return EvalResult(
        run_id=job.run_id,
        candidate_id=job.candidate_id,
        island=job.island,
        task_id=job.task_id,
        status=status,
        summary=summary,
        device=device,
        stages=c.stages,
        evaluator=job.evaluator,
        attempt=job.attempt,
        **kw,
    )


def rejected_by_gate(c: Collected, summary: str) -> EvalResult:
    """The verdict when the static gate refuses the candidate before anything of it ran."""
    return _base(c, EvalStatus.REJECTED, summary, checks=tuple(c.checks), findings=tuple(c.gate.findings))


def evaluator_fault(c: Collected, message: str) -> EvalResult:
    """The result when the evaluator itself could not judge the candidate (never its fault)."""
    return _base(c, EvalStatus.EVALUATOR_ERROR, f"evaluator error: {message}", checks=tuple(c.checks))


def build(c: Collected) -> EvalResult:
    """The verdict, with every check, finding, log and number that could be filled."""
    limit = c.cfg.log_limit_chars
    findings: list[Finding] = list(c.gate.findings)
    checks = list(c.checks)
    compile_log = truncate(c.compile.log, limit) if c.compile and c.compile.log else None
    rec = c.record
    runtime_log = truncate(rec.log, limit) if rec and rec.log else None
    common: dict[str, Any] = {"compile_log": compile_log, "runtime_log": runtime_log}
    if c.timed_out is not None:
        corr = _correctness(c) if rec and rec.trial_checks else None
        return _base(
            c,
            EvalStatus.TIMEOUT,
            f"timeout: {c.timed_out}",
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr,
            **common,
        )
    if c.compile is not None and not c.compile.ok:
        err = c.compile.error
        first = (err.get("message") or "").strip().splitlines()[:1]
        summary = (
            f"compile_error: {err.get('etype', 'error')} in {err.get('stage', 'compile')}: {' '.join(first)[:300]}"
        )
        if err.get("traceback"):
            common["compile_log"] = truncate(f"{c.compile.log}\n{err['traceback']}", limit)
        return _base(c, EvalStatus.COMPILE_ERROR, summary, checks=tuple(checks), findings=tuple(findings), **common)
    assert rec is not None
    assert c.reference is not None
    own_names = set(c.gate.triton_kernels) | set(c.gate.cuda_kernels)
    infos = rec.trial_infos
    admitted = c.gate.admitted_aten_ops
    namespaces = c.gate.op_namespaces
    checks += checks_from_infos(infos, rec.trial_checks, _expected(c), admitted, namespaces)
    findings += runtime_findings(infos, own_names, admitted, namespaces)
    findings += _integrity(c, checks)
    torch_ops = (*c.gate.torch_ops_kept, *kept_ops(infos, admitted))
    common["torch_ops"] = torch_ops
    findings += profile_findings(rec.profile, own_names, bool(torch_ops))
    profile = candidate_profile(rec, infos)
    corr = _correctness(c) if rec.trial_checks else None
    if rec.error is not None:
        status, summary, finding = error_status(rec.error, c.planned_bytes)
        if rec.error.get("stage") == "held_out_shape" and (where := _shape_in_progress(c)):
            summary += f" (at held-out shape {where})"
        findings += [finding] if finding else []
        if rec.error.get("traceback"):
            common["runtime_log"] = truncate(f"{rec.log}\n{rec.error['traceback']}", limit)
        if status is EvalStatus.RUNTIME_ERROR and any(
            f.severity is Severity.REJECT for f in findings[len(c.gate.findings) :]
        ):
            status = EvalStatus.REJECTED
        return _base(
            c,
            status,
            summary,
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr,
            profile=profile,
            **common,
        )
    if rec.died is not None:
        where = _shape_in_progress(c)
        return _base(
            c,
            EvalStatus.RUNTIME_ERROR,
            f"runtime_error: the run process {rec.died}" + (f" at held-out shape {where}" if where else ""),
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr,
            profile=profile,
            **common,
        )
    rejects = [f for f in findings[len(c.gate.findings) :] if f.severity is Severity.REJECT]
    if rejects:
        return _base(
            c,
            EvalStatus.REJECTED,
            f"rejected: {rejects[0].rule.value}: {rejects[0].message}",
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr,
            profile=profile,
            **common,
        )
    if corr is None or corr.passed_trials < _expected(c):
        detail = corr.detail if corr else "no trial completed"
        return _base(
            c,
            EvalStatus.INCORRECT,
            f"incorrect: {detail}",
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr,
            profile=profile,
            **common,
        )
    checks.append(held_out_check(c, corr.held_out))
    wrong = next((s for s in corr.held_out if s.outcome == "wrong"), None)
    if wrong is not None:  # correct at the reference's shape only: wrong where a user would call it
        detail = f"wrong at held-out shape {wrong.shape}: {wrong.detail}"
        return _base(
            c,
            EvalStatus.INCORRECT,
            f"incorrect: {detail}"[:600],
            checks=tuple(checks),
            findings=tuple(findings),
            correctness=corr.model_copy(update={"detail": detail}),
            profile=profile,
            **common,
        )
    return _timed(c, checks, findings, corr, profile, common)


def _integrity(c: Collected, checks: list[Check]) -> list[Finding]:
    """What the parent checked of the trials itself: the inputs each trial sent back against the
    spare's checksums, the first trial's outputs after the later calls, the outputs' layout."""
    rec, ref = c.record, c.reference
    assert rec is not None
    assert ref is not None
    out: list[Finding] = []
    infos = rec.trial_infos
    in_process = len(infos) - rec.inputs_checked
    how = f"{rec.inputs_checked} trial(s) sent back and checked here" + (
        f", {in_process} too large to send, checked in the candidate's process" if in_process > 0 else ""
    )
    if rec.mutated_trials:
        t = rec.mutated_trials[0]
        msg = f"trial {t}: the inputs changed during forward ({how})"
        out.append(Finding(rule=R.INPUT_MUTATED, severity=Severity.REJECT, message=msg))
    outcome = CheckOutcome.FAILED if rec.mutated_trials else CheckOutcome.PASSED if infos else CheckOutcome.SKIPPED
    checks.append(Check(name=CheckName.INPUTS_UNCHANGED, outcome=outcome, detail=how))
    if rec.later_changed:
        msg = "the first trial's outputs changed while later trials ran (one buffer returned every call)"
        out.append(Finding(rule=R.OUTPUT_ALIASES_INPUT, severity=Severity.REJECT, message=msg))
    outcome = (
        CheckOutcome.FAILED if rec.later_changed else CheckOutcome.PASSED if len(infos) > 1 else CheckOutcome.SKIPPED
    )
    checks.append(Check(name=CheckName.LATER_CALLS, outcome=outcome))
    before, after = rec.census.get("trials_done"), rec.census.get("timed")
    if before is not None and after is not None and (after[0] > before[0] or after[1] > before[1]):
        threads, procs = after[0] - before[0], after[1] - before[1]
        rule = R.PROCESSES if procs > 0 else R.THREADS
        msg = (
            f"the candidate's process tree grew while it was timed: {max(0, threads)} more thread(s), "
            f"{max(0, procs)} more process(es) (read by the evaluator from /proc)"
        )
        out.append(Finding(rule=rule, severity=Severity.REJECT, message=msg))
    layout, layout_check = layout_findings(infos, list(ref.info.get("out_metas") or []))
    checks.append(layout_check)
    out += layout
    ranged = [s for s in ref.scales if s != 1.0]
    checks.append(
        Check(
            name=CheckName.RANGE_TRIALS,
            outcome=CheckOutcome.PASSED if ranged else CheckOutcome.SKIPPED,
            detail=f"inputs x {', '.join(f'{s:g}' for s in ranged)} (the reference stays finite there"
            + (", its NaN/Inf where they are at scale 1)" if _nonfinite_share(ref) else ")")
            if ranged
            else "no scale keeps the reference finite, or no floating input",
        )
    )
    return out


def _timed(
    c: Collected, checks: list[Check], findings: list[Finding], corr: Any, profile: Profile, common: dict[str, Any]
) -> EvalResult:
    rec, ref, session = c.record, c.reference, c.session
    assert rec is not None
    assert ref is not None
    batches = [b for b in session.batches if not b.warmup] if session is not None else []
    timer = TimerKind(session.timer if session is not None else "perf_counter")
    pooled = session.pooled if session is not None else {}
    slowed = session.slowed if session is not None else {}
    # A baseline's earlier sessions' samples too, where this one pooled them (they agreed), or
    # theirs alone where this session's came out slower (it never flatters the candidate).
    stats = {
        name: timing_stats(
            [x for b in batches if b.callable == name and name not in slowed for x in b.samples] + pooled.get(name, []),
            timer,
            earlier=len(pooled.get(name, [])),
        )
        for name in ("candidate", "eager", "compiled")
    }
    cand, eager, compiled = stats.get("candidate"), stats.get("eager"), stats.get("compiled")
    review: list[str] = []
    wrong = [k for k in c.timed_checks if not k.ok]
    kept = len(c.timed_checks)
    checks.append(
        Check(
            name=CheckName.TIMED_OUTPUTS_RECHECKED,
            outcome=CheckOutcome.FAILED if wrong else CheckOutcome.PASSED if kept else CheckOutcome.SKIPPED,
            detail=f"{len(wrong)} wrong of {kept} timed calls judged (chosen after their batches, truth from "
            "the referee)" + (f"; first: {wrong[0].detail}" if wrong else ""),
        )
    )
    per_call = min((launches(i, c.gate.op_namespaces) for i in rec.trial_infos), default=0)
    every = batches + (session.superseded if session is not None else [])  # a re-check's first rounds too
    timed_launches = [b.own_launches for b in every if b.callable == "candidate" and b.own_launches is not None]
    calls_made = sum(b.calls for b in every if b.callable == "candidate")
    launches_ok = not timed_launches or sum(timed_launches) >= per_call * calls_made
    checks.append(
        Check(
            name=CheckName.TIMED_LAUNCHES,
            outcome=CheckOutcome.PASSED if launches_ok else CheckOutcome.FAILED,
            detail=f"{sum(timed_launches)} own launches in {calls_made} timed calls "
            "(counted in the candidate's process)",
        )
    )
    if not launches_ok:
        findings.append(
            Finding(
                rule=R.NO_KERNEL_LAUNCHED,
                severity=Severity.REJECT,
                message="fewer own kernel launches while timed than in the correctness trials",
            )
        )
    slack_us, slack_ratio = crosscheck_slack(c.cfg, bool(c.device and c.device.get("kind") == "cuda"))
    harness = (
        f"harness: lead {session.lead_us:.0f} us, cover {session.cover_us:.0f} us a call + "
        f"{session.cover_seed_us:.0f} us a batch, flush {session.flush_us:.0f} us, {session.batch_calls} calls a batch"
        if session is not None and session.lead_us
        else ""
    )
    if slowed:
        harness += ("; " if harness else "") + "; ".join(slowed.values())
    if session is not None and session.recheck_excess_us is not None:
        harness += (
            f"; timed again with longer spins after the first {len(session.superseded)} batches showed "
            f"{session.recheck_excess_us:.1f} us a call over (only the new batches count)"
        )
    cross, forged, _ = cross_check(
        batches,
        slack_us,
        slack_ratio,
        session.flush_us if session else 0.0,
        harness,
        session.empty_kernel_us if session else None,
    )
    checks.append(cross)
    findings += [forged] if forged else []
    final = (session.final_canary_us, session.final_busy_ms) if session and session.final_canary_us else None
    canary, busy = canary_check(
        every,
        final,
        session.canary_quiet_us if session else None,
        c.cfg.canary_busy_us,
        session.looks + session.superseded_looks if session else (),
    )
    checks.append(canary)
    findings += [busy] if busy else []
    flush = session.flush_bytes if session is not None else 0
    checks.append(
        Check(
            name=CheckName.L2_FLUSH,
            outcome=CheckOutcome.PASSED if flush else CheckOutcome.SKIPPED,
            detail=f"{flush} bytes before every timed call" if flush else "no device L2 to flush (CPU)",
        )
    )
    checks.append(
        Check(
            name=CheckName.PERSISTING_L2_RESET,
            outcome=CheckOutcome.PASSED if session is not None and session.l2_reset else CheckOutcome.SKIPPED,
        )
    )
    pending = session.compiled_note if session is not None else None
    compiled_error = (
        None if compiled else (pending or ref.info.get("compiled_error") or "disabled (torch.compile baseline off)")
    )
    checks.append(
        Check(
            name=CheckName.COMPILED_BASELINE,
            outcome=CheckOutcome.PASSED if compiled else CheckOutcome.SKIPPED,
            detail=None if compiled else compiled_error,
        )
    )
    tf32 = precision_rule(c.cfg, ref.info, c.job.precision).mode == "reference"  # TF32 admitted: its ceiling
    sol = speed_of_light(ref.info, c.peaks, c.cfg.peak_tflops, c.cfg.peak_gbps, cand.median_ms if cand else None, tf32)
    speedup = eager.median_ms / cand.median_ms if cand and eager and cand.median_ms > 0 else None
    speedup_c = compiled.median_ms / cand.median_ms if cand and compiled and cand.median_ms > 0 else None
    if sol is not None and sol.fraction is not None and sol.fraction > 1.1:
        msg = f"faster than the speed-of-light bound ({sol.fraction:.2f}x of it, {sol.limiter}-bound)"
        findings.append(Finding(rule=R.IMPLAUSIBLE_SPEED, severity=Severity.REVIEW, message=msg))
        review.append(msg)
    elif speedup is not None and speedup > c.cfg.review_speedup and sol is None:
        msg = f"{speedup:.1f}x over eager with no speed-of-light bound to explain it"
        findings.append(Finding(rule=R.IMPLAUSIBLE_SPEED, severity=Severity.REVIEW, message=msg))
        review.append(msg)
    checks.append(
        Check(
            name=CheckName.SPEED_OF_LIGHT,
            outcome=CheckOutcome.PASSED if sol else CheckOutcome.SKIPPED,
            detail=f"{sol.fraction:.3f} of the bound" if sol and sol.fraction else "no bound",
        )
    )
    review += [f.message for f in findings if f.severity is Severity.REVIEW and f.message not in review]
    baselines = Baselines(
        eager=eager, compiled=compiled, compiled_error=compiled_error, profile=reference_profile(ref.info)
    )
    rejects = [f for f in findings[len(c.gate.findings) :] if f.severity is Severity.REJECT]
    status, summary = EvalStatus.CORRECT, ""
    if cand is None:
        status, summary = EvalStatus.INCORRECT, "incorrect: no timed call completed"
    if wrong:
        status, summary = EvalStatus.INCORRECT, f"incorrect: timed call wrong: {wrong[0].detail}"
    if rejects:
        status, summary = EvalStatus.REJECTED, f"rejected: {rejects[0].rule.value}: {rejects[0].message}"
    if status is EvalStatus.CORRECT:
        where = c.device.get("name", "?") if c.device else "?"
        summary = (
            (f"correct: {speedup:.3g}x vs eager" if speedup else "correct")
            + (f", {speedup_c:.3g}x vs torch.compile" if speedup_c else "")
            + (f", {sol.fraction:.1%} of speed-of-light" if sol and sol.fraction else "")
            + f" on {where}"
        )
        if review:
            summary += " (flagged for review)"
    return _base(
        c,
        status,
        summary,
        checks=tuple(checks),
        findings=tuple(findings),
        correctness=corr,
        timing=cand,
        baselines=baselines,
        speedup_vs_eager=speedup,
        speedup_vs_compiled=speedup_c,
        sol=sol,
        profile=profile,
        review=tuple(review),
        **common,
    )


def reference_profile(info: dict[str, Any]) -> ReferenceProfile | None:
    """The referee's profile of the reference's forward (``None``: not measured there)."""
    raw = info.get("op_profile")
    if raw is None:
        return None
    try:
        return ReferenceProfile.model_validate(raw)
    except ValidationError as exc:  # the referee's own fault: the verdict does not rest on it
        logger.warning("reference_profile_invalid", error=str(exc)[:500])
        return None


def _nonfinite_share(ref: Any) -> float:
    """The share of the reference's floating output elements that are NaN/Inf (its first draw)."""
    value = ref.info.get("nonfinite_share") if ref is not None else None
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def _correctness(c: Collected) -> Any:
    assert c.record is not None
    assert c.reference is not None
    dtype = c.reference.info.get("out_dtype", "float32")
    tol = c.cfg.tolerances.get(dtype, (0.0, 0.0))
    found = correctness(c.record.trial_checks, _expected(c), tol, PrecisionMode(c.job.precision or c.cfg.precision))
    share = _nonfinite_share(c.reference)
    update: dict[str, Any] = {"held_out": held_out(c), "held_out_note": c.reference.variants_note or None}
    if share:
        update["reference_nonfinite_share"] = share
    return found.model_copy(update=update)


def held_out(c: Collected) -> tuple[ShapeCheck, ...]:
    """The candidate at each held-out shape its spare drew, as far as it got. Where its job ended
    as it should (its process said it was done) every shape must have an answer: one missing means
    the candidate's process skipped it (the list of shapes lives there), and counts as wrong."""
    rec, ref = c.record, c.reference
    assert rec is not None
    assert ref is not None
    finished = rec.done is not None and rec.error is None and rec.died is None
    times = {t.variant: t for t in c.session.held_out} if c.session is not None else {}
    out: list[ShapeCheck] = []
    for v, variant in enumerate(ref.variants):
        label = str(variant["label"])
        if finished and v not in rec.shape_raised and v not in rec.shape_checks:
            why = "the candidate's process sent nothing for this shape (it was skipped)"
            out.append(ShapeCheck(shape=label, outcome="wrong", detail=why))
        elif v in rec.shape_raised:
            out.append(ShapeCheck(shape=label, outcome="raised", detail=rec.shape_raised[v]))
        elif v in rec.shape_checks:
            k = rec.shape_checks[v]
            detail = "" if k.ok else (k.detail or k.category or "outputs differ")
            timed = times.get(v) if k.ok else None
            out.append(
                ShapeCheck(
                    shape=label,
                    outcome="correct" if k.ok else "wrong",
                    detail=detail,
                    max_abs_err=k.max_abs,
                    candidate_ms=timed.candidate_ms if timed is not None else None,
                    eager_ms=timed.eager_ms if timed is not None else None,
                    timing_note=(timed.note or None) if timed is not None else None,
                )
            )
    return tuple(out)


def _shape_in_progress(c: Collected) -> str | None:
    """The held-out shape the candidate was called at when its job ended, if its trials were all
    in and some shape was still to come (shapes are called in order, after the trials)."""
    rec, ref = c.record, c.reference
    if rec is None or ref is None or not ref.variants or len(rec.trial_infos) < len(ref.seeds):
        return None
    done = set(rec.shape_raised) | set(rec.shape_checks) | set(c.shape_compares)
    pending = [v for v in range(len(ref.variants)) if v not in done]
    return str(ref.variants[pending[0]]["label"]) if pending else None


def held_out_check(c: Collected, shapes: tuple[ShapeCheck, ...]) -> Check:
    """The ``held_out_shapes`` check: every shape's outcome in one line."""
    assert c.reference is not None
    note = c.reference.variants_note
    if not shapes:
        return Check(name=CheckName.HELD_OUT_SHAPES, outcome=CheckOutcome.SKIPPED, detail=note or "no held-out shape")
    wrong = [s for s in shapes if s.outcome == "wrong"]
    parts = [f"{s.outcome} at {s.shape}" + (f" ({s.detail})" if s.detail else "") for s in shapes]
    return Check(
        name=CheckName.HELD_OUT_SHAPES,
        outcome=CheckOutcome.FAILED if wrong else CheckOutcome.PASSED,
        detail="; ".join(parts)[:1500] + (f" [drawn from {note}]" if note else ""),
    )


def candidate_profile(rec: RunRecord, infos: list[dict[str, Any]]) -> Profile:
    """What the candidate launched: counts and names from its first trial (or the profiler's),
    its peak memory, and its own kernels timed one by one after its timed calls (from the ``done``
    frame, dropped if malformed)."""
    own = infos[0].get("own_launches") if infos else None
    names = (
        tuple(rec.profile.get("kernels", [])[:16])
        if rec.profile
        else tuple(infos[0].get("own_names", []))
        if infos
        else ()
    )
    launches = rec.profile.get("launches") if rec.profile else own
    done = rec.done or {}
    times, timer = read_kernel_times(done.get("kernel_times"), done.get("kernel_timer"))
    return Profile(
        kernel_launches=launches,
        own_kernel_launches=own,
        kernel_names=names,
        peak_memory_bytes=rec.memory_peak,
        kernel_times=times,
        kernel_timer=timer.value if timer is not None else None,
    )
