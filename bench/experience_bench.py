"""Retrieval benchmark of the experience library: latency, recall against exact, build time, throughput.

Run from the repository root::

    .venv/bin/python bench/experience_bench.py            # full: about 4 minutes on 2 quiet cores
    .venv/bin/python bench/experience_bench.py --quick    # 10k and 100k, hashing only: about 1 minute

What it measures (single queries, one at a time, after a warm-up; p50/p99 over the queries):

* ``library`` rows: :class:`ExperienceLibrary` filled with generated experience records
  (:mod:`experience.synthetic`) embedded for real, queried with generated queries. ``search ms``
  is ``ExperienceLibrary.search`` with the query embedding cached (index search, filtering,
  re-ranking, building the reply); ``cold`` also embeds the query text. ``agree`` is the
  overlap of the final top-k hits with those of an exact library over the same records.
* ``index`` rows: the vector index alone at 10k / 100k / 1M, filled incrementally the way the
  library fills it (exact, then IVF trained at the limit and retrained at 4x growth). Vectors
  are SYNTHETIC: each is a real embedding of one of 2,000 generated experience records (MiniLM,
  or hashing with ``--quick`` / ``--no-minilm``) plus an isotropic Gaussian perturbation
  (cosine to its source about 0.9), normalised; queries are real embeddings of generated
  queries. nprobe is tuned on 200 other real queries, never the ones measured. ``search ms``
  is one ``VectorIndex.search`` for the library's fetch size (64).
* ``recall@10`` / ``recall@64``: tie-tolerant recall of the similarity search against exact
  search (share of returned scores >= the exact k-th score), over the measured queries.
* ``build s``: filling the index from empty, including every training and nprobe tuning
  (library rows: also embedding the records).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from experience.embedders import Embedder, HashingEmbedder, MiniLMEmbedder
from experience.index import IndexConfig, VectorIndex, score_recall, single_thread
from experience.library import ExperienceLibrary
from experience.options import LibraryOptions
from experience.synthetic import synthetic_experiences, synthetic_queries
from experience.text import experience_text, query_text
from schemas import ExperienceQuery

FETCH = LibraryOptions().fetch
Vectors = npt.NDArray[np.float32]


@dataclass
class Row:
    """One line of the results table."""

    level: str
    vectors: str
    n: int
    index: str
    nlist: int | None
    nprobe: int | None
    build_s: float
    p50_ms: float
    p99_ms: float
    cold_p50_ms: float | None
    cold_p99_ms: float | None
    recall10: float
    recall64: float
    agree: float | None


class MemoEmbedder:
    """Wraps an embedder and remembers every text's vector, so the exact reference library and
    repeated passes do not pay for embedding twice (the first pass is timed without it)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._memo: dict[str, Vectors] = {}

    def embed(self, texts: Sequence[str]) -> Vectors:
        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing), strict=True):
                self._memo[text] = vector
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._memo[t] for t in texts])


def _percentiles(samples: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(samples) * 1e3
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _timed(fn: Callable[[Any], object], items: Sequence[Any], warmup: int = 20) -> list[float]:
    for item in items[:warmup]:
        fn(item)
    out = []
    for item in items:
        t = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - t)
    return out


def _recalls(index: VectorIndex, queries: Vectors) -> tuple[float, float]:
    exact, _ = faiss.knn(queries, index.vectors, FETCH, metric=faiss.METRIC_INNER_PRODUCT)
    approx = np.stack([index.search(q, FETCH)[0] for q in queries])
    return score_recall(approx[:, :10], exact[:, :10]), score_recall(approx, exact)


