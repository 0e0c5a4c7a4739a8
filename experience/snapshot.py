"""Snapshots of a library on disk: a cache of the JetStream stream, written crash-safely.

A snapshot directory holds one generation ``g`` of data files and a manifest naming them:

* ``records-g.jsonl``: one experience per line (its wire JSON), in row order;
* ``utility-g.npy``: float64 ``[count, 3]``: each record's ``a``, ``b`` and outcomes seen;
* ``vectors-g.npy``: the float32 ``[count, dim]`` embeddings, row = index label;
* ``index-g.faiss``: the serialised IVF index (absent while the index is exact: a flat index is
  rebuilt from the vectors in milliseconds, an IVF one would need retraining);
* ``outcomes-g.json``: outcome ids already applied and outcomes waiting for unknown records;
* ``manifest.json``: format, embedder name and dimension, ``last_seq`` (the last stream
  sequence reflected), the library's settings, the IVF tuning, and the size and SHA-256 of
  each data file.

Data files are written and fsynced first, then the manifest replaces the old one atomically,
then files of older generations are removed. A crash at any point leaves either the old or the
new snapshot whole. Reading checks every size and digest, the embedder and the shapes, and
raises :class:`SnapshotError` with the reason for anything amiss.

Several curators may share one directory (runs side by side on one machine share its home): a
write holds an exclusive ``flock`` on ``.lock`` there and a read a shared one, so no writer picks
a generation another is writing or removes the files a reader is reading. The kernel drops the
lock of a killed process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pydantic
from pydantic import Field

from experience.errors import SnapshotError
from experience.index import IvfTuning
from experience.options import LibraryOptions
from schemas import Experience, Model, now

MANIFEST = "manifest.json"
LOCK = ".lock"
_EXTENSIONS = {"records": "jsonl", "utility": "npy", "vectors": "npy", "outcomes": "json", "index": "faiss"}
_DATA = re.compile(r"^(records|utility|vectors|index|outcomes)-(\d+)\.(jsonl|npy|faiss|json)$")


class FileEntry(Model):
    """One data file of a snapshot."""

    name: str
    """File name inside the snapshot directory."""
    size: int = Field(ge=0)
    """Size in bytes."""
    sha256: str
    """Hex SHA-256 of the content."""


class Manifest(Model):
    """What a snapshot holds; written last."""

    format: Literal[1] = 1
    """Layout version of the snapshot directory."""
    embedder: str
    """Name of the embedder of every vector (a different embedder refuses the snapshot)."""
    dim: int = Field(ge=1)
    """Vector dimension."""
    count: int = Field(ge=0)
    """Experiences in the snapshot."""
    last_seq: int = Field(ge=0)
    """Last stream sequence reflected; replay resumes at ``last_seq + 1``."""
    generation: int = Field(ge=1)
    """Suffix of this snapshot's data files."""
    exact_limit: int = Field(ge=1)
    """The library's exact-search limit."""
    seed: int
    """The library's seed."""
    options: LibraryOptions
    """The library's settings."""
    tuning: IvfTuning | None
    """IVF training and tuning; ``None`` while exact."""
    files: dict[str, FileEntry]
    """Data files by role: records, utility, vectors, outcomes, and index when IVF."""
    created_at: float = Field(default_factory=now)
    """When it was written."""


@dataclass
class LibraryState:
    """Everything a library needs to come back as it was (rows in label order)."""

    embedder: str
    dim: int
    exact_limit: int
    seed: int
    options: LibraryOptions
    records: list[Experience]
    alpha: list[float]
    beta: list[float]
    outcomes_seen: list[int]
    vectors: npt.NDArray[np.float32]
    tuning: IvfTuning | None
    ivf: npt.NDArray[np.uint8] | None
    applied: list[str]
    pending: dict[str, list[bool]]


def _digest(path: Path) -> FileEntry:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return FileEntry(name=path.name, size=path.stat().st_size, sha256=h.hexdigest())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_data(directory: Path, state: LibraryState, gen: int) -> dict[str, FileEntry]:
    paths = {role: directory / f"{role}-{gen}.{ext}" for role, ext in _EXTENSIONS.items() if role != "index"}
    with paths["records"].open("w", encoding="utf-8") as f:
        f.writelines(exp.model_dump_json() + "\n" for exp in state.records)
    utility = np.array([state.alpha, state.beta, state.outcomes_seen], dtype=np.float64).T.reshape(-1, 3)
    with paths["utility"].open("wb") as f:
        np.save(f, np.ascontiguousarray(utility), allow_pickle=False)
    with paths["vectors"].open("wb") as f:
        np.save(f, np.ascontiguousarray(state.vectors, dtype=np.float32), allow_pickle=False)
    paths["outcomes"].write_text(json.dumps({"applied": state.applied, "pending": state.pending}))
    if state.ivf is not None:
        paths["index"] = directory / f"index-{gen}.faiss"
        state.ivf.tofile(paths["index"])
    for path in paths.values():
        _fsync(path)
    return {role: _digest(path) for role, path in paths.items()}


@contextlib.contextmanager
def _locked(directory: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the snapshot directory's lock (see the module docstring) while inside."""
    try:
        fh = open(directory / LOCK, "a")  # noqa: SIM115 - held open for the lock's lifetime
    except OSError as exc:
        raise SnapshotError(directory, f"cannot open its lock file: {exc}") from exc
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def write(directory: Path, state: LibraryState, last_seq: int) -> Manifest:
    """Write ``state`` as a new snapshot generation in ``directory`` (created if needed)."""
    if last_seq < 0:
        raise SnapshotError(directory, f"last_seq must be >= 0, got {last_seq}")
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory, exclusive=True):
        return _write(directory, state, last_seq)


def _write(directory: Path, state: LibraryState, last_seq: int) -> Manifest:
    gens = [int(m.group(2)) for p in directory.iterdir() if (m := _DATA.match(p.name))]
    gen = max(gens, default=0) + 1
    try:
        files = _write_data(directory, state, gen)
        manifest = Manifest(
            embedder=state.embedder,
            dim=state.dim,
            count=len(state.records),
            last_seq=last_seq,
            generation=gen,
            exact_limit=state.exact_limit,
            seed=state.seed,
            options=state.options,
            tuning=state.tuning,
            files=files,
        )
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(manifest.model_dump_json(indent=1))
        _fsync(tmp)
        os.replace(tmp, directory / MANIFEST)
        _fsync(directory)
    except OSError as exc:
        raise SnapshotError(directory, f"writing generation {gen} failed: {exc}") from exc
    for path in directory.iterdir():
        m = _DATA.match(path.name)
        if m and int(m.group(2)) != gen:
            path.unlink(missing_ok=True)
    return manifest


def _checked(directory: Path, entry: FileEntry) -> Path:
    path = directory / entry.name
    if not path.is_file():
        raise SnapshotError(directory, f"data file {entry.name} is missing")
    found = _digest(path)
    if found.size != entry.size or found.sha256 != entry.sha256:
        raise SnapshotError(directory, f"data file {entry.name} does not match its manifest (corrupt)")
    return path


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the snapshot in ``directory``, or :class:`SnapshotError`."""
    path = directory / MANIFEST
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise SnapshotError(directory, "no snapshot here (no manifest)") from exc
    except (OSError, pydantic.ValidationError) as exc:
        raise SnapshotError(directory, f"unreadable manifest: {exc}") from exc


def read(directory: Path, embedder: str, dim: int) -> tuple[LibraryState, int]:
    """The state and ``last_seq`` of the snapshot in ``directory``, written by ``embedder``."""
    if not directory.is_dir():
        raise SnapshotError(directory, "no snapshot here (no directory)")
    with _locked(directory, exclusive=False):
        return _read(directory, embedder, dim)


def _read(directory: Path, embedder: str, dim: int) -> tuple[LibraryState, int]:
    manifest = read_manifest(directory)
    if manifest.embedder != embedder or manifest.dim != dim:
        raise SnapshotError(
            directory,
            f"written by embedder {manifest.embedder} ({manifest.dim}-d), this library uses {embedder} ({dim}-d)",
        )
    need = {"records", "utility", "vectors", "outcomes"} | ({"index"} if manifest.tuning is not None else set())
    if not need <= manifest.files.keys():
        raise SnapshotError(directory, f"manifest lacks files {sorted(need - manifest.files.keys())}")
    paths = {role: _checked(directory, manifest.files[role]) for role in need}
    try:
        with paths["records"].open("rb") as f:
            records = [Experience.model_validate_json(line) for line in f]
        utility = np.load(paths["utility"], allow_pickle=False)
        vectors = np.load(paths["vectors"], allow_pickle=False)
        outcomes = json.loads(paths["outcomes"].read_text())
        applied = [str(x) for x in outcomes["applied"]]
        pending = {str(k): [bool(x) for x in v] for k, v in outcomes["pending"].items()}
        ivf = np.fromfile(paths["index"], dtype=np.uint8) if "index" in paths else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pydantic.ValidationError) as exc:
        raise SnapshotError(directory, f"unreadable data: {exc}") from exc
    count = manifest.count
    if (
        len(records) != count
        or vectors.shape != (count, dim)
        or vectors.dtype != np.float32
        or utility.shape != (count, 3)
    ):
        raise SnapshotError(
            directory,
            f"sizes disagree: manifest {count}x{dim}, records {len(records)}, vectors {vectors.shape}, "
            f"utility {utility.shape}",
        )
    state = LibraryState(
        embedder=manifest.embedder,
        dim=dim,
        exact_limit=manifest.exact_limit,
        seed=manifest.seed,
        options=manifest.options,
        records=records,
        alpha=utility[:, 0].tolist(),
        beta=utility[:, 1].tolist(),
        outcomes_seen=[int(x) for x in utility[:, 2]],
        vectors=vectors,
        tuning=manifest.tuning,
        ivf=ivf,
        applied=applied,
        pending=pending,
    )
    return state, manifest.last_seq
