"""Errors of the diagnosis package."""

from __future__ import annotations

from actors.runtime.errors import KfError


class DiagnosisError(KfError):
    """Root of the errors the diagnosers raise on purpose."""


class DiagnoserConfigError(DiagnosisError):
    """A diagnoser setting is out of range; the message names it."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"diagnoser setting {name}={value!r} is invalid: {rule}")
        self.name = name
        self.value = value
        self.rule = rule
