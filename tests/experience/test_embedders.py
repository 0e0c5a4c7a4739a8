"""The hashing embedder, the embedding texts, and the choice of embedder (no model loaded here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from experience import (
    ConfigError,
    EmbedderUnavailable,
    HashingEmbedder,
    MiniLMEmbedder,
    default_embedder,
    experience_text,
    query_text,
)
from schemas import DiagnosisCategory
from tests.experience.helpers import query, record

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["online softmax: running max and sum in one pass", "tiled matmul BLOCK_M=128", ""]


def test_hashing_embedder_gives_the_same_vectors_in_another_process() -> None:
    script = (
        "import json, sys; from experience.embedders import HashingEmbedder; "
        "print(json.dumps(HashingEmbedder(96).embed(json.loads(sys.argv[1])).tolist()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
        timeout=50,
    )
    other = np.array(json.loads(out.stdout), dtype=np.float32)
    assert np.array_equal(other, HashingEmbedder(96).embed(TEXTS))


def test_hashing_rows_are_unit_length_and_a_text_without_words_is_zero() -> None:
    vectors = HashingEmbedder(96).embed(TEXTS)
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 96)
    assert np.linalg.norm(vectors[:2], axis=1) == pytest.approx([1.0, 1.0], abs=1e-6)
    assert not vectors[2].any()
    assert HashingEmbedder(96).embed([]).shape == (0, 96)


def test_hashing_scores_shared_words_above_unrelated_text() -> None:
    emb = HashingEmbedder(384)
    base, near, far = emb.embed(
        [
            "fused the relu into the conv2d epilogue to save a launch",
            "fused relu into the conv2d epilogue, one launch fewer",
            "masked tail of cumsum with offsets below n_elements",
        ]
    )
    assert float(base @ near) > 0.5 > float(base @ far)


def test_embedder_names_identify_model_and_dimension() -> None:
    assert HashingEmbedder(128).name == "hash-ngram-v1/128"
    assert HashingEmbedder(128).dim == 128


def test_query_text_shares_the_task_and_diagnosis_lines_of_the_record() -> None:
    exp = record(diagnosis=DiagnosisCategory.SLOW_LAUNCH_BOUND, ops=("linear", "relu"))
    q = query(diagnosis=DiagnosisCategory.SLOW_LAUNCH_BOUND, ops=("linear", "relu"), text="launch-bound")
    exp_lines, q_lines = experience_text(exp).splitlines(), query_text(q).splitlines()
    assert exp_lines[:2] == q_lines[:2]
    assert q_lines[1] == "diagnosis: slow launch bound"
    assert "linear -> relu" in q_lines[0]
    assert q_lines[2] == "launch-bound"
    assert exp.description in experience_text(exp)


def test_default_embedder_builds_hashing_on_request_and_refuses_unknown_names() -> None:
    assert default_embedder("hashing", hashing_dim=64).name == "hash-ngram-v1/64"
    with pytest.raises(ConfigError, match="prefer") as info:
        default_embedder("word2vec")
    assert info.value.value == "word2vec"


def test_default_embedder_falls_back_to_hashing_when_the_model_folder_is_empty(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailable, match="pooling config"):
        MiniLMEmbedder(model_dir=tmp_path)
    with capture_logs() as logs:
        emb = default_embedder("minilm", model_dir=tmp_path)
    assert isinstance(emb, HashingEmbedder)
    assert logs[0]["event"] == "embedder_fallback"
    assert "pooling config" in logs[0]["reason"]


def test_minilm_embedder_reads_its_dimension_without_loading_the_model() -> None:
    emb = MiniLMEmbedder()
    assert (emb.name, emb.dim, emb.loaded, emb.threads) == ("minilm-l6-v2/384", 384, False, 1)
    with pytest.raises(ConfigError, match="threads"):
        MiniLMEmbedder(threads=0)
