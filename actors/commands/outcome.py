"""The verdict of a run on its best kernel: faster than eager PyTorch, correct but not faster, not
timed on a GPU, or no correct candidate; with the exit status and the plain sentence for each.

``kfoundry run`` exits with :func:`exit_code` of the verdict (see the README's table), writes the
verdict into ``report.json`` and, when the best is not faster than the reference, marks
``best_model.py`` with :func:`model_header_note`; ``RunOutcome`` is what a run achieved, with its
one-line summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path

from schemas import Correctness, DeviceChoice, PrecisionMode, ShapeCheck, StopReason


class RunVerdict(StrEnum):
    """What the run's best kernel is worth against the reference."""

    FASTER_THAN_EAGER = "faster_than_eager"
    """A correct kernel faster than eager PyTorch, timed on a GPU."""
    NOT_FASTER_THAN_EAGER = "not_faster_than_eager"
    """Correct kernels only, none faster than eager PyTorch on a GPU: keep the reference."""
    NOT_TIMED_ON_GPU = "not_timed_on_gpu"
    """Correct kernels timed on the CPU (Triton's interpreter): correctness only, no speedup."""
    NO_CORRECT_CANDIDATE = "no_correct_candidate"
    """No candidate passed the checks."""


class ExitCode(IntEnum):
    """``kfoundry run``'s exit status."""

    FASTER = 0
    """A correct kernel faster than eager (on the CPU: a correct kernel; its timings are not speedups)."""
    NO_CORRECT = 1
    """No correct candidate."""
    USAGE = 2
    """A bad task, option or configuration (one ``kfoundry:`` line says which)."""
    REFUSED = 3
    """The evaluator refused the task (too large for this machine)."""
    NOT_FASTER = 4
    """Correct kernels, none faster than eager PyTorch on the GPU."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C."""


_EXIT = {
    RunVerdict.FASTER_THAN_EAGER: ExitCode.FASTER,
    RunVerdict.NOT_TIMED_ON_GPU: ExitCode.FASTER,
    RunVerdict.NOT_FASTER_THAN_EAGER: ExitCode.NOT_FASTER,
    RunVerdict.NO_CORRECT_CANDIDATE: ExitCode.NO_CORRECT,
}


def verdict_of(speedup_vs_eager: float | None, device: DeviceChoice) -> RunVerdict:
    """The verdict on a best kernel with this speedup over eager (``None``: no correct candidate)."""
    if speedup_vs_eager is None:
        return RunVerdict.NO_CORRECT_CANDIDATE
    if device is DeviceChoice.CPU:
        return RunVerdict.NOT_TIMED_ON_GPU
    return RunVerdict.FASTER_THAN_EAGER if speedup_vs_eager > 1.0 else RunVerdict.NOT_FASTER_THAN_EAGER


def beats(speedup: float | None) -> bool | None:
    """Whether a speedup means faster than its baseline; ``None`` when it was not measured."""
    return None if speedup is None else speedup > 1.0


def exit_code(verdict: RunVerdict) -> int:
    """The exit status of a run that ended with this verdict."""
    return int(_EXIT[verdict])


def compiled_clause(speedup_vs_compiled: float | None, derived: bool = False) -> str:
    """How the best compares with ``torch.compile`` (empty when that baseline was not measured;
    ``derived``: from the task's measured compiled/eager ratio, not timed beside the best)."""
    if speedup_vs_compiled is None:
        return ""
    how = " (derived from the measured compiled/eager ratio)" if derived else ""
    if speedup_vs_compiled > 1.0:
        return f"; {speedup_vs_compiled:.3f}x over torch.compile{how}"
    return f"; slower than torch.compile ({speedup_vs_compiled:.3f}x){how}"


