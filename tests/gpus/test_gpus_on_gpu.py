"""On a GPU machine: ``kfoundry run`` starts one evaluator per visible GPU, each pinned, and the
report shows every GPU's throughput and busy fraction; a pinned service's workers see one GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.runtime.gpus import list_gpus

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(1200)
def test_a_run_uses_every_visible_gpu_and_reports_each(tmp_path: Path) -> None:
    gpus = list_gpus()
    assert gpus, "no GPU visible (nvidia-smi)"
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    env.pop("NATS_URL", None)
    run_dir = tmp_path / "run"
    candidates = 4 * len(gpus)
    proc = subprocess.run(
        [sys.executable, "-m", "actors.cli", "run", str(QUICKSTART), "--gpus", "all", "--candidates", str(candidates),
         "--seconds", "900", "--embedder", "hashing", "--run-dir", str(run_dir), "--run-id", "gpusall"],
        capture_output=True, text=True, env=env, timeout=1100, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    listed = ", ".join(f"{g.index} ({g.name})" for g in gpus)
    assert f"evaluators: one per GPU on GPU {listed}" in proc.stderr
    report = json.loads((run_dir / "report.json").read_text())
    rows = report["gpus"]
    assert sorted(r["gpu"] for r in rows) == [g.index for g in gpus], rows
    assert sum(r["evaluated"] for r in rows) == report["evaluated"]
    for row in rows:
        assert row["evaluated"] >= 1, row  # every GPU got work
        assert row["busy_fraction"] is not None, row
        assert row["busy_fraction"] > 0, row
        assert row["candidates_per_s"] > 0, row
    # Every GPU was given back when the run ended.
    from actors.runtime.gpu_claim import claim_gpu

    for gpu in gpus:
        claim_gpu(gpu).release()


def _apps_per_gpu() -> dict[str, int]:
    """Processes with a CUDA context, per GPU UUID (``nvidia-smi --query-compute-apps``)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    counts: dict[str, int] = {}
    for line in out.stdout.strip().splitlines():
        uuid = line.split(",")[-1].strip()
        counts[uuid] = counts.get(uuid, 0) + 1
    return counts


@pytest.mark.timeout(600)
async def test_a_pinned_services_workers_start_cuda_on_their_gpu_only(tmp_path: Path) -> None:
    import asyncio

    from gpu_runner.config import RunnerConfig
    from gpu_runner.service import EvaluationService
    from schemas import DeviceChoice

    gpus = list_gpus()
    gpu = gpus[-1]
    before = await asyncio.to_thread(_apps_per_gpu)
    cfg = RunnerConfig(device=DeviceChoice.CUDA, gpu=gpu.uuid, spares=2, work_dir=tmp_path / "work")
    async with EvaluationService(cfg) as svc:
        await svc.prepare(QUICKSTART.read_text())
        await svc.wait_spares(timeout_s=300)
        during = await asyncio.to_thread(_apps_per_gpu)
    grew = {uuid: during.get(uuid, 0) - before.get(uuid, 0) for uuid in {g.uuid for g in gpus}}
    if grew[gpu.uuid] <= 0:
        pytest.skip("nvidia-smi shows no processes of this container: the pin cannot be observed here")
    assert all(n <= 0 for uuid, n in grew.items() if uuid != gpu.uuid), grew
