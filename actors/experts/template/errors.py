"""Errors of the template expert.

``analyse`` turns :class:`UnsupportedGraph` into an :class:`~actors.experts.template.ir.Unsupported`
value (a decline, not a failure); the other errors mean a bug or a bad input from a caller.
"""

from __future__ import annotations

from actors.runtime.errors import KfError


class TemplateError(KfError):
    """Root of the template expert's errors."""


class UnsupportedGraph(TemplateError):
    """The reference uses something the templates do not cover; the expert declines."""

    def __init__(self, detail: str, op: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.op = op


def number(value: object, what: str) -> float:
    """A scalar argument of the reference (``what`` names it) as a float; a decline when it is not
    a plain number (a tensor, a bool, a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnsupportedGraph(f"{what} must be a number, got {type(value).__name__} {value!r:.80}")
    return float(value)


class TraceFailed(TemplateError):
    """The reference could not be loaded, constructed or traced."""

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"{stage}: {detail}")
        self.stage = stage
        self.detail = detail


class InvalidParams(TemplateError):
    """A template parameter has a value outside its space; the message names it."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"template parameter {name}={value!r} is invalid: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed
