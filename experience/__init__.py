"""The experience library: what was tried, under which diagnosis, with what effect, retrievable.

Records (:class:`schemas.Experience`) are embedded (:mod:`experience.embedders`: MiniLM offline,
hashed n-grams as fallback), indexed with FAISS (:mod:`experience.index`: exact, then IVF),
ranked by similarity, diagnosis, task signature and a utility that outcomes update
(:mod:`experience.ranking`), and snapshotted crash-safely (:mod:`experience.snapshot`). The
curator actor replays a JetStream stream of records and outcomes into an
:class:`ExperienceLibrary`; snapshots only shorten that replay.
"""

from __future__ import annotations

from experience.embedders import (
    Embedder,
    EmbedderKind,
    HashingEmbedder,
    MiniLMEmbedder,
    default_embedder,
    minilm_model_dir,
)
from experience.errors import (
    ConfigError,
    EmbedderUnavailable,
    EmbeddingShapeError,
    ExperienceError,
    SnapshotError,
    UnknownExperience,
)
from experience.index import IndexKind, IvfTuning
from experience.library import ExperienceLibrary, LibraryStats
from experience.options import LibraryOptions
from experience.ranking import RankWeights, UtilityModel
from experience.text import experience_text, query_text

__all__ = [
    "ConfigError",
    "Embedder",
    "EmbedderKind",
    "EmbedderUnavailable",
    "EmbeddingShapeError",
    "ExperienceError",
    "ExperienceLibrary",
    "HashingEmbedder",
    "IndexKind",
    "IvfTuning",
    "LibraryOptions",
    "LibraryStats",
    "MiniLMEmbedder",
    "RankWeights",
    "SnapshotError",
    "UnknownExperience",
    "UtilityModel",
    "default_embedder",
    "experience_text",
    "minilm_model_dir",
    "query_text",
]