def embedding_throughput(minilm: MiniLMEmbedder | None, quick: bool) -> list[str]:
    """Texts per second of each embedder on generated experience texts."""
    texts = [experience_text(e) for e in synthetic_experiences(2000 if quick else 20000, seed=90)]
    lines = []
    emb = HashingEmbedder(384)
    t = time.perf_counter()
    emb.embed(texts)
    lines.append(f"hash-ngram-v1/384: {len(texts) / (time.perf_counter() - t):,.0f} texts/s ({len(texts)} texts)")
    if minilm is not None:
        sample = texts[: 128 if quick else 512]
        default_threads = minilm.threads
        for threads in (default_threads, None):  # the default (1 thread), then torch's own setting
            minilm.threads = threads
            minilm.embed(sample[:32])
            t = time.perf_counter()
            minilm.embed(sample)
            rate = len(sample) / (time.perf_counter() - t)
            single = _timed(lambda s: minilm.embed([s]), texts[1000:1100], warmup=5)
            p50, p99 = _percentiles(single)
            lines.append(
                f"minilm-l6-v2/384, threads={threads or 'torch default'}: {rate:,.0f} texts/s at batch 32 "
                f"({len(sample)} texts); one query text: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            )
        minilm.threads = default_threads
    return lines


def library_row(
    emb: Embedder, n: int, exact_limit: int, queries: list[ExperienceQuery], label: str
) -> tuple[Row, Vectors]:
    """A library of ``n`` generated records: build, latency, recall, agreement with exact; its vectors."""
    records = synthetic_experiences(n, seed=100 + n)
    memo = MemoEmbedder(emb)  # the exact reference library reuses vectors instead of embedding again
    lib = ExperienceLibrary(memo, exact_limit=exact_limit, seed=1)
    t = time.perf_counter()
    for i in range(0, n, 5000):
        lib.add_many(records[i : i + 5000])
    build = time.perf_counter() - t
    cold = _timed(lib.search, queries, warmup=0)  # first sight of each query text: embeds it
    warm = _timed(lib.search, queries)
    qvecs = memo.embed([query_text(q) for q in queries])
    r10, r64 = _recalls(lib.vector_index, qvecs)
    agree = 1.0
    if lib.stats().tuning is not None:
        exact = ExperienceLibrary(memo, exact_limit=max(n, 64), seed=1)
        exact.add_many(records)
        overlaps = []
        for q in queries:
            got = {h.experience.experience_id for h in lib.search(q).hits}
            want = {h.experience.experience_id for h in exact.search(q).hits}
            overlaps.append(len(got & want) / max(len(want), 1))
        agree = float(np.mean(overlaps))
    tuning = lib.stats().tuning
    row = Row(
        level="library",
        vectors=label,
        n=n,
        index=lib.stats().index.value,
        nlist=None if tuning is None else tuning.nlist,
        nprobe=None if tuning is None else tuning.nprobe,
        build_s=build,
        p50_ms=_percentiles(warm)[0],
        p99_ms=_percentiles(warm)[1],
        cold_p50_ms=_percentiles(cold)[0],
        cold_p99_ms=_percentiles(cold)[1],
        recall10=r10,
        recall64=r64,
        agree=agree,
    )
    return row, np.array(lib.vector_index.vectors)


def synthetic_vectors(base: Vectors, n: int, seed: int) -> Vectors:
    """``n`` unit vectors: a random base row plus isotropic noise (cosine to it about 0.9)."""
    rng = np.random.default_rng(seed)
    dim = base.shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    for i in range(0, n, 100_000):
        m = min(100_000, n - i)
        chunk = base[rng.integers(len(base), size=m)] + rng.standard_normal((m, dim), dtype=np.float32) * (
            0.48 / np.sqrt(dim)
        )
        out[i : i + m] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def index_row(vectors: Vectors, tune: Vectors, queries: Vectors, label: str) -> Row:
    """The vector index over ``vectors``, filled in chunks with the library's rebuild policy."""
    index = VectorIndex(IndexConfig(dim=vectors.shape[1], seed=1, tune_k=FETCH))
    t = time.perf_counter()
    chunk = 10_000 if len(vectors) <= 100_000 else 50_000
    for i in range(0, len(vectors), chunk):
        index.append(vectors[i : i + chunk])
        plan = index.plan_rebuild()
        if plan is not None:
            plan.queries = tune
            index.install(*plan.build())
    build = time.perf_counter() - t
    warm = _timed(lambda q: index.search(q, FETCH), list(queries))
    r10, r64 = _recalls(index, queries)
    tuning = index.tuning
    return Row(
        level="index",
        vectors=label,
        n=len(vectors),
        index=index.kind.value,
        nlist=None if tuning is None else tuning.nlist,
        nprobe=None if tuning is None else tuning.nprobe,
        build_s=build,
        p50_ms=_percentiles(warm)[0],
        p99_ms=_percentiles(warm)[1],
        cold_p50_ms=None,
        cold_p99_ms=None,
        recall10=r10,
        recall64=r64,
        agree=None,
    )


def exact_reference(vectors: Vectors, queries: Vectors, count: int) -> tuple[float, float]:
    """p50/p99 of an exact ``IDMap2,Flat`` search over ``vectors`` (what IVF replaces)."""
    flat = faiss.index_factory(vectors.shape[1], "IDMap2,Flat", faiss.METRIC_INNER_PRODUCT)
    flat.add_with_ids(vectors, np.arange(len(vectors), dtype=np.int64))
    with single_thread():
        samples = _timed(lambda q: flat.search(q.reshape(1, -1), FETCH), list(queries[:count]), warmup=3)
    return _percentiles(samples)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row]) -> None:
    """The results as a fixed-width table."""
    head = (
        f"{'level':<8} {'vectors':<34} {'n':>9} {'index':<5} {'nlist':>5} {'nprobe':>6} {'build s':>8} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'cold p50':>8} {'cold p99':>8} {'rec@10':>6} {'rec@64':>6} {'agree':>5}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.level:<8} {r.vectors:<34} {r.n:>9,} {r.index:<5} {_fmt(r.nlist, 'd'):>5} "
            f"{_fmt(r.nprobe, 'd'):>6} {r.build_s:>8.1f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} "
            f"{_fmt(r.cold_p50_ms, '.2f'):>8} {_fmt(r.cold_p99_ms, '.2f'):>8} {r.recall10:>6.3f} "
            f"{r.recall64:>6.3f} {_fmt(r.agree, '.3f'):>5}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k, hashing only (about 1-2 minutes)")
    parser.add_argument("--no-minilm", action="store_true", help="skip everything that loads MiniLM")
    parser.add_argument("--queries", type=int, default=300, help="queries measured per row")
    parser.add_argument("--minilm-records", type=int, default=2000, help="records of the MiniLM library row")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    use_minilm = not (args.quick or args.no_minilm)
    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads; searches run on one")
    print("load average at start (1/5/15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))

    minilm: MiniLMEmbedder | None = None
    if use_minilm:
        t = time.perf_counter()
        minilm = MiniLMEmbedder()
        minilm.load()
        print(f"MiniLM loaded offline in {time.perf_counter() - t:.1f} s")
    print("\n# Embedding throughput")
    for line in embedding_throughput(minilm, args.quick):
        print(line)

    rows: list[Row] = []
    hashing = HashingEmbedder(384)
    queries = synthetic_queries(args.queries, seed=7)
    base_emb: Embedder = hashing
    base: Vectors = np.zeros((0, 384), dtype=np.float32)
    for n in (10_000, 100_000):
        row, vectors = library_row(hashing, n, 20_000, queries, "hash-ngram-v1/384, real records")
        rows.append(row)
        base = vectors[:2000]
        print(f"... library {n:,} done", file=sys.stderr)
    if minilm is not None:
        # Real MiniLM embeddings at the scale this machine affords; a low exact limit makes the
        # library use IVF, so recall on real MiniLM vectors is measured too.
        row, base = library_row(minilm, args.minilm_records, 500, queries, "minilm-l6-v2/384, real records")
        rows.append(row)
        base_emb = minilm
        print(f"... library MiniLM {args.minilm_records:,} done", file=sys.stderr)

    tune = base_emb.embed([query_text(q) for q in synthetic_queries(200, seed=9)])
    qvecs = base_emb.embed([query_text(q) for q in queries])
    label = f"synthetic around {base_emb.name}"
    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    reference: list[str] = []
    for n in sizes:
        vectors = synthetic_vectors(base, n, seed=n)
        rows.append(index_row(vectors, tune, qvecs, label))
        if n >= 100_000:
            p50, p99 = exact_reference(vectors, qvecs, 100 if n <= 100_000 else 20)
            reference.append(f"exact IDMap2,Flat at {n:,} ({label}): p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        del vectors
        print(f"... index {n:,} done", file=sys.stderr)

    print("\n# Retrieval (single queries; ms; recall and agreement against exact search)")
    print_table(rows)
    print()
    for line in reference:
        print(line)
    print("load average at end (1/5/15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
