"""Errors of ``kfoundry bench``: each names the bad value in one line."""

from __future__ import annotations

from actors.runtime.errors import KfError


class BenchError(KfError):
    """Root of the bench's errors."""


class LayoutError(BenchError):
    """The directory given is not a KernelBench checkout (or lacks the level asked for)."""


class ProblemSpecError(BenchError):
    """A ``--problems`` value cannot be parsed or names problems the level does not have."""


class ResultsFileError(BenchError):
    """An existing ``bench.json`` cannot be resumed (unreadable, or from another level)."""


class Interrupted(BenchError):
    """The bench was asked to stop while a problem ran; that problem's result is not kept."""
