"""The verdict: turn everything the stages collected into one :class:`schemas.EvalResult`.

Order of precedence: timeout, compile error, runtime error or crash, anti-cheat rejection,
incorrect outputs, then correct (with review flags for implausible speed). Every check that ran
or was skipped is listed; every finding carries its rule id.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

from gpu_runner.compare import TrialCheck
from schemas import CheatRule, Check, CheckName, CheckOutcome, EvalStatus, Finding, Severity

R = CheatRule
FOREIGN_OK = re.compile(r"memset|memcpy|fill|copy", re.IGNORECASE)


@dataclass
class RunRecord:
    """What the parent collected from one run worker."""

    sandbox: dict[str, str] = field(default_factory=dict)
    trial_infos: list[dict[str, Any]] = field(default_factory=list)
    trial_checks: list[TrialCheck] = field(default_factory=list)
    memory_peak: int | None = None
    profile: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    died: str | None = None
    timed_out: bool = False
    log: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    """The worker's own step durations (set-up before the GPU grant, then the GPU window), for logs."""
    inputs_checked: int = 0
    """Trials whose inputs came back after the call (checked here against the spare's checksums)."""
    mutated_trials: list[int] = field(default_factory=list)
    """Trials whose inputs came back changed."""
    later_changed: bool = False
    """The first trial's outputs changed during the later trials (as the spare saw it)."""
    census: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(threads, processes) of the candidate's process tree as the parent read them from ``/proc``:
    when its trials were done and when its timing was."""
    shape_raised: dict[int, str] = field(default_factory=dict)
    """Held-out shapes (by number) at which the candidate raised, with what it raised."""
    shape_checks: dict[int, TrialCheck] = field(default_factory=dict)
    """Held-out shapes at which it returned: how its outputs compared (or what refused them)."""


def truncate(text: str, limit: int) -> str:
    """Head and tail of a long log."""
    if len(text) <= limit:
        return text
    half = limit // 2 - 40
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def exit_description(returncode: int | None) -> str:
    """Plain words for a process's exit status."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def forbidden_ops(info: dict[str, Any], admitted: frozenset[str]) -> dict[str, int]:
    """A trial's foreign aten ops that the run's policy does not admit."""
    return {k: v for k, v in (info.get("foreign_ops") or {}).items() if k not in admitted}


def kept_ops(infos: list[dict[str, Any]], admitted: frozenset[str]) -> tuple[str, ...]:
    """Aten ops the trials left to PyTorch that the policy admitted (``aten.<name>``)."""
    return tuple(sorted({f"aten.{k}" for i in infos for k in (i.get("foreign_ops") or {}) if k in admitted}))


def _custom_ops(info: dict[str, Any], namespaces: tuple[str, ...], own: bool) -> dict[str, int]:
    """Calls of custom ops by name: those in ``namespaces`` (``own``), or the others."""
    ops = info.get("custom_ops") or {}
    return {str(k): int(n) for k, n in ops.items() if (str(k).split("::", 1)[0] in namespaces) is own}


def own_custom_ops(info: dict[str, Any], namespaces: tuple[str, ...]) -> int:
    """Calls of custom ops the candidate's own native sources register (its compiled kernels)."""
    return sum(_custom_ops(info, namespaces, True).values())


def foreign_custom_ops(info: dict[str, Any], namespaces: tuple[str, ...]) -> dict[str, int]:
    """Custom ops registered elsewhere (from Python: their implementation is PyTorch code)."""
    return _custom_ops(info, namespaces, False)


def launches(info: dict[str, Any], namespaces: tuple[str, ...]) -> int:
    """The candidate's own launches in one forward: Triton kernels and extension calls its process
    counted, and calls of custom ops its native sources register."""
    return int(info.get("own_launches", 0)) + own_custom_ops(info, namespaces)


