"""Snapshots: round trips with last_seq, idempotent replay after a reload, and refusals."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from experience import ExperienceLibrary, HashingEmbedder, IndexKind, SnapshotError
from experience.snapshot import LOCK, MANIFEST, read_manifest
from experience.synthetic import synthetic_experiences, synthetic_queries
from schemas import ExperienceQuery
from tests.experience.helpers import outcome, query, record

pytestmark = pytest.mark.timeout(60)


def _ranked(lib: ExperienceLibrary, q: ExperienceQuery) -> list[tuple[str, float, float]]:
    return [(h.experience.experience_id, round(h.score, 5), round(h.utility, 9)) for h in lib.search(q).hits]


def _populated(exact_limit: int = 20_000) -> ExperienceLibrary:
    lib = ExperienceLibrary(HashingEmbedder(64), exact_limit=exact_limit, seed=3)
    records = synthetic_experiences(600, seed=11)
    lib.add_many(records)
    for i, exp in enumerate(records[:40]):
        lib.apply_outcome(outcome(exp.experience_id, records[i + 1].experience_id, improved=i % 3 == 0))
    return lib


@pytest.mark.parametrize("exact_limit", [20_000, 200], ids=["exact", "ivf"])
def test_save_and_load_round_trip_keeps_records_utilities_and_last_seq(tmp_path: Path, exact_limit: int) -> None:
    lib = _populated(exact_limit)
    lib.save(tmp_path / "snap", last_seq=1234)
    loaded = ExperienceLibrary.load(tmp_path / "snap", HashingEmbedder(64))
    assert loaded is not None
    again, last_seq = loaded
    assert last_seq == 1234
    assert len(again) == len(lib) == 600
    assert again.stats() == lib.stats()
    assert again.stats().index is (IndexKind.FLAT if exact_limit > 600 else IndexKind.IVF)
    for q in synthetic_queries(10, seed=12):
        assert _ranked(again, q) == _ranked(lib, q)


def test_replaying_the_stream_after_a_reload_changes_nothing(tmp_path: Path) -> None:
    lib = ExperienceLibrary(HashingEmbedder(64))
    exps = [record(f"change {i}") for i in range(5)]
    reports = [outcome(e.experience_id, improved=False) for e in exps[:3]]
    lib.add_many(exps)
    for r in reports:
        lib.apply_outcome(r)
    lib.save(tmp_path, last_seq=8)
    loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
    assert loaded is not None
    again = loaded[0]
    before = [again.utility(e.experience_id) for e in exps]
    assert again.add_many(exps) == 0
    for r in reports:
        again.apply_outcome(r)
    assert [again.utility(e.experience_id) for e in exps] == before
    again.apply_outcome(outcome(exps[4].experience_id, improved=False))
    assert again.utility(exps[4].experience_id) < before[4]


def test_pending_outcomes_survive_a_snapshot(tmp_path: Path) -> None:
    lib = ExperienceLibrary(HashingEmbedder(64))
    lib.add(record("first"))
    late = record("arrives after its outcome")
    lib.apply_outcome(outcome(late.experience_id, improved=False))
    lib.save(tmp_path, last_seq=2)
    loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
    assert loaded is not None
    again = loaded[0]
    assert again.stats().outcomes_pending == 1
    again.add(late)
    lib.add(late)
    assert again.utility(late.experience_id) == lib.utility(late.experience_id) < 2 / 3  # prior of an improvement


def test_snapshot_of_another_embedder_is_refused(tmp_path: Path) -> None:
    _populated().save(tmp_path, last_seq=5)
    with capture_logs() as logs:
        assert ExperienceLibrary.load(tmp_path, HashingEmbedder(32)) is None
    assert logs[0]["event"] == "experience_snapshot_unusable"
    assert "hash-ngram-v1/64" in logs[0]["reason"]
    assert "hash-ngram-v1/32" in logs[0]["reason"]


def test_corrupt_snapshot_is_refused(tmp_path: Path) -> None:
    _populated().save(tmp_path, last_seq=5)
    vectors = next(tmp_path.glob("vectors-*.npy"))
    data = bytearray(vectors.read_bytes())
    data[-3] ^= 0xFF
    vectors.write_bytes(bytes(data))
    with capture_logs() as logs:
        assert ExperienceLibrary.load(tmp_path, HashingEmbedder(64)) is None
    assert "corrupt" in logs[0]["reason"]


def test_truncated_manifest_is_refused(tmp_path: Path) -> None:
    _populated().save(tmp_path, last_seq=5)
    manifest = tmp_path / MANIFEST
    manifest.write_text(manifest.read_text()[:100])
    assert ExperienceLibrary.load(tmp_path, HashingEmbedder(64)) is None


def test_missing_snapshot_loads_as_none(tmp_path: Path) -> None:
    assert ExperienceLibrary.load(tmp_path / "nothing-here", HashingEmbedder(64)) is None


def test_a_new_save_replaces_the_previous_generation(tmp_path: Path) -> None:
    lib = ExperienceLibrary(HashingEmbedder(64))
    lib.add(record("one"))
    lib.save(tmp_path, last_seq=1)
    lib.add(record("two"))
    lib.save(tmp_path, last_seq=2)
    assert read_manifest(tmp_path).generation == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        LOCK,
        MANIFEST,
        "outcomes-2.json",
        "records-2.jsonl",
        "utility-2.npy",
        "vectors-2.npy",
    ]
    loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
    assert loaded is not None
    assert (len(loaded[0]), loaded[1]) == (2, 2)


def test_a_negative_last_seq_is_refused(tmp_path: Path) -> None:
    lib = ExperienceLibrary(HashingEmbedder(64))
    with pytest.raises(SnapshotError, match="last_seq") as info:
        lib.save(tmp_path, last_seq=-1)
    assert info.value.path == tmp_path


def test_a_loaded_library_keeps_growing_across_the_exact_limit(tmp_path: Path) -> None:
    lib = ExperienceLibrary(HashingEmbedder(64), exact_limit=300)
    records = synthetic_experiences(500, seed=21)
    lib.add_many(records[:250])
    lib.save(tmp_path, last_seq=250)
    loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
    assert loaded is not None
    again = loaded[0]
    assert again.add_many(records) == 250
    assert again.stats().index is IndexKind.IVF
    assert again.search(query(k=3)).library_size == 500


def test_an_empty_library_round_trips(tmp_path: Path) -> None:
    ExperienceLibrary(HashingEmbedder(64)).save(tmp_path, last_seq=0)
    loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
    assert loaded is not None
    assert (len(loaded[0]), loaded[1]) == (0, 0)
    assert loaded[0].search(query()).hits == ()


def test_curators_sharing_a_directory_neither_break_each_others_writes_nor_their_reads(tmp_path: Path) -> None:
    # Runs side by side on one machine share its home, so their curators save to one directory:
    # unlocked, one picked the generation another was writing or removed its files mid-write
    # (`writing generation 3 failed: ... records-3.jsonl`, four runs at once on a 4-GPU host).
    libs = [_populated(), _populated(200)]
    failures: list[BaseException] = []
    loads: list[int] = []

    def save(lib: ExperienceLibrary) -> None:
        try:
            for i in range(15):
                lib.save(tmp_path, last_seq=i)
        except (SnapshotError, OSError) as exc:  # collected for the assertion below
            failures.append(exc)

    def load() -> None:
        try:
            for _ in range(15):
                loaded = ExperienceLibrary.load(tmp_path, HashingEmbedder(64))
                loads.append(len(loaded[0]) if loaded is not None else -1)
        except (SnapshotError, OSError) as exc:
            failures.append(exc)

    threads = [threading.Thread(target=save, args=(lib,)) for lib in libs] + [threading.Thread(target=load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert failures == []
    assert set(loads) <= {-1, 600}  # nothing yet, or a whole snapshot: never a torn one
    assert loads.count(600) > 0
    assert read_manifest(tmp_path).count == 600
