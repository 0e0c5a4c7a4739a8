"""The vector index: exact inner product up to ``exact_limit`` entries, IVF beyond, nprobe tuned.

Design, from measurements on this 2-core machine (384-d, single query; see ``bench/``):

* An exact ``IDMap2,Flat`` index answers in about 1.1 ms p50 / 1.7 ms p99 at 20k entries but
  11-16 ms at 100k (its cost is a scan of ``n * dim * 4`` bytes), so exact search alone cannot
  meet the 5 ms p99 target at 100k. SQ8 and fp16 flat indexes were measured too (7-8 ms at
  100k): not enough either. So the exact index serves up to ``exact_limit`` (default 20,000),
  and an ``IVF<nlist>,Flat`` index (inner product, full-precision vectors inside each list)
  takes over beyond: it is trained when the library crosses the limit, and retrained with more
  lists each time the library has grown ``retrain_growth`` times (4x) since the last training.
* ``nlist`` is the largest power of two below ``min(2 * sqrt(n), n / 39, 4096)`` (at least 39
  training points per centroid). ``nprobe`` is tuned right after each training: query vectors
  shaped like real ones (the owner passes them in :class:`RebuildPlan`; the library embeds the
  task and diagnosis of sampled records, as a real query does) are searched exactly
  (``faiss.knn``) and through the IVF index with nprobe = 1, 2, 4, ... until the tie-tolerant
  recall@``tune_k`` (the library's fetch size, 64) reaches ``recall_target`` (0.95). Stored
  vectors used as queries would be far too optimistic: on 30k hashed records they reached
  recall@10 0.97 at nprobe 2, where real queries needed nprobe 16-32. The measured recall is
  kept in :class:`IvfTuning`.
* Queries run with one OpenMP thread. ``faiss.omp_set_num_threads`` is per calling thread in
  OpenMP, so this is set and restored around each search in the caller's thread only; training
  and bulk adds keep every core. With two threads a single query was slower (15.9 vs 11.3 ms at
  100k exact) and showed p99 spikes of 25-35 ms when the other core was busy.
* A rebuild (training, adding, tuning: about 1 s at 100k, tens of seconds at 1M) runs outside the
  owner's lock through :class:`RebuildPlan`: searches keep using the old index meanwhile, and
  :meth:`VectorIndex.install` adds whatever arrived during the build before swapping.

Measured with ``bench/experience_bench.py`` (single queries, fetch 64, load average about 1.5-2
from other work): the library's ``search`` at 100k hashed records p50 1.4 ms / p99 1.8 ms
(IVF 512 cells, nprobe 32, recall@64 0.996, final top-10 agreement with exact 0.995); the IVF
index at 1M synthetic MiniLM-like vectors p50 1.5 ms / p99 2.5 ms (1024 cells, nprobe 8,
recall@64 0.97), against 134 ms for exact search.

Labels are row numbers in the append-only vector store (``int64``), which the library maps to
experience ids. The store keeps a float32 copy of every vector (for retraining and snapshots):
memory is about ``2 * n * dim * 4`` bytes with IVF (3 GB at 1M x 384).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt
import structlog
from pydantic import Field

from experience.errors import ConfigError
from schemas import Model

log = structlog.get_logger(__name__)

Vectors = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]


class IndexKind(StrEnum):
    """Which FAISS index serves queries."""

    FLAT = "flat"
    """Exact inner product (``IDMap2,Flat``)."""
    IVF = "ivf"
    """Inverted lists over k-means cells (``IVF<nlist>,Flat``), approximate."""


class IvfTuning(Model):
    """How the IVF index was trained and tuned."""

    nlist: int = Field(ge=1)
    """Number of k-means cells."""
    nprobe: int = Field(ge=1)
    """Cells visited per query."""
    trained_at: int = Field(ge=1)
    """Entries in the library when it was trained."""
    k: int = Field(ge=1)
    """The k of the recall measured (the library's fetch size)."""
    recall: float = Field(ge=0, le=1)
    """Recall@k against exact search at ``nprobe`` (tie-tolerant, see :func:`score_recall`)."""
    queries: int = Field(ge=1)
    """Query vectors of that measurement."""
    generation: int = Field(ge=1)
    """Training count (1 for the first); seeds the training, so a restored library retrains alike."""


@dataclass(frozen=True)
class IndexConfig:
    """Validated settings of a :class:`VectorIndex`."""

    dim: int
    exact_limit: int = 20_000
    seed: int = 0
    recall_target: float = 0.95
    retrain_growth: float = 4.0
    tune_queries: int = 200
    tune_k: int = 64

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ConfigError("dim", self.dim, "must be positive")
        if self.exact_limit < 64:
            raise ConfigError("exact_limit", self.exact_limit, "must be at least 64 (IVF needs training data)")
        if not 0.0 < self.recall_target <= 1.0:
            raise ConfigError("recall_target", self.recall_target, "must be in (0, 1]")
        if self.retrain_growth <= 1.0:
            raise ConfigError("retrain_growth", self.retrain_growth, "must be greater than 1")
        if self.tune_queries < 10:
            raise ConfigError("tune_queries", self.tune_queries, "must be at least 10")
        if self.tune_k < 1:
            raise ConfigError("tune_k", self.tune_k, "must be at least 1")


def choose_nlist(n: int) -> int:
    """IVF cells for ``n`` entries: a power of two <= min(2 sqrt(n), n / 39, 4096), at least 1."""
    cap = min(2.0 * math.sqrt(n), n / 39.0, 4096.0)
    return 1 if cap < 2 else 2 ** math.floor(math.log2(cap))


@contextmanager
def single_thread() -> Iterator[None]:
    """Run FAISS calls of the current thread on one OpenMP thread, restoring the setting after."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _flat(dim: int) -> Any:
    return faiss.index_factory(dim, "IDMap2,Flat", faiss.METRIC_INNER_PRODUCT)


def score_recall(approx: npt.NDArray[np.float32], exact: npt.NDArray[np.float32]) -> float:
    """Tie-tolerant recall@k: the share of returned scores at least the exact k-th best score.

    ``approx`` and ``exact`` are ``[q, k]`` score matrices (IVFFlat scores are exact inner
    products). Records with identical vectors tie, and which of them a set-based recall counts
    is arbitrary; comparing scores is not.
    """
    k = exact.shape[1]
    threshold = exact[:, k - 1 : k] - 1e-5
    return float(np.mean(approx[:, :k] >= threshold))


def tune_nprobe(index: Any, vectors: Vectors, queries: Vectors, config: IndexConfig, generation: int) -> IvfTuning:
    """Smallest power-of-two nprobe whose recall@``tune_k`` on ``queries`` reaches the target."""
    ivf = faiss.extract_index_ivf(index)
    k = min(config.tune_k, len(vectors))
    exact, _ = faiss.knn(queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
    nprobe, recall = 1, 0.0
    while True:
        ivf.nprobe = nprobe
        approx, _ = index.search(queries, k)
        recall = score_recall(approx, exact)
        if recall >= config.recall_target or nprobe >= ivf.nlist:
            break
        nprobe = min(nprobe * 2, ivf.nlist)
    return IvfTuning(
        nlist=int(ivf.nlist),
        nprobe=nprobe,
        k=k,
        trained_at=len(vectors),
        recall=recall,
        queries=len(queries),
        generation=generation,
    )


def build_ivf(vectors: Vectors, queries: Vectors | None, config: IndexConfig, generation: int) -> tuple[Any, IvfTuning]:
    """Train an IVF index on ``vectors`` (rows get labels 0..n-1), add them, tune nprobe.

    ``queries`` are the vectors nprobe is tuned on; without them, a seeded sample of stored
    vectors stands in (an optimistic proxy: real queries fall between records).
    """
    n = len(vectors)
    nlist = choose_nlist(n)
    rng = np.random.default_rng([config.seed, generation])
    index = faiss.index_factory(config.dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = int(rng.integers(0, 2**31 - 1))
    ivf.cp.niter = 15
    ivf.cp.max_points_per_centroid = 64
    sample = np.sort(rng.choice(n, size=min(n, 64 * nlist), replace=False))
    index.train(np.ascontiguousarray(vectors[sample]))
    index.add_with_ids(vectors, np.arange(n, dtype=np.int64))
    if queries is None or len(queries) == 0:
        rows = np.sort(rng.choice(n, size=min(config.tune_queries, n), replace=False))
        queries = np.ascontiguousarray(vectors[rows])
    tuning = tune_nprobe(index, vectors, queries, config, generation)
    ivf.nprobe = tuning.nprobe
    return index, tuning


@dataclass
class RebuildPlan:
    """A pending (re)training over the first ``n`` stored vectors; :meth:`build` needs no lock.

    The owner may set ``queries`` (vectors like its real queries) before building.
    """

    vectors: Vectors
    config: IndexConfig
    generation: int
    queries: Vectors | None = None

    def build(self) -> tuple[Any, IvfTuning]:
        """Train, fill and tune a new IVF index (seconds to a minute; every core)."""
        return build_ivf(self.vectors, self.queries, self.config, self.generation)


class VectorIndex:
    """Append-only vectors with an exact or IVF FAISS index over them. Not thread-safe by itself:
    the owner serialises calls, except :meth:`RebuildPlan.build`, which may run unlocked."""

    def __init__(self, config: IndexConfig) -> None:
        self.config = config
        self._store: Vectors = np.empty((1024, config.dim), dtype=np.float32)
        self._n = 0
        self._index: Any = _flat(config.dim)
        self._kind = IndexKind.FLAT
        self._tuning: IvfTuning | None = None
        self._generation = 0
        self._rebuilding = False

    def __len__(self) -> int:
        return self._n

    @property
    def kind(self) -> IndexKind:
        """The index serving queries now."""
        return self._kind

    @property
    def tuning(self) -> IvfTuning | None:
        """Training and tuning of the IVF index; ``None`` while exact."""
        return self._tuning

    @property
    def vectors(self) -> Vectors:
        """The stored vectors, row = label (a view; rows never change once written)."""
        return self._store[: self._n]

    def append(self, vectors: Vectors) -> None:
        """Store ``vectors`` (labels continue from ``len(self)``) and add them to the live index."""
        m = len(vectors)
        if m == 0:
            return
        if self._n + m > len(self._store):
            grown = np.empty((max(2 * len(self._store), self._n + m), self.config.dim), dtype=np.float32)
            grown[: self._n] = self._store[: self._n]
            self._store = grown  # readers holding the old array still see valid rows
        self._store[self._n : self._n + m] = vectors
        self._index.add_with_ids(vectors, np.arange(self._n, self._n + m, dtype=np.int64))
        self._n += m

    def needs_rebuild(self) -> bool:
        """Whether the library crossed ``exact_limit`` or outgrew its IVF training."""
        if self._rebuilding:
            return False
        if self._kind is IndexKind.FLAT:
            return self._n > self.config.exact_limit
        assert self._tuning is not None
        return self._n >= self.config.retrain_growth * self._tuning.trained_at

    def plan_rebuild(self) -> RebuildPlan | None:
        """Claim the rebuild (one at a time); ``None`` when none is due or one is running."""
        if not self.needs_rebuild():
            return None
        self._rebuilding = True
        self._generation += 1
        return RebuildPlan(self._store[: self._n], self.config, self._generation)

    def install(self, index: Any, tuning: IvfTuning) -> None:
        """Swap in a built IVF index after adding the rows stored while it was built."""
        built = int(index.ntotal)
        if built < self._n:
            index.add_with_ids(self._store[built : self._n], np.arange(built, self._n, dtype=np.int64))
        self._index, self._kind, self._tuning = index, IndexKind.IVF, tuning
        self._rebuilding = False
        log.info("experience_index_rebuilt", kind=self._kind.value, entries=self._n, **tuning.model_dump())

    def abandon_rebuild(self) -> None:
        """Release a claimed rebuild that failed, so a later add can try again."""
        self._rebuilding = False

    def search(self, query: Vectors, k: int) -> tuple[npt.NDArray[np.float32], Labels]:
        """Top ``k`` by inner product for one query vector: scores and labels, best first."""
        if self._n == 0:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        with single_thread():
            scores, labels = self._index.search(query.reshape(1, -1), min(k, self._n))
        keep = labels[0] >= 0
        return scores[0][keep], labels[0][keep]

    def exact_search(self, query: Vectors, k: int) -> tuple[npt.NDArray[np.float32], Labels]:
        """Top ``k`` by exact inner product over every stored vector (for measurements)."""
        if self._n == 0:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        scores, labels = faiss.knn(query.reshape(1, -1), self.vectors, min(k, self._n), faiss.METRIC_INNER_PRODUCT)
        return scores[0], labels[0].astype(np.int64)

    def serialize_ivf(self) -> npt.NDArray[np.uint8] | None:
        """The IVF index as bytes (for a snapshot); ``None`` while exact (rebuilt from vectors)."""
        if self._kind is IndexKind.FLAT:
            return None
        data: npt.NDArray[np.uint8] = faiss.serialize_index(self._index)
        return data

    @classmethod
    def restore(
        cls, config: IndexConfig, vectors: Vectors, tuning: IvfTuning | None, ivf: npt.NDArray[np.uint8] | None
    ) -> VectorIndex:
        """Rebuild from a snapshot's vectors and, when it was IVF, its serialised index."""
        out = cls(config)
        if tuning is None or ivf is None:
            out.append(vectors)
            return out
        index = faiss.deserialize_index(ivf)
        if int(index.ntotal) != len(vectors) or int(index.d) != config.dim:
            raise ValueError(f"IVF index holds {index.ntotal}x{index.d}, vectors are {vectors.shape}")
        faiss.extract_index_ivf(index).nprobe = tuning.nprobe
        out._store = np.array(vectors, dtype=np.float32, copy=True)
        out._n = len(vectors)
        out._index, out._kind, out._tuning = index, IndexKind.IVF, tuning
        out._generation = tuning.generation
        return out