def best_sentence(
    verdict: RunVerdict, speedup_vs_eager: float | None, speedup_vs_compiled: float | None, derived: bool = False
) -> str:
    """The plain sentence on the best kernel that the run's summary line carries."""
    if verdict is RunVerdict.NO_CORRECT_CANDIDATE or speedup_vs_eager is None:
        return "no correct candidate found"
    if verdict is RunVerdict.NOT_FASTER_THAN_EAGER:
        return (
            f"no candidate beat eager PyTorch; the best was {speedup_vs_eager:.3f}x"
            f"{compiled_clause(speedup_vs_compiled, derived)} (keep the reference)"
        )
    return f"best {speedup_vs_eager:.3f}x over eager{compiled_clause(speedup_vs_compiled, derived)}"


def model_header_note(verdict: RunVerdict, speedup_vs_eager: float | None, speedup_vs_compiled: float | None) -> str:
    """Comment lines that mark ``best_model.py`` when it is slower than a measured baseline."""
    lines = []
    if verdict is RunVerdict.NOT_FASTER_THAN_EAGER and speedup_vs_eager is not None:
        lines.append(
            f"# NOT FASTER: no candidate beat eager PyTorch (best {speedup_vs_eager:.3f}x); "
            "the reference is faster, this file is kept for inspection\n"
        )
    if verdict is not RunVerdict.NOT_TIMED_ON_GPU and speedup_vs_compiled is not None and speedup_vs_compiled <= 1.0:
        lines.append(f"# slower than torch.compile ({speedup_vs_compiled:.3f}x)\n")
    return "".join(lines)


def precision_note(correctness: Correctness | None) -> str:
    """The comment line of ``best_model.py`` that says what precision its outputs were judged at."""
    if correctness is None or correctness.err_vs_fp64 is None:
        return ""
    err = f"relative error {correctness.err_vs_fp64:.2e} against float64"
    if correctness.precision is PrecisionMode.EXACT:
        return f"# judged at exact precision (IEEE float32 reference): {err}\n"
    if correctness.ref_default_err_vs_fp64 is None:
        return f"# judged at the reference's precision (its own types at PyTorch's defaults, no TF32): {err}\n"
    return (
        f"# judged at the reference's precision (PyTorch's defaults, TF32 in cuDNN convolutions: the reference "
        f"errs {correctness.ref_default_err_vs_fp64:.2e}): {err}\n"
    )


def held_out_note(correctness: Correctness | None) -> str:
    """The comment line of ``best_model.py`` that says how it did at the evaluator's held-out shapes."""
    shapes = correctness.held_out if correctness is not None else ()
    if not shapes:
        note = correctness.held_out_note if correctness is not None else None
        return f"# held-out shapes: none checked ({note})\n" if note else ""
    correct = [s.shape + (f" ({speed})" if (speed := s.speed_text()) else "") for s in shapes if s.outcome == "correct"]
    raised = [s.shape for s in shapes if s.outcome == "raised"]
    line = "# held-out shapes (drawn by the evaluator):"
    if correct:
        line += f" correct at {'; '.join(correct)}"
    if raised:
        line += ("; " if correct else " ") + f"raises at {'; '.join(raised)} (specialised to the reference's shapes)"
    return line + "\n"


def held_out_sentence(shapes: tuple[ShapeCheck, ...]) -> str | None:
    """The run's end lines on its best at the held-out shapes: its speed where it was timed there,
    and a note where it raises at some (a specialised kernel)."""
    lines = []
    timed = [s for s in shapes if s.speedup_vs_eager is not None]
    if timed:
        lines.append(
            "at held-out shapes the best ran "
            + "; ".join(f"{s.speedup_vs_eager:.2f}x eager at {s.shape}" for s in timed)
        )
    raised = [s for s in shapes if s.outcome == "raised"]
    if raised:
        lines.append(
            f"note: the best is specialised to the reference's input shapes: it raises at {len(raised)} of the "
            f"{len(shapes)} held-out shapes the evaluator tried ({'; '.join(s.shape for s in raised)})"
        )
    return "\n".join(lines) or None


