"""Errors of the experience library: one root, fielded subclasses.

A snapshot that cannot be used is not an error for the caller: :meth:`ExperienceLibrary.load`
returns ``None`` and logs why (the JetStream stream is the source of truth and a replay rebuilds
the library). :class:`SnapshotError` carries that reason inside the package.
"""

from __future__ import annotations

from pathlib import Path


class ExperienceError(Exception):
    """Root of every error the experience package raises on purpose."""


class ConfigError(ExperienceError):
    """A configuration value is invalid; ``field`` and ``value`` name it."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class EmbedderUnavailable(ExperienceError):
    """An embedder cannot be used on this machine (package, model files or library missing)."""

    def __init__(self, embedder: str, reason: str) -> None:
        super().__init__(f"embedder {embedder} is unavailable: {reason}")
        self.embedder = embedder
        self.reason = reason


class EmbeddingShapeError(ExperienceError):
    """An embedder returned an array of the wrong shape or type."""

    def __init__(self, embedder: str, expected: tuple[int, int], got: tuple[int, ...]) -> None:
        super().__init__(f"embedder {embedder} returned shape {got}, expected {expected}")
        self.embedder = embedder
        self.expected = expected
        self.got = got


class UnknownExperience(ExperienceError, KeyError):
    """No experience with this id is in the library."""

    def __init__(self, experience_id: str) -> None:
        super().__init__(f"no experience {experience_id!r} in the library")
        self.experience_id = experience_id

    def __str__(self) -> str:
        return str(self.args[0])


class SnapshotError(ExperienceError):
    """A snapshot could not be written or read; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"snapshot {path}: {reason}")
        self.path = path
        self.reason = reason
