"""Errors of the evolution policies."""

from __future__ import annotations

from actors.runtime.errors import KfError


class EvolutionError(KfError):
    """Root of the errors the evolution policies raise on purpose."""


class PolicyConfigError(EvolutionError):
    """A policy setting is out of range; the message names it."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"evolution setting {name}={value!r} is invalid: {rule}")
        self.name = name
        self.value = value
        self.rule = rule


class WrongIsland(EvolutionError):
    """A message addressed to another island reached this one."""

    def __init__(self, island: str, addressed_to: str, what: str) -> None:
        super().__init__(f"island {island!r} received {what} addressed to island {addressed_to!r}")
        self.island = island
        self.addressed_to = addressed_to


class EmptyArchive(EvolutionError):
    """A parent was asked of an archive that holds no elite."""


class StateError(EvolutionError):
    """A serialised state cannot be restored (wrong island, unknown version, inconsistent)."""