def runtime_findings(
    infos: list[dict[str, Any]],
    own_names: set[str],
    admitted: frozenset[str] = frozenset(),
    namespaces: tuple[str, ...] = (),
) -> list[Finding]:
    """Reject-level findings from the worker's per-trial observations (``admitted``: aten ops the
    run's policy lets the forward leave to PyTorch; ``namespaces``: custom-op namespaces the
    candidate's native sources register)."""
    out: list[Finding] = []
    for info in infos:
        t = info.get("trial", "?")
        if info.get("bad_types"):
            out.append(
                Finding(
                    rule=R.OUTPUT_TYPE,
                    severity=Severity.REJECT,
                    message=f"trial {t}: forward returned {info['bad_types']}, not torch.Tensor",
                )
            )
        if not info.get("devices_ok", True):
            out.append(
                Finding(
                    rule=R.OUTPUT_TYPE,
                    severity=Severity.REJECT,
                    message=f"trial {t}: an output is on another device than the reference's",
                )
            )
        if custom := foreign_custom_ops(info, namespaces):
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(custom.items()))
            out.append(
                Finding(
                    rule=R.TORCH_COMPUTE,
                    severity=Severity.REJECT,
                    message=f"trial {t}: custom ops its own native code does not register ran in forward: {ops} "
                    "(an op registered from Python computes with PyTorch)",
                )
            )
        if launches(info, namespaces) == 0:
            out.append(
                Finding(
                    rule=R.NO_KERNEL_LAUNCHED,
                    severity=Severity.REJECT,
                    message=f"trial {t}: none of the candidate's own kernels ran during forward",
                )
            )
        if admitted and admitted <= set(info.get("foreign_ops") or {}):
            out.append(
                Finding(
                    rule=R.TORCH_COMPUTE,
                    severity=Severity.REJECT,
                    message=f"trial {t}: every compute op of the reference ran in PyTorch "
                    f"({', '.join(sorted(admitted))}): its own kernels did none of the work",
                )
            )
        if forbidden := forbidden_ops(info, admitted):
            ops = ", ".join(f"aten.{k} x{v}" for k, v in sorted(forbidden.items()))
            out.append(
                Finding(
                    rule=R.TORCH_COMPUTE,
                    severity=Severity.REJECT,
                    message=f"trial {t}: torch compute ops ran in forward: {ops}",
                )
            )
        if info.get("aliased"):
            out.append(
                Finding(
                    rule=R.OUTPUT_ALIASES_INPUT,
                    severity=Severity.REJECT,
                    message=f"trial {t}: an output shares memory with an input or another output",
                )
            )
        if info.get("deferred"):
            out.append(
                Finding(
                    rule=R.DEFERRED_WORK,
                    severity=Severity.REJECT,
                    message=f"trial {t}: outputs changed after forward returned (work deferred)",
                )
            )
        if info.get("threads", 0) > 0:
            out.append(
                Finding(
                    rule=R.THREADS,
                    severity=Severity.REJECT,
                    message=f"trial {t}: {info['threads']} thread(s) left running after forward",
                )
            )
        if info.get("children", 0) > 0:
            out.append(
                Finding(
                    rule=R.PROCESSES,
                    severity=Severity.REJECT,
                    message=f"trial {t}: {info['children']} child process(es) running after forward",
                )
            )
    del own_names
    return out


def _layout(strides: list[int], shape: list[int]) -> tuple[tuple[int, int], ...]:
    """Strides where they matter: dimensions of size 1 may have any."""
    return tuple((d, st) for d, (st, n) in enumerate(zip(strides, shape, strict=False)) if n > 1)


def layout_findings(infos: list[dict[str, Any]], ref_metas: list[dict[str, Any]]) -> tuple[list[Finding], Check]:
    """Outputs in the reference's layout: the same strides wherever a dimension has more than one
    element (a contiguous output where the reference's is contiguous). A user who does
    ``y.view(-1)`` on a column-major "equal" result gets an error, or other numbers."""
    wanted = [m.get("stride") for m in ref_metas]
    if not infos or any(w is None for w in wanted):
        return [], Check(name=CheckName.OUTPUT_LAYOUT, outcome=CheckOutcome.SKIPPED, detail="no strides to compare")
    out: list[Finding] = []
    for info in infos:
        got = info.get("strides") or []
        for i, (strides, meta) in enumerate(zip(got, ref_metas, strict=False)):
            shape = [int(n) for n in meta.get("shape", [])]
            if len(strides) != len(shape) or _layout(strides, shape) != _layout(list(meta["stride"]), shape):
                out.append(
                    Finding(
                        rule=R.OUTPUT_LAYOUT,
                        severity=Severity.REJECT,
                        message=f"trial {info.get('trial', '?')}: output {i} has strides {list(strides)}, the "
                        f"reference's {list(meta['stride'])} (shape {shape})",
                    )
                )
                break
        if out:
            break
    detail = out[0].message if out else "every output in the reference's layout"
    outcome = CheckOutcome.FAILED if out else CheckOutcome.PASSED
    return out, Check(name=CheckName.OUTPUT_LAYOUT, outcome=outcome, detail=detail)


