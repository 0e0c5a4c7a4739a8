"""One evaluator per GPU: a second claim on a held GPU fails at once, naming the holder; the
claim ends with its release or its process, however that process ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.runtime.gpu_claim import GpuTaken, claim_gpu
from actors.runtime.gpus import Gpu

ROOT = Path(__file__).resolve().parents[2]
GPU = Gpu(index=1, uuid="GPU-11111111-2222-3333-4444-555555555555", name="NVIDIA H200", memory_bytes=1 << 30)
OTHER = Gpu(index=2, uuid="GPU-99999999-2222-3333-4444-555555555555", name="NVIDIA H200", memory_bytes=1 << 30)

HOLDER = """
import sys, time
from pathlib import Path
from actors.runtime.gpu_claim import claim_gpu
from actors.runtime.gpus import Gpu
claim = claim_gpu(Gpu(index=1, uuid=sys.argv[2], name="NVIDIA H200", memory_bytes=1), run_id="other-run",
                  lock_dir=Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_a_second_claim_on_a_held_gpu_names_the_holder(tmp_path: Path) -> None:
    with claim_gpu(GPU, run_id="r1", lock_dir=tmp_path) as first:
        assert first.held
        with pytest.raises(GpuTaken) as err:
            claim_gpu(GPU, run_id="r2", lock_dir=tmp_path)
        other = claim_gpu(OTHER, run_id="r2", lock_dir=tmp_path)  # another GPU is free
        other.release()
    text = str(err.value)
    assert text.startswith(f"GPU 1 (NVIDIA H200, {GPU.uuid}) is already used by pid ")
    assert "run r1" in text
    assert "disturb each other's timings" in text
    assert "\n" not in text


@pytest.mark.timeout(30)
def test_a_released_gpu_can_be_claimed_again(tmp_path: Path) -> None:
    first = claim_gpu(GPU, lock_dir=tmp_path)
    first.release()
    first.release()  # idempotent
    assert not first.held
    claim_gpu(GPU, lock_dir=tmp_path).release()


@pytest.mark.timeout(60)
def test_a_claim_held_by_another_process_ends_when_that_process_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), GPU.uuid],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(GpuTaken) as err:
            claim_gpu(GPU, lock_dir=tmp_path)
        assert f"pid {holder.pid}" in str(err.value)
        assert "run other-run" in str(err.value)
    finally:
        holder.kill()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            claim_gpu(GPU, lock_dir=tmp_path).release()
            break
        except GpuTaken:
            assert time.monotonic() < deadline, "the killed holder's claim outlived it"
            time.sleep(0.05)
