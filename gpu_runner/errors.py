"""Errors of the evaluator itself (never of a candidate: candidate faults become verdicts).

``RunnerError`` is the root. ``evaluate`` raises only these, and only when the evaluator cannot
do its job (a bad reference, a worker that cannot start, a closed service); whatever a candidate
does ends as an :class:`schemas.EvalResult` with a status.
"""

from __future__ import annotations

import re
import sys


class RunnerError(Exception):
    """Root of every error ``gpu_runner`` raises on purpose."""


class ConfigError(RunnerError):
    """A configuration value is invalid; the message names the field and the value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class InvalidReference(RunnerError):
    """The reference file is not a usable KernelBench task (it is the user's fault, not the candidate's)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"invalid reference: {reason}" + (f"\n{detail}" if detail else ""))
        self.reason = reason
        self.detail = detail

    def one_line(self) -> str:
        """The reason and, where the traceback reaches the task file, its line: what a user reads."""
        where = task_location(self.detail)
        return self.reason + (f" (task file {where})" if where else "")


REFERENCE_FILENAME = "<kfoundry-reference>"
"""The file name a reference's code is compiled under in the workers (its frames carry it)."""


def task_location(traceback_text: str) -> str | None:
    """``line N, in NAME`` of the innermost frame of the task file in a traceback, if any."""
    found = re.findall(r'File "' + re.escape(REFERENCE_FILENAME) + r'", line (\d+), in (\S+)', traceback_text)
    if not found:
        return None
    line, name = found[-1]
    return f"line {line}, in {name}"


def stuck_traceback(log: str) -> str | None:
    """A worker's log with, last, the innermost task-file frame of the stack it dumped while stuck
    (``faulthandler`` lists the innermost call first), in a traceback's words for
    :func:`task_location`; None when the log holds no such stack."""
    found = re.search(r'File "' + re.escape(REFERENCE_FILENAME) + r'", line (\d+) in (\S+)', log)
    if found is None:
        return None
    line, name = found.groups()
    return f'{log[-2000:]}\n  File "{REFERENCE_FILENAME}", line {line}, in {name}\n'


class WorkerStartError(RunnerError):
    """A sandboxed worker process could not be started or did not become ready."""

    def __init__(self, mode: str, reason: str, log: str = "") -> None:
        super().__init__(f"{mode} worker failed to start: {reason}" + (f"\n{log}" if log else ""))
        self.mode = mode
        self.reason = reason
        self.log = log


class DeviceUnavailable(RunnerError):
    """The requested device is not present (e.g. ``--device cuda`` on a machine with no GPU)."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(f"device {device!r} is not available: {reason}")
        self.device = device
        self.reason = reason


class ProtocolError(RunnerError):
    """A worker sent something out of order or malformed; the message says what."""


class ServiceClosed(RunnerError):
    """The evaluation service was used before ``start()`` or after ``aclose()``."""


class TaskTooLarge(RunnerError):
    """The task cannot fit even one evaluation in the device's or the host's memory; the message
    says how much it needs and how much there is."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EvaluatorFault(RunnerError):
    """The evaluator itself could not produce a verdict for a candidate (its reference run, a lost
    device, memory exhausted in trusted code): never the candidate's fault."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IsolationUnavailable(RunnerError):
    """Isolation is ``strict`` and a confinement layer does not hold here; the message says which
    and how to enable it."""


def missing_hint(exc: BaseException) -> str:
    """For a package the reference imports and this Python lacks: how to install it (the
    distribution is assumed to share the top-level module's name, as einops does)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return ""
    top = exc.name.split(".")[0]
    return f"; the reference imports {top}, which is not installed here: `{sys.executable} -m pip install {top}`"
