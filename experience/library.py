"""The experience library: records of parent→child transitions, retrievable by meaning.

Use from a worker thread: every method may block (embedding, FAISS, disk), so the curator
actor calls it through ``asyncio.to_thread``. Methods are thread-safe (one re-entrant lock);
embedding and IVF (re)training run outside the lock, so searches go on meanwhile.

* **Records.** :meth:`ExperienceLibrary.add` / :meth:`~ExperienceLibrary.add_many` embed
  :func:`experience.text.experience_text` of each new record (batched) into the vector index
  (:mod:`experience.index`: exact to ``exact_limit``, IVF beyond). A known ``experience_id`` is a
  no-op, so replaying a stream twice changes nothing.
* **Retrieval.** :meth:`ExperienceLibrary.search` embeds :func:`experience.text.query_text`
  (cached per text), fetches the nearest records, drops those of ``exclude_run`` and those under
  ``min_utility``, re-ranks by similarity, diagnosis, task signature and utility
  (:mod:`experience.ranking`), and returns the top ``k``. If filters leave fewer than ``k``, it
  fetches more (doubling), switching to exact search when the probed IVF cells run out, until
  the whole library was considered.
* **Utility.** :meth:`ExperienceLibrary.apply_outcome` updates the utility of every record the
  outcome names, once per ``outcome_id`` (a replayed outcome counts once). An outcome naming a
  record not yet added waits and is applied when the record arrives, so records and outcomes
  replayed in any interleaving give the same utilities. :meth:`ExperienceLibrary.apply_many`
  replays a mixed stream in order, embedding runs of records in batches.
* **Snapshots.** :meth:`ExperienceLibrary.save` writes a crash-safe snapshot with the stream
  sequence it reflects (:mod:`experience.snapshot`); :meth:`ExperienceLibrary.load` returns the
  library and that sequence, or ``None`` (logged) when the snapshot is missing, corrupt or from
  another embedder. Snapshots are a cache: the stream is the source of truth.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import structlog
from pydantic import Field

from experience import snapshot
from experience.embedders import Embedder, Matrix, check_shape
from experience.errors import ConfigError, SnapshotError, UnknownExperience
from experience.index import IndexConfig, IndexKind, IvfTuning, RebuildPlan, VectorIndex
from experience.options import LibraryOptions
from experience.ranking import SignatureKey, diagnosis_match, rank_score, signature_similarity
from experience.text import experience_text, query_text
from schemas import Experience, ExperienceHit, ExperienceHits, ExperienceOutcome, ExperienceQuery, Model

log = structlog.get_logger(__name__)


class LibraryStats(Model):
    """A snapshot of the library's state, for an actor's statistics."""

    embedder: str
    """Embedder behind the index."""
    size: int = Field(ge=0)
    """Experiences held."""
    index: IndexKind
    """Index serving queries."""
    tuning: IvfTuning | None
    """IVF training and tuning; ``None`` while exact."""
    outcomes_applied: int = Field(ge=0)
    """Distinct outcomes applied."""
    outcomes_pending: int = Field(ge=0)
    """Updates waiting for records not yet added."""


class ExperienceLibrary:
    """Experiences indexed by embedding, ranked with diagnosis, task signature and utility."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        exact_limit: int = 20_000,
        seed: int = 0,
        options: LibraryOptions | None = None,
    ) -> None:
        self.embedder = embedder
        self.options = options if options is not None else LibraryOptions()
        self.exact_limit = exact_limit
        self.seed = seed
        self._index = VectorIndex(
            IndexConfig(
                dim=embedder.dim,
                exact_limit=exact_limit,
                seed=seed,
                recall_target=self.options.recall_target,
                retrain_growth=self.options.retrain_growth,
                tune_queries=self.options.tune_queries,
                tune_k=self.options.fetch,
            )
        )
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()
        self._records: list[Experience] = []
        self._keys: list[SignatureKey] = []
        self._row: dict[str, int] = {}
        self._alpha: list[float] = []
        self._beta: list[float] = []
        self._seen: list[int] = []
        self._applied: set[str] = set()
        self._applied_order: list[str] = []
        self._pending: dict[str, list[bool]] = {}
        self._qcache: OrderedDict[str, Matrix] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    @property
    def vector_index(self) -> VectorIndex:
        """The vector index (for measurements; not for mutation)."""
        return self._index

    # -- records ------------------------------------------------------------------------------

    def add(self, exp: Experience) -> bool:
        """Add one record; ``False`` if its id is already present."""
        return self.add_many([exp]) == 1

    def add_many(self, exps: Sequence[Experience]) -> int:
        """Add the records whose ids are new (embedded in one batch); returns how many were added."""
        with self._lock:
            fresh: dict[str, Experience] = {}
            for exp in exps:
                if exp.experience_id not in self._row and exp.experience_id not in fresh:
                    fresh[exp.experience_id] = exp
        if not fresh:
            return 0
        batch = list(fresh.values())
        vectors = check_shape(self.embedder, self.embedder.embed([experience_text(e) for e in batch]), len(batch))
        with self._lock:
            keep = [i for i, e in enumerate(batch) if e.experience_id not in self._row]
            for i in keep:
                self._insert(batch[i])
            self._index.append(vectors[keep])
            plan = self._index.plan_rebuild()
        if plan is not None:
            self._rebuild(plan)
        return len(keep)

    def _insert(self, exp: Experience) -> None:
        a, b = self.options.utility.prior(exp)
        seen = 0
        for improved in self._pending.pop(exp.experience_id, []):
            a, b = self.options.utility.update(a, b, improved)
            seen += 1
        self._row[exp.experience_id] = len(self._records)
        self._records.append(exp)
        self._keys.append(SignatureKey.of(exp.signature))
        self._alpha.append(a)
        self._beta.append(b)
        self._seen.append(seen)

    def _tuning_queries(self, n: int) -> Matrix:
        """Query vectors shaped like real ones: the task and diagnosis of sampled records."""
        rng = np.random.default_rng([self.seed, n])
        rows = rng.choice(n, size=min(n, 2 * self.options.tune_queries), replace=False)
        texts = dict.fromkeys(
            query_text(ExperienceQuery(signature=self._records[r].signature, diagnosis=self._records[r].diagnosis))
            for r in rows.tolist()
        )
        batch = list(texts)[: self.options.tune_queries]
        return check_shape(self.embedder, self.embedder.embed(batch), len(batch))

    def _rebuild(self, plan: RebuildPlan) -> None:
        """Train the new IVF index outside the lock, then install it (or release the claim)."""
        installed = False
        try:
            plan.queries = self._tuning_queries(len(plan.vectors))
            index, tuning = plan.build()
            with self._lock:
                self._index.install(index, tuning)
                installed = True
        finally:
            if not installed:
                with self._lock:
                    self._index.abandon_rebuild()

    # -- utility ------------------------------------------------------------------------------

    def apply_outcome(self, o: ExperienceOutcome) -> None:
        """Update the utility of the records ``o`` names; a second call with its id does nothing."""
        with self._lock:
            if o.outcome_id in self._applied:
                return
            self._applied.add(o.outcome_id)
            self._applied_order.append(o.outcome_id)
            for eid in dict.fromkeys(o.experience_ids):
                row = self._row.get(eid)
                if row is None:
                    self._pending.setdefault(eid, []).append(o.improved)
                    continue
                self._alpha[row], self._beta[row] = self.options.utility.update(
                    self._alpha[row], self._beta[row], o.improved
                )
                self._seen[row] += 1

    def apply_many(self, messages: Iterable[Experience | ExperienceOutcome], *, batch: int = 256) -> int:
        """Replay a stream of records and outcomes in order; returns how many records were new.

        Runs of records are embedded in batches of up to ``batch``; the pending run is added
        before each outcome, so the result equals applying the messages one by one.
        """
        added = 0
        run: list[Experience] = []
        for msg in messages:
            if isinstance(msg, Experience):
                run.append(msg)
                if len(run) >= batch:
                    added += self.add_many(run)
                    run = []
            else:
                added += self.add_many(run)
                run = []
                self.apply_outcome(msg)
        return added + self.add_many(run)

    def utility(self, experience_id: str) -> float:
        """Current utility of a record in (0, 1); :class:`UnknownExperience` if absent."""
        with self._lock:
            row = self._row.get(experience_id)
            if row is None:
                raise UnknownExperience(experience_id)
            return self.options.utility.value(self._alpha[row], self._beta[row])

    def get(self, experience_id: str) -> Experience:
        """The record with this id; :class:`UnknownExperience` if absent."""
        with self._lock:
            row = self._row.get(experience_id)
            if row is None:
                raise UnknownExperience(experience_id)
            return self._records[row]

    # -- retrieval ----------------------------------------------------------------------------

    def _query_vector(self, text: str) -> Matrix:
        with self._lock:
            cached = self._qcache.get(text)
            if cached is not None:
                self._qcache.move_to_end(text)
                return cached
        vector: Matrix = check_shape(self.embedder, self.embedder.embed([text]), 1)[0]
        if self.options.query_cache:
            with self._lock:
                self._qcache[text] = vector
                while len(self._qcache) > self.options.query_cache:
                    self._qcache.popitem(last=False)
        return vector

    def search(self, q: ExperienceQuery) -> ExperienceHits:
        """The ``q.k`` best records for ``q``, best first (see the module docstring)."""
        vector = self._query_vector(query_text(q))
        weights, model = self.options.weights, self.options.utility
        qkey = SignatureKey.of(q.signature)
        with self._lock:
            size = len(self._records)
            fetch = max(self.options.fetch, 4 * q.k)
            exhaustive = False
            while True:
                find = self._index.exact_search if exhaustive else self._index.search
                scores, labels = find(vector, fetch)
                ranked: list[tuple[float, int, float, float]] = []
                for score, label in zip(scores.tolist(), labels.tolist(), strict=True):
                    exp = self._records[label]
                    if q.exclude_run is not None and exp.run_id == q.exclude_run:
                        continue
                    util = model.value(self._alpha[label], self._beta[label])
                    if q.min_utility is not None and util < q.min_utility:
                        continue
                    diag = diagnosis_match(q.diagnosis, exp.diagnosis)
                    sig = signature_similarity(qkey, self._keys[label])
                    ranked.append((rank_score(score, diag, sig, util, weights), label, score, util))
                if len(ranked) >= q.k:
                    break
                if len(labels) < min(fetch, size) and not exhaustive:
                    exhaustive = True  # the probed IVF cells ran out: go on with exact search
                    continue
                if fetch >= size:
                    break
                fetch = min(2 * fetch, size)
            ranked.sort(key=lambda t: (-t[0], t[1]))
            hits = tuple(
                ExperienceHit(experience=self._records[label], score=score, utility=util)
                for _, label, score, util in ranked[: q.k]
            )
        return ExperienceHits(hits=hits, embedder=self.embedder.name, library_size=size)

    def stats(self) -> LibraryStats:
        """Counts and index state."""
        with self._lock:
            return LibraryStats(
                embedder=self.embedder.name,
                size=len(self._records),
                index=self._index.kind,
                tuning=self._index.tuning,
                outcomes_applied=len(self._applied),
                outcomes_pending=sum(len(v) for v in self._pending.values()),
            )

    # -- snapshots ----------------------------------------------------------------------------

    def save(self, directory: Path, *, last_seq: int) -> None:
        """Write a snapshot reflecting the stream up to ``last_seq``; :class:`SnapshotError` on failure."""
        with self._save_lock:
            with self._lock:
                state = snapshot.LibraryState(
                    embedder=self.embedder.name,
                    dim=self.embedder.dim,
                    exact_limit=self.exact_limit,
                    seed=self.seed,
                    options=self.options,
                    records=list(self._records),
                    alpha=list(self._alpha),
                    beta=list(self._beta),
                    outcomes_seen=list(self._seen),
                    vectors=self._index.vectors,
                    tuning=self._index.tuning,
                    ivf=self._index.serialize_ivf(),
                    applied=list(self._applied_order),
                    pending={k: list(v) for k, v in self._pending.items()},
                )
            manifest = snapshot.write(Path(directory), state, last_seq)
        log.info("experience_snapshot_saved", path=str(directory), entries=manifest.count, last_seq=last_seq)

    @classmethod
    def load(cls, directory: Path, embedder: Embedder) -> tuple[ExperienceLibrary, int] | None:
        """The library saved in ``directory`` and its ``last_seq``; ``None`` (logged) if unusable."""
        directory = Path(directory)
        try:
            state, last_seq = snapshot.read(directory, embedder.name, embedder.dim)
            try:
                lib = cls(embedder, exact_limit=state.exact_limit, seed=state.seed, options=state.options)
                lib._index = VectorIndex.restore(lib._index.config, state.vectors, state.tuning, state.ivf)
            except (ConfigError, ValueError, RuntimeError) as exc:
                raise SnapshotError(directory, f"index does not restore: {exc}") from exc
        except SnapshotError as exc:
            log.warning("experience_snapshot_unusable", path=str(directory), reason=exc.reason)
            return None
        lib._records = state.records
        lib._keys = [SignatureKey.of(e.signature) for e in state.records]
        lib._row = {e.experience_id: i for i, e in enumerate(state.records)}
        lib._alpha, lib._beta, lib._seen = state.alpha, state.beta, state.outcomes_seen
        lib._applied_order = state.applied
        lib._applied = set(state.applied)
        lib._pending = state.pending
        log.info("experience_snapshot_loaded", path=str(directory), entries=len(lib), last_seq=last_seq)
        return lib, last_seq
