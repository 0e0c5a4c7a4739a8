"""Evolution end to end on the CPU (template expert, Triton interpreter, real evaluator):
a run seeded with a deliberately poor kernel improves on it, migration moves elites between
islands, and a second run on a similar task starts from what the first one stored.

The numbers are measured, not asserted as constants: the tests check improvement and cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.experts.template import Plan, analyse, default_params, render

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "examples" / "quickstart.py").read_text()


def poor_kernel(source: str) -> str:
    """The template kernel for ``source`` with the worst tiles it allows: tiny tiles, one warp,
    no pipelining, no fused epilogue."""
    plan = analyse(source)
    assert isinstance(plan, Plan)
    poor = default_params(plan).with_changes(
        mm_block_m=16, mm_block_n=16, mm_block_k=16, mm_warps=1, mm_stages=1, fuse_epilogue=False
    )
    return render(plan, poor)


def kfoundry_run(task: Path, run_dir: Path, home: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, KFOUNDRY_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("NATS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "actors.cli", "run", str(task), "--device", "cpu", "--embedder", "hashing",
         "--run-dir", str(run_dir), *args],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    return report


def fitness_points(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for island in report["islands"] for p in island["fitness"]]


@pytest.mark.slow  # ~4 min of interpreter runs: CI's slow step runs it
@pytest.mark.timeout(650)
def test_run_from_a_poor_kernel_improves_and_migrates_elites(tmp_path: Path) -> None:
    task = tmp_path / "quickstart.py"
    task.write_text(QUICKSTART)
    seed = tmp_path / "poor.py"
    seed.write_text(poor_kernel(QUICKSTART))
    report = kfoundry_run(
        task, tmp_path / "run", tmp_path / "home", "--seed-candidate", str(seed), "--islands", "2",
        "--candidates", "8", "--migration-interval", "2", "--run-id", "poorstart",
    )  # fmt: skip
    points = fitness_points(report)
    seed_points = [p for p in points if p["expert"] == "user"]
    assert seed_points, "the seed candidate was not evaluated"
    seed_fitness = seed_points[0]["fitness"]
    assert seed_fitness is not None  # the poor kernel is correct, only slow
    best = report["best"]["fitness"]
    sys.stderr.write(f"poor seed {seed_fitness:.6f}x -> best {best:.6f}x over eager ({best / seed_fitness:.1f}x)\n")
    # Measured here: 0.00017x -> 0.0070x (41x). Interpreter timings of one kernel on a loaded machine
    # move by well under 2x, so a 4x gain is evolution, not noise; re-timing the seed would not pass.
    assert best >= 4 * seed_fitness, f"best {best} is not clearly better than the poor seed {seed_fitness}"
    assert report["best"]["candidate_id"] != seed_points[0]["candidate_id"]
    # Elites moved between islands, and a migrant entered its destination's archive.
    assert report["migrations"], "no migration happened"
    moved = {cid for m in report["migrations"] for cid in m["candidate_ids"]}
    migrants = [p for p in points if p.get("migrant")]
    assert migrants, "no migrant entered an archive"
    assert {p["candidate_id"] for p in migrants} <= moved


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_second_run_on_a_similar_task_starts_from_what_the_first_stored(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first_task = tmp_path / "first.py"
    first_task.write_text(QUICKSTART)
    first = kfoundry_run(first_task, tmp_path / "run1", home, "--candidates", "6", "--run-id", "first")
    # A similar task: the same ops at other sizes.
    second_task = tmp_path / "second.py"
    second_task.write_text(QUICKSTART.replace("batch_size = 64", "batch_size = 48"))
    second = kfoundry_run(second_task, tmp_path / "run2", home, "--candidates", "4", "--run-id", "second")
    first_ids = {p["candidate_id"] for p in fitness_points(first)}
    used = [e for e in second["experiences"] if e["experience_id"].removeprefix("exp-") in first_ids]
    assert used, "the second run retrieved nothing from the first"
    # ... and started candidates from the configuration of the best experience it retrieved.
    strategies = [json.loads(line).get("strategy", "") for line in _events(tmp_path / "run2" / "run.log", "proposal")]
    assert any(s.endswith("/experience") for s in strategies), strategies
    # Whether such a start is faster than one without the first run's experience is a benchmark's
    # question (``bench/ablation.py``, its ``no_experience`` variant), not this test's: under the
    # CPU interpreter the spread between configurations of this small task is close to the noise.


def _events(log: Path, event: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("{") and f'"event": "{event}"' in line]
