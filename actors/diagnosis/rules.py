"""The rule-based diagnoser: an ``EvalResult`` and its evidence → a typed ``Diagnosis``.

Failures are read from their logs (``actors.diagnosis.logparse``), refusals from the anti-cheat
findings, wrong answers from the correctness evidence (shape, NaN/Inf, errors at the edges,
errors everywhere, small errors above the bar, results that change between runs), and correct
candidates from measurement: launch-bound when launch overhead explains a large share of the time,
at speed-of-light when the fraction of the bound reaches a threshold, then (when the evaluator
profiled it) memory-, compute- or latency-bound by its hardware counters, otherwise memory- or
compute-bound by the limiter of the bound, or far from it. Pure and synchronous: the diagnoser
actor calls it per result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from actors.diagnosis.counters import Bound, bound_of, describe
from actors.diagnosis.errors import DiagnoserConfigError
from actors.diagnosis.hints import hints_for, rule_hint, suggested_role
from actors.diagnosis.logparse import LogFinding, parse_log
from schemas import (
    LOWER_PRECISION,
    Candidate,
    CheckName,
    CheckOutcome,
    Correctness,
    DeviceKind,
    Diagnosis,
    EvalResult,
    EvalStatus,
    Severity,
)
from schemas import DiagnosisCategory as C

_SHAPE_WORDS = ("shape", "outputs, the reference returns", "number of outputs", "output structure")
_FAILED_CHECK_CATEGORIES: dict[CheckName, C] = {
    CheckName.KERNELS_LAUNCHED: C.REJECTED_NO_KERNEL_LAUNCHED,
    CheckName.TIMED_LAUNCHES: C.REJECTED_NO_KERNEL_LAUNCHED,
    CheckName.INPUTS_UNCHANGED: C.REJECTED_INPUT_MUTATED,
    CheckName.OUTPUTS_NOT_ALIASED: C.REJECTED_OUTPUT_ALIASES_INPUT,
    CheckName.NO_DEFERRED_OUTPUTS: C.REJECTED_DEFERRED_WORK,
    CheckName.DEFERRED_WORK_GUARD: C.REJECTED_DEFERRED_WORK,
    CheckName.OUTPUT_TYPE: C.REJECTED_OUTPUT_TYPE,
    CheckName.TIMING_CROSS_CHECK: C.REJECTED_TIMER_TAMPERING,
    CheckName.OUTPUT_LAYOUT: C.REJECTED_OUTPUT_LAYOUT,
    CheckName.LATER_CALLS: C.REJECTED_OUTPUT_ALIASES_INPUT,
}
"""The category a refusal gets from the first failed check that names one (a refusal without findings)."""


@dataclass(frozen=True)
class RuleConfig:
    """Thresholds of the rules; validated at construction."""

    at_sol_fraction: float = 0.8
    """A candidate at this fraction of the speed-of-light bound (or more) is at the bound."""
    far_from_sol_fraction: float = 0.1
    """Below this fraction a candidate is far from the bound (an algorithmic change is due)."""
    launch_overhead_ms_cuda: float = 0.01
    """Fixed cost of one kernel launch on a GPU: a Triton launch from Python costs on the order of
    10 µs (an assumption; not measured on this project's GPU yet)."""
    launch_overhead_ms_cpu: float = 1.8
    """Fixed cost of one launch on the CPU: a trivial Triton kernel under the interpreter took
    1.8 ms per launch on the 2-core dev machine."""
    launch_bound_share: float = 0.5
    """Launch-bound when launches × overhead reach this share of the median time."""
    precision_factor: float = 10.0
    """Errors within this factor of the tolerance (or of the reference's own fp64 error) are
    precision problems rather than wrong results."""
    boundary_max_fraction: float = 0.25
    """At most this fraction of mismatching elements for errors to count as edge errors."""
    indexing_min_fraction: float = 0.5
    """At least this fraction of mismatching elements for errors to count as indexing errors."""
    precision_max_l2: float = 1e-2
    """A relative L2 error against float64 up to this is a precision problem (a kernel computing
    in bf16 or TF32 lands near 1e-3), however far above the reference's own error it is."""
    few_wrong_fraction: float = 0.05
    """Without the output shape, at most this fraction of wrong elements is read as an edge error
    (with low confidence)."""

    def __post_init__(self) -> None:
        for name in ("at_sol_fraction", "far_from_sol_fraction", "launch_bound_share"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise DiagnoserConfigError(name, value, "must be in (0, 1]")
        if self.far_from_sol_fraction >= self.at_sol_fraction:
            raise DiagnoserConfigError(
                "far_from_sol_fraction", self.far_from_sol_fraction, "must be below at_sol_fraction"
            )
        if self.precision_factor < 1:
            raise DiagnoserConfigError("precision_factor", self.precision_factor, "must be >= 1")
        for name in ("boundary_max_fraction", "indexing_min_fraction", "precision_max_l2", "few_wrong_fraction"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise DiagnoserConfigError(name, value, "must be in (0, 1)")
        for name in ("launch_overhead_ms_cuda", "launch_overhead_ms_cpu"):
            if getattr(self, name) < 0:
                raise DiagnoserConfigError(name, getattr(self, name), "must be >= 0")

    def launch_overhead_ms(self, kind: DeviceKind) -> float:
        """The fixed cost of one launch on a device of ``kind``."""
        return self.launch_overhead_ms_cpu if kind is DeviceKind.CPU else self.launch_overhead_ms_cuda


@dataclass(frozen=True)
class _Reading:
    category: C
    summary: str
    evidence: tuple[str, ...]
    hints: tuple[str, ...] = ()
    confidence: float = 1.0
    sol_distance: float | None = None


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.4g}{unit}"


class RuleDiagnoser:
    """Diagnoses one evaluation from its evidence alone (no network, no state between calls)."""

    version: str = "1.0"

    def __init__(self, config: RuleConfig | None = None, *, name: str = "rules") -> None:
        self.config = config or RuleConfig()
        self.name = name

    def diagnose(self, result: EvalResult, candidate: Candidate | None = None) -> Diagnosis:
        """The diagnosis of ``result`` (``candidate`` adds context where given)."""
        if result.status in (EvalStatus.COMPILE_ERROR, EvalStatus.RUNTIME_ERROR):
            reading = self._failure(result)
        elif result.status is EvalStatus.TIMEOUT:
            reading = self._timeout(result)
        elif result.status is EvalStatus.EVALUATOR_ERROR:
            reading = _Reading(
                category=C.EVALUATOR_FAULT,
                summary=result.summary,
                evidence=(result.summary,),
                hints=(),
                confidence=1.0,
            )
        elif result.status is EvalStatus.REJECTED:
            reading = self._rejected(result, Severity.REJECT)
        elif result.status is EvalStatus.INCORRECT:
            reading = self._incorrect(result)
        elif result.review:
            reading = self._reviewed(result)
        else:
            reading = self._speed(result)
        hints = tuple(dict.fromkeys(reading.hints + hints_for(reading.category)))
        return Diagnosis(
            candidate_id=result.candidate_id,
            category=reading.category,
            summary=reading.summary,
            evidence=reading.evidence,
            hints=hints,
            suggested_expert=suggested_role(reading.category),
            sol_distance=reading.sol_distance,
            confidence=reading.confidence,
            diagnoser=f"{self.name}/{self.version}",
        )

    # failures -------------------------------------------------------------------------------

    def _failure(self, result: EvalResult) -> _Reading:
        compile_stage = result.status is EvalStatus.COMPILE_ERROR
        findings: list[LogFinding] = []
        for text in (result.compile_log, result.runtime_log, result.summary):
            findings.extend(parse_log(text))
        findings.extend(f for c in result.checks if c.outcome is CheckOutcome.FAILED for f in parse_log(c.detail))
        if findings:
            best = max(findings, key=lambda f: f.specificity)
            evidence = best.evidence + ((f"location: {best.location}",) if best.location else ())
            family_note: tuple[str, ...] = ()
            if best.category.family != ("compile" if compile_stage else "runtime"):
                family_note = (f"reported as {result.status.value}; the message is a {best.category.family} error",)
            confidence = 0.9 if best.specificity >= 30 else 0.7 if best.specificity >= 20 else 0.5
            return _Reading(
                best.category,
                f"{best.source.value}: {best.message}",
                evidence + family_note,
                (best.hint,) if best.hint else (),
                confidence,
            )
        log = result.compile_log if compile_stage else result.runtime_log
        tail = tuple(line.strip() for line in (log or "").splitlines() if line.strip())[-3:]
        category = C.COMPILE_OTHER if compile_stage else C.RUNTIME_EXCEPTION
        return _Reading(category, result.summary, (result.summary, *tail), confidence=0.4)

    def _timeout(self, result: EvalResult) -> _Reading:
        in_compile = result.stages.run_s is None and "compil" in result.summary.lower()
        category = C.COMPILE_TIMEOUT if in_compile else C.RUNTIME_TIMEOUT
        evidence = [result.summary]
        if result.stages.compile_s is not None:
            evidence.append(f"compile stage {result.stages.compile_s:.1f} s")
        if result.stages.run_s is not None:
            evidence.append(f"run stage {result.stages.run_s:.1f} s")
        return _Reading(category, result.summary, tuple(evidence), confidence=0.8)

    def _rejected(self, result: EvalResult, severity: Severity) -> _Reading:
        fired = [f for f in result.findings if f.severity is severity]
        if fired:
            first = fired[0]
            evidence = tuple(
                f"{f.rule.value}" + (f" line {f.line}" if f.line is not None else "") + f": {f.message}" for f in fired
            )
            hint = rule_hint(first.rule)
            return _Reading(
                C.for_rule(first.rule),
                f"{first.rule.value}: {first.message}",
                evidence,
                (hint,) if hint else (),
                1.0 if severity is Severity.REJECT else 0.7,
            )
        failed = [c for c in result.checks if c.outcome is CheckOutcome.FAILED]
        for check in failed:
            name = CheckName.parse(check.name)
            category = _FAILED_CHECK_CATEGORIES.get(name) if name is not None else None
            if category is not None:
                return _Reading(
                    category, result.summary, (f"check {check.name} failed: {check.detail or ''}",), confidence=0.7
                )
        evidence = tuple(f"check {c.name} failed: {c.detail or ''}" for c in failed) or (result.summary,)
        return _Reading(C.REJECTED_OTHER, result.summary, evidence, confidence=0.5)

    def _reviewed(self, result: EvalResult) -> _Reading:
        if any(f.severity is Severity.REVIEW for f in result.findings):
            reading = self._rejected(result, Severity.REVIEW)
            return _Reading(reading.category, reading.summary, reading.evidence + result.review, reading.hints, 0.7)
        speed = self._speed(result)
        evidence = speed.evidence + tuple(f"flagged for review: {r}" for r in result.review)
        return _Reading(speed.category, speed.summary, evidence, speed.hints, 0.6, speed.sol_distance)

    # wrong answers --------------------------------------------------------------------------

    def _incorrect(self, result: EvalResult) -> _Reading:
        cfg = self.config
        corr = result.correctness
        failed = [c for c in result.checks if c.outcome is CheckOutcome.FAILED]
        details = " ".join(x for x in [*(c.detail or "" for c in failed), corr.detail if corr and corr.detail else ""])
        low = details.lower()
        evidence = [result.summary, *(f"check {c.name} failed: {c.detail or ''}" for c in failed)]
        if corr is not None:
            evidence.append(self._correctness_line(corr))
        ev = tuple(dict.fromkeys(evidence))
        if corr is None:
            category = C.INCORRECT_SHAPE if any(k in low for k in _SHAPE_WORDS) else C.INCORRECT_OTHER
            return _Reading(category, result.summary, ev, confidence=0.5)
        wrong = [s for s in corr.held_out if s.outcome == "wrong"]
        if wrong and corr.passed_trials == corr.trials:
            where = f"Correct at the reference's input shapes, wrong at {wrong[0].shape}."
            return _Reading(C.INCORRECT_HELD_OUT, where, ev, confidence=0.9)
        errs = (corr.max_abs_err, corr.max_rel_err, corr.err_vs_fp64)
        if any(e is not None and not math.isfinite(e) for e in errs) or "nan" in low or "inf " in low:
            return _Reading(C.INCORRECT_NAN_INF, "The output contains NaN or Inf.", ev)
        if any(k in low for k in _SHAPE_WORDS):
            return _Reading(C.INCORRECT_SHAPE, "The output has the wrong shape or count.", ev)
        if "dtype" in low:
            return _Reading(
                C.INCORRECT_OTHER, "The output has the wrong dtype.", ev, ("Return the reference's dtype.",)
            )
        if LOWER_PRECISION in (corr.detail or ""):
            # The evaluator found the error against float64 past the precision bar in the first
            # failing trial. Read below, the same verdicts were races where a trial passed and the
            # errors over all trials were past the small-error bound (KernelBench L2-21's TF32
            # candidates on an H100: 5 of 26 verdicts).
            return self._precision(corr, "The evaluator found lower precision than the reference's.", ev)
        if corr.nondeterministic:
            return _Reading(C.INCORRECT_RACE, "Outputs differ between runs on the same inputs.", ev, confidence=0.9)
        edge = self._edge(corr)
        if edge is not None:
            return _Reading(
                C.INCORRECT_BOUNDARY,
                "Errors sit at the edges of the output (tail not masked).",
                (*ev, edge),
                confidence=0.75,
            )
        if self._small_errors(corr):
            return self._precision(corr, "Errors are small but above the precision bar.", ev)
        if 0 < corr.passed_trials < corr.trials:
            note = f"{corr.passed_trials}/{corr.trials} trials passed with fresh inputs"
            return _Reading(C.INCORRECT_RACE, "Some trials pass and others fail.", (*ev, note), confidence=0.5)
        frac = corr.mismatch_fraction
        if frac is not None and frac >= cfg.indexing_min_fraction:
            return _Reading(C.INCORRECT_INDEXING, "Most of the output is wrong.", ev, confidence=0.6)
        if frac is not None and frac <= cfg.few_wrong_fraction and not corr.output_shape:
            note = f"only {frac:.2%} of elements are wrong; without the output shape the edge is not confirmed"
            return _Reading(
                C.INCORRECT_BOUNDARY, "A few elements are wrong (likely a tail block).", (*ev, note), confidence=0.5
            )
        return _Reading(C.INCORRECT_OTHER, result.summary, ev, confidence=0.5)

    @staticmethod
    def _precision(corr: Correctness, reason: str, ev: tuple[str, ...]) -> _Reading:
        tf32 = (
            (
                "The reference itself runs in TF32 at PyTorch's defaults (its error against float64 "
                f"{_fmt(corr.ref_default_err_vs_fp64)}), so TF32 is allowed, as cuDNN computes it: round the "
                "fp32 operands to nearest first, x = ((x.to(tl.int32, bitcast=True) + 0x1000) & -0x2000)"
                ".to(tl.float32, bitcast=True), then tl.dot(a, b, input_precision='tf32'); the dot alone "
                "truncates and errs about 3x as much. Never bf16 or fp16.",
            )
            if corr.ref_default_err_vs_fp64 is not None
            else ()
        )
        return _Reading(C.INCORRECT_PRECISION, reason, ev, tf32, confidence=0.8)

    @staticmethod
    def _correctness_line(c: Correctness) -> str:
        parts = [f"{c.passed_trials}/{c.trials} trials passed", f"max abs err {_fmt(c.max_abs_err)}"]
        parts.append(f"max rel err {_fmt(c.max_rel_err)}")
        if c.err_vs_fp64 is not None:
            parts.append(f"err vs fp64 {_fmt(c.err_vs_fp64)} (reference {_fmt(c.ref_err_vs_fp64)})")
        if c.ref_default_err_vs_fp64 is not None:
            parts.append(f"the reference at PyTorch's defaults errs {_fmt(c.ref_default_err_vs_fp64)} (TF32)")
        if c.mismatch_fraction is not None:
            parts.append(f"{c.mismatch_fraction:.2%} of elements mismatch")
        if c.first_bad_index is not None:
            parts.append(f"first bad index {list(c.first_bad_index)}")
        if c.output_shape is not None:
            parts.append(f"output shape {list(c.output_shape)}")
        return ", ".join(parts)

    def _small_errors(self, c: Correctness) -> bool:
        f = self.config.precision_factor
        if _finite(c.err_vs_fp64) and float(c.err_vs_fp64 or 0.0) <= self.config.precision_max_l2:
            return True
        if _finite(c.err_vs_fp64) and _finite(c.ref_err_vs_fp64):
            return float(c.err_vs_fp64 or 0.0) <= max(f * float(c.ref_err_vs_fp64 or 0.0), f * c.rtol)
        if _finite(c.max_abs_err) and float(c.max_abs_err or 0.0) <= f * (c.atol + c.rtol):
            return True
        return _finite(c.max_rel_err) and float(c.max_rel_err or 0.0) <= f * c.rtol

    def _edge(self, c: Correctness) -> str | None:
        """Why the first mismatch sits in a tail block, or ``None`` when it does not."""
        index, shape, frac = c.first_bad_index, c.output_shape, c.mismatch_fraction
        if index is None or not shape or frac is None or frac > self.config.boundary_max_fraction:
            return None
        if len(index) != len(shape):
            index, shape = (sum(i * math.prod(shape[k + 1 :]) for k, i in enumerate(index)),), (math.prod(shape),)
        for dim, (i, size) in enumerate(zip(index, shape, strict=True)):
            block = 16
            while block < size:
                tail = size % block
                start = size - tail
                if tail and i >= start and frac <= 1.5 * tail / size + 0.01:
                    return (
                        f"first mismatch at index {i} of dim {dim} (size {size}) lies in the last partial "
                        f"block of {block}; {frac:.2%} of elements mismatch"
                    )
                block *= 2
            if i == size - 1 and frac <= 1.5 / size + 0.01:
                return f"first mismatch at the last index of dim {dim} (size {size})"
        return None

    # correct: where the time goes -----------------------------------------------------------

    @staticmethod
    def _counted(result: EvalResult, ev: tuple[str, ...], distance: float | None) -> _Reading | None:
        """A slow candidate read from its profiler counters, when it was profiled."""
        counters = result.profile.counters if result.profile is not None else None
        bound = bound_of(counters) if counters is not None else None
        if counters is None or bound is None:
            return None
        category = {
            Bound.MEMORY: C.SLOW_MEMORY_BOUND,
            Bound.COMPUTE: C.SLOW_COMPUTE_BOUND,
            Bound.LATENCY: C.SLOW_LATENCY_BOUND,
        }[bound]
        stall = f" (most stalls: {counters.stalls[0].reason})" if counters.stalls else ""
        return _Reading(
            category,
            f"{bound.value.capitalize()}-bound by the profiler's counters{stall}.",
            (*ev, *describe(counters)),
            sol_distance=distance,
            confidence=0.9,
        )

    def _speed(self, result: EvalResult) -> _Reading:
        cfg = self.config
        sol, timing, profile = result.sol, result.timing, result.profile
        fraction = sol.fraction if sol is not None else None
        distance = max(0.0, 1.0 - fraction) if fraction is not None else None
        evidence: list[str] = []
        if timing is not None:
            evidence.append(f"median {timing.median_ms:.4g} ms (std {timing.std_ms:.3g}, {timing.reps} reps)")
        if result.speedup_vs_eager is not None:
            compiled = _fmt(result.speedup_vs_compiled, "x")
            evidence.append(f"speedup {result.speedup_vs_eager:.3g}x vs eager, {compiled} vs torch.compile")
        if sol is not None:
            evidence.append(
                f"speed-of-light bound {sol.bound_ms:.4g} ms ({sol.limiter}-limited), reached {_fmt(fraction)}"
            )
        launches = profile.kernel_launches if profile is not None else None
        kind = result.device.kind if result.device is not None else DeviceKind.CUDA
        overhead = cfg.launch_overhead_ms(kind)
        if launches is not None:
            evidence.append(f"{launches} kernel launches per forward")
        ev = tuple(evidence)

        if fraction is not None and fraction >= cfg.at_sol_fraction:
            return _Reading(C.AT_SOL, f"At {fraction:.0%} of the speed-of-light bound.", ev, sol_distance=distance)
        if launches is not None and launches >= 2 and timing is not None:
            cost = launches * overhead
            over_bound = sol is not None and cost > sol.bound_ms
            if cost >= cfg.launch_bound_share * timing.median_ms or over_bound:
                note = f"launch overhead ≈ {launches} × {overhead:g} ms = {cost:.3g} ms of {timing.median_ms:.4g} ms"
                return _Reading(
                    C.SLOW_LAUNCH_BOUND,
                    f"{launches} launches per forward; launch overhead dominates.",
                    (*ev, note),
                    (f"Fuse the {launches} kernels into fewer launches.",),
                    sol_distance=distance,
                )
        counted = self._counted(result, ev, distance)
        if counted is not None:
            return counted
        if fraction is None:
            return _Reading(
                C.SLOW_FAR_FROM_SOL,
                "Correct; no speed-of-light bound was measured.",
                ev or (result.summary,),
                confidence=0.3,
            )
        assert sol is not None
        if fraction < cfg.far_from_sol_fraction:
            return _Reading(
                C.SLOW_FAR_FROM_SOL,
                f"Only {fraction:.1%} of the speed-of-light bound.",
                ev,
                (f"The bound is {sol.bound_ms:.4g} ms; the kernel is {1 / fraction:.0f}x slower than that.",),
                sol_distance=distance,
            )
        if sol.limiter == "memory":
            gbps = sol.bytes_moved / (sol.bound_ms / fraction) / 1e6
            return _Reading(
                C.SLOW_MEMORY_BOUND,
                f"Memory-bound at {fraction:.0%} of the bandwidth bound.",
                (*ev, f"{sol.bytes_moved} bytes at {gbps:.4g} GB/s of {sol.peak_gbps:.4g} GB/s"),
                sol_distance=distance,
            )
        tflops = sol.flops / (sol.bound_ms / fraction) / 1e9
        return _Reading(
            C.SLOW_COMPUTE_BOUND,
            f"Compute-bound at {fraction:.0%} of the arithmetic bound.",
            (*ev, f"{sol.flops} FLOPs at {tflops:.4g} TFLOP/s of {sol.peak_tflops:.4g} TFLOP/s"),
            sol_distance=distance,
        )
