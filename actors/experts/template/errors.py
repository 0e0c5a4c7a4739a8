"""Errors of the template expert.

``analyse`` turns :class:`UnsupportedGraph` into an :class:`~actors.experts.template.ir.Unsupported`
value (a decline, not a failure); the other errors mean a bug or a bad input from a caller.
"""

from __future__ import annotations

from actors.errors import KfError


class TemplateError(KfError):
    """Root of the template expert's errors."""


class UnsupportedGraph(TemplateError):
    """The reference uses something the templates do not cover; the expert declines."""

    def __init__(self, detail: str, op: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.op = op


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
