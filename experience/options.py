"""Tunable settings of an :class:`~experience.library.ExperienceLibrary`, validated on construction.

They travel inside a snapshot's manifest, so a reloaded library ranks exactly as the one saved.
"""

from __future__ import annotations

from pydantic import Field

from experience.ranking import RankWeights, UtilityModel
from schemas import Model


class LibraryOptions(Model):
    """Everything about a library's behaviour except its embedder, ``exact_limit`` and ``seed``."""

    weights: RankWeights = RankWeights()
    """Weights of the re-ranking formula (:mod:`experience.ranking`)."""
    utility: UtilityModel = UtilityModel()
    """How utility follows outcomes."""
    recall_target: float = Field(default=0.95, gt=0, le=1)
    """Recall@10 against exact search that nprobe is tuned to reach after each IVF training."""
    retrain_growth: float = Field(default=4.0, gt=1)
    """Retrain the IVF index (with more cells) once the library has grown this many times."""
    tune_queries: int = Field(default=200, ge=10, le=10_000)
    """Stored vectors used as queries when tuning nprobe."""
    fetch: int = Field(default=64, ge=1, le=10_000)
    """Nearest records fetched from the index before filtering and re-ranking (at least 4 k)."""
    query_cache: int = Field(default=1024, ge=0)
    """Query embeddings kept (LRU by query text); 0 turns the cache off."""
