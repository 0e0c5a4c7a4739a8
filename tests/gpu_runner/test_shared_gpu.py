"""Shared trial outputs on CUDA (``-m gpu``): device memory exported by a spare outlives it and the
judge compares it in place; the verdicts are the host files' verdicts; nothing stays allocated."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job, reference

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_exported_device_memory_outlives_its_maker_and_is_freed_with_its_last_descriptor() -> None:
    # bench/handoff_probe.py: one process exports 1 GiB and exits, another imports and checks it.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "handoff_probe.py"), "--gib", "1"],
        capture_output=True, text=True, timeout=170, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = {
        cells[1].strip(): cells[2].strip()
        for line in proc.stdout.splitlines()
        if line.startswith("|") and len(cells := line.split("|")) >= 4
    }
    before = int(rows["device memory used before (MiB)"])
    held = int(rows["device memory used, exporter gone, fd held (MiB)"])
    freed = int(rows["device memory used, fd closed (MiB)"])
    assert held - before >= 1000, rows  # the GiB is still allocated with its maker gone
    assert freed - before < 200, rows  # ... and goes with the last descriptor
    assert '"pattern_ok": true' in rows["importer"], rows


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    cfg = fast_config(
        DeviceChoice.CUDA, gpu_runner_tmp / "shared-gpu", spares=1, device_verdict_bytes=0, shared_outputs=True
    )
    service = EvaluationService(cfg)
    await service.start()
    yield service
    await service.aclose()


@pytest.mark.timeout(600)
@pytest.mark.asyncio(loop_scope="module")
async def test_shared_device_outputs_give_the_verdicts_of_host_files(shared: EvaluationService) -> None:
    await shared.prepare(reference("add_relu"))
    await shared.wait_spares(timeout_s=300)
    honest = await shared.evaluate(job("add_relu", "honest_add_relu"))
    assert honest.status is EvalStatus.CORRECT, honest.summary
    assert shared.runs is not None
    assert shared.runs.plan is not None
    assert shared.runs.plan.shared_outputs
    assert shared.judge is not None
    assert shared.judge.compared_shared == shared.judge.compared >= 1
    for bad in ("partial_output", "precision_downcast"):
        result = await shared.evaluate(job("add_relu", bad))
        assert result.status is EvalStatus.INCORRECT, (bad, result.summary)
    assert shared.judge.compared_shared == shared.judge.compared
