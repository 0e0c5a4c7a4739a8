"""The vector index: exact to the limit, IVF beyond, retraining, and results that stay sane."""

from __future__ import annotations

import faiss
import numpy as np
import numpy.typing as npt
import pydantic
import pytest

from experience import ConfigError, ExperienceLibrary, HashingEmbedder, IndexKind, LibraryOptions
from experience.index import IndexConfig, VectorIndex, choose_nlist, score_recall, single_thread
from experience.synthetic import synthetic_experiences, synthetic_queries
from experience.text import experience_text

pytestmark = pytest.mark.timeout(90)


def _unit(rng: np.random.Generator, n: int, dim: int) -> npt.NDArray[np.float32]:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    out: npt.NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def test_crossing_the_exact_limit_switches_to_ivf_and_keeps_results_close_to_exact() -> None:
    emb = HashingEmbedder(128)
    records = synthetic_experiences(1500, seed=3)
    ivf = ExperienceLibrary(emb, exact_limit=300, seed=1)
    exact = ExperienceLibrary(emb, exact_limit=100_000)
    for i in range(0, len(records), 250):
        ivf.add_many(records[i : i + 250])
    exact.add_many(records)
    stats = ivf.stats()
    assert stats.index is IndexKind.IVF
    assert exact.stats().index is IndexKind.FLAT
    assert stats.size == 1500
    assert stats.tuning is not None
    assert stats.tuning.recall >= 0.95 or stats.tuning.nprobe == stats.tuning.nlist
    overlaps = []
    for q in synthetic_queries(40, seed=4):
        got = {h.experience.experience_id for h in ivf.search(q).hits}
        want = {h.experience.experience_id for h in exact.search(q).hits}
        overlaps.append(len(got & want) / len(want))
    assert float(np.mean(overlaps)) >= 0.9
    # Every record is still reachable: its own text finds a record with the same text first.
    for exp in records[::50]:
        vec = emb.embed([experience_text(exp)])[0]
        scores, _ = ivf.vector_index.search(vec, 1)
        assert scores[0] == pytest.approx(1.0, abs=1e-4)


def test_ivf_is_retrained_with_more_cells_after_the_library_grows() -> None:
    emb = HashingEmbedder(64)
    records = synthetic_experiences(2000, seed=5)
    lib = ExperienceLibrary(emb, exact_limit=200, options=LibraryOptions(retrain_growth=2.0))
    lib.add_many(records[:250])
    first = lib.stats().tuning
    assert first is not None
    assert first.generation == 1
    assert first.trained_at == 250
    lib.add_many(records[250:2000])
    second = lib.stats().tuning
    assert second is not None
    assert second.generation == 2
    assert second.trained_at == 2000
    assert second.nlist > first.nlist


def test_rows_added_during_a_rebuild_are_searchable_after_install() -> None:
    rng = np.random.default_rng(0)
    index = VectorIndex(IndexConfig(dim=32, exact_limit=100, seed=0))
    index.append(_unit(rng, 400, 32))
    plan = index.plan_rebuild()
    assert plan is not None
    assert index.plan_rebuild() is None  # one rebuild at a time
    late = _unit(rng, 50, 32)
    index.append(late)
    built, tuning = plan.build()
    serving = index.kind
    assert serving is IndexKind.FLAT  # the exact index serves until the new one is installed
    index.install(built, tuning)
    assert index.kind is IndexKind.IVF
    assert len(index) == 450
    scores, labels = index.search(late[7], 1)
    assert int(labels[0]) == 407
    assert scores[0] == pytest.approx(1.0, abs=1e-5)


def test_choose_nlist_keeps_enough_training_points_per_cell() -> None:
    assert choose_nlist(20) == 1
    assert choose_nlist(300) == 4
    assert choose_nlist(20_000) == 256
    assert choose_nlist(100_000) == 512
    assert choose_nlist(1_000_000) == 1024
    assert choose_nlist(10**9) == 4096


def test_score_recall_tolerates_ties() -> None:
    exact = np.array([[0.9, 0.8, 0.8]], dtype=np.float32)
    assert score_recall(np.array([[0.9, 0.8, 0.8]], dtype=np.float32), exact) == 1.0
    assert score_recall(np.array([[0.9, 0.8, 0.5]], dtype=np.float32), exact) == pytest.approx(2 / 3)


def test_single_thread_is_scoped_to_the_block() -> None:
    before = faiss.omp_get_max_threads()
    with single_thread():
        assert faiss.omp_get_max_threads() == 1
    assert faiss.omp_get_max_threads() == before


def test_bad_index_settings_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="exact_limit") as info:
        IndexConfig(dim=8, exact_limit=10)
    assert info.value.field == "exact_limit"
    with pytest.raises(ConfigError, match="recall_target"):
        IndexConfig(dim=8, recall_target=1.5)
    with pytest.raises(pydantic.ValidationError, match="retrain_growth"):
        LibraryOptions(retrain_growth=1.0)
    with pytest.raises(ConfigError, match="dim"):
        HashingEmbedder(2)