def profile_findings(profile: dict[str, Any] | None, own_names: set[str], torch_kept: bool = False) -> list[Finding]:
    """Review flags for device kernels the candidate did not define (vendor libraries, torch);
    ``info`` only when the run's policy admitted torch ops that the candidate kept."""
    if not profile or not profile.get("kernels") or not own_names:
        return []
    foreign = sorted({k for k in profile["kernels"] if not any(n in k for n in own_names) and not FOREIGN_OK.search(k)})
    if not foreign:
        return []
    return [
        Finding(
            rule=R.TORCH_COMPUTE,
            severity=Severity.INFO if torch_kept else Severity.REVIEW,
            message=f"kernels not defined by the candidate ran in forward: {foreign[:5]}"
            + (" (torch ops the run's policy admits)" if torch_kept else ""),
        )
    ]


def error_status(error: dict[str, Any], planned_bytes: int | None = None) -> tuple[EvalStatus, str, Finding | None]:
    """Status, summary and finding for an exception the worker reported.

    An out-of-memory in a process that held no more than the memory plan gave it (``planned_bytes``,
    what the worker reported it held plus what it asked for) is the evaluator's fault: the plan
    or another process took the memory, and the candidate is not blamed."""
    stage, etype, message = error.get("stage", "?"), error.get("etype", "?"), str(error.get("message", ""))
    first = message.strip().splitlines()[0][:300] if message.strip() else ""
    if stage == "missing_model":
        finding = Finding(rule=R.MISSING_MODEL, severity=Severity.REJECT, message="the candidate defines no ModelNew")
        return EvalStatus.REJECTED, "rejected: the candidate defines no ModelNew", finding
    low = message.lower()
    oom = etype in ("MemoryError", "OutOfMemoryError") or "out of memory" in low or "can't allocate memory" in low
    sizes = ""
    if oom and planned_bytes and isinstance(held := error.get("device_reserved"), int):
        # also at the import: on an H200 two candidates were blamed with a compile_error for an
        # out-of-memory that other processes caused
        needed = held + int(error.get("device_requested") or 0)
        sizes = f"{needed / (1 << 30):.1f} GiB needed of {planned_bytes / (1 << 30):.1f} GiB planned"
        if needed <= planned_bytes:
            return (
                EvalStatus.EVALUATOR_ERROR,
                f"evaluator error: out of memory in {stage} within the memory plan ({sizes}): the plan "
                "or another process left too little device memory",
                None,
            )
    if etype in ("CompilationError", "CompileTimeAssertionFailure", "OutOfResources") or stage == "import":
        return EvalStatus.COMPILE_ERROR, f"compile_error: {etype} while {stage}: {first}", None
    if oom:
        if sizes:
            first = f"{first} ({sizes} for the candidate's process)"
        finding = Finding(
            rule=R.RESOURCE_LIMIT,
            severity=Severity.INFO,
            message=f"{etype} in {stage}: the candidate hit its memory limit",
        )
        return EvalStatus.RUNTIME_ERROR, f"runtime_error: out of memory in {stage}: {first}", finding
    return EvalStatus.RUNTIME_ERROR, f"runtime_error: {etype} in {stage}: {first}", None


def checks_from_infos(
    infos: list[dict[str, Any]],
    trials: list[TrialCheck],
    expected: int,
    admitted: frozenset[str] = frozenset(),
    namespaces: tuple[str, ...] = (),
) -> list[Check]:
    """Named checks summarising the trials."""

    def check(name: CheckName, failed: bool, detail: str | None = None) -> Check:
        if not infos:
            return Check(name=name, outcome=CheckOutcome.SKIPPED, detail="no trial completed")
        return Check(name=name, outcome=CheckOutcome.FAILED if failed else CheckOutcome.PASSED, detail=detail)

    counts = [launches(i, namespaces) for i in infos]
    return [
        check(CheckName.OUTPUT_TYPE, any(i.get("bad_types") or not i.get("devices_ok", True) for i in infos)),
        check(CheckName.KERNELS_LAUNCHED, any(n == 0 for n in counts), f"own launches per forward: {counts}"),
        check(
            CheckName.NO_TORCH_COMPUTE,
            any(forbidden_ops(i, admitted) or foreign_custom_ops(i, namespaces) for i in infos),
        ),
        check(CheckName.OUTPUTS_NOT_ALIASED, any(i.get("aliased") for i in infos)),
        check(CheckName.NO_DEFERRED_OUTPUTS, any(i.get("deferred") for i in infos)),
        check(CheckName.NO_THREADS_LEFT, any(i.get("threads", 0) > 0 for i in infos)),
        check(CheckName.NO_CHILD_PROCESSES, any(i.get("children", 0) > 0 for i in infos)),
        check(
            CheckName.CORRECTNESS,
            any(not t.ok for t in trials) or len(trials) < expected,
            f"{sum(t.ok for t in trials)}/{expected} trials passed"
            + next((f"; first failure: {t.category}" for t in trials if not t.ok), ""),
        ),
    ]