@dataclass
class RunOutcome:
    """What a run achieved."""

    run_id: str
    reason: StopReason
    evaluated: int
    statuses: dict[str, int]
    best_fitness: float | None
    best_candidate_id: str | None
    run_dir: Path
    device: DeviceChoice = DeviceChoice.CUDA
    cancelled: int = 0
    best_vs_compiled: float | None = None
    """The best's speedup over ``torch.compile``; ``None`` when that baseline was not measured."""
    best_compiled_derived: bool = False
    """``best_vs_compiled`` came from the task's measured compiled/eager ratio (``EvalResult.compiled_derived``)."""
    declined: str | None = None
    """What the experts declined and why (``actors.report.model.declines_sentence``), where they declined any."""
    dead_lettered: int = 0
    """Candidates an evaluator gave up on (the run's dead letters), not counted as cancelled."""
    reference_nonfinite_share: float | None = None
    """Where the reference's own outputs hold NaN/Inf, their share: the run's verdicts compared
    candidates on matching positions, which its end line says."""
    held_out: tuple[ShapeCheck, ...] = ()
    """The best at the evaluator's held-out shapes (its end line notes the ones it raises at)."""
    time_split: tuple[str, ...] = ()
    """Where the best's time and the reference's go (``actors.evolution.amdahl.breakdown_lines``)."""
    first_verdict: str | None = None
    """Where the first seconds went (``actors.report.model.FirstVerdict.sentence``)."""

    @property
    def verdict(self) -> RunVerdict:
        """Faster than eager, correct but not faster, not timed on a GPU, or nothing correct."""
        return verdict_of(self.best_fitness, self.device)

    @property
    def exit_code(self) -> int:
        """``kfoundry run``'s exit status for this outcome (``actors.commands.outcome.ExitCode``)."""
        return exit_code(self.verdict)

    def summary(self, elapsed_s: float) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        best = best_sentence(self.verdict, self.best_fitness, self.best_vs_compiled, self.best_compiled_derived)
        unadmitted = self.statuses.get("correct", 0) if self.best_fitness is None else 0
        if unadmitted:  # correct, yet none could be the best: each was flagged for review or not timed
            best = (
                f"no candidate admitted as best: {unadmitted} correct but flagged for review or not timed "
                "(report.json's category_counts says why)"
            )
        if self.best_fitness is not None:
            best += f" ({self.best_candidate_id}) -> {self.run_dir / 'best_model.py'}"
        cancelled = f", {self.cancelled} cancelled in flight" if self.cancelled else ""
        if self.dead_lettered:
            cancelled += f", {self.dead_lettered} dead-lettered (kfoundry dlq --run {self.run_id})"
        what = f"{self.evaluated} evaluated" + (f" ({counts})" if counts else "")
        if self.declined and not self.evaluated:  # nothing to judge: say why before anything else
            what += f": {self.declined}"
        line = (
            f"run {self.run_id} ended ({self.reason}) after {elapsed_s:.0f} s: {what}"
            f"{cancelled}; {best}; report in {self.run_dir / 'report.json'}"
        )
        if self.reference_nonfinite_share:
            line += (
                f"\nnote: the reference's own outputs hold NaN/Inf ({self.reference_nonfinite_share:.1%} of "
                "elements): candidates were judged on matching NaN/Inf positions and finite values elsewhere"
            )
        if self.first_verdict:
            line += f"\n{self.first_verdict}"
        if self.best_fitness is not None and (shaped := held_out_sentence(self.held_out)):
            line += f"\n{shaped}"
        if self.best_fitness is not None and self.time_split:
            line += "\nwhere the time goes (Amdahl's law; report.json's best.time_breakdown has it all):"
            line += "".join(f"\n  {part}" for part in self.time_split)
        if self.device is DeviceChoice.CPU:
            line += f"\n{CPU_TIMINGS_NOTE}"
        return line


CPU_TIMINGS_NOTE = (
    "note: this run timed kernels on the CPU (Triton's interpreter, eager PyTorch as the baseline): it checks "
    "correctness and shows the loop working; its timings are not speedups. Speedups are measured on a GPU."
)
