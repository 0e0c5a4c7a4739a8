"""``kfoundry bench --parallel``: how GPUs and cores are split between the runs kept going at once."""

from __future__ import annotations

import pytest

from actors.kbench.errors import BenchError
from actors.kbench.slots import Slot, plan_slots
from actors.runtime.gpus import Gpu


def _gpus(n: int) -> list[Gpu]:
    return [Gpu(index=i, uuid=f"GPU-{i:04d}-aaaa", name="NVIDIA H200", memory_bytes=141 << 30) for i in range(n)]


def test_one_run_at_a_time_keeps_the_whole_machine() -> None:
    (slot,) = plan_slots(1, "cuda", _gpus(4), range(64))
    assert slot == Slot()
    env = slot.environ({"CUDA_VISIBLE_DEVICES": "1,3", "HOME": "/h"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"  # left as the bench saw it
    assert env["PYTHONUNBUFFERED"] == "1"


def test_each_run_gets_gpus_and_cores_of_its_own() -> None:
    slots = plan_slots(4, "cuda", _gpus(4), range(64))
    assert [[g.index for g in s.gpus] for s in slots] == [[0], [1], [2], [3]]
    assert [sorted(s.cores or ()) for s in slots] == [list(range(k * 16, (k + 1) * 16)) for k in range(4)]
    assert slots[2].environ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})["CUDA_VISIBLE_DEVICES"] == "GPU-0002-aaaa"
    assert slots[2].label() == "GPU 2"
    assert slots[2].describe() == "GPU 2 with 16 cores"


def test_gpus_are_split_evenly_and_what_is_left_over_stays_idle() -> None:
    pairs = plan_slots(2, "auto", _gpus(4), range(8))
    assert [s.environ({})["CUDA_VISIBLE_DEVICES"] for s in pairs] == [
        "GPU-0000-aaaa,GPU-0001-aaaa",
        "GPU-0002-aaaa,GPU-0003-aaaa",
    ]
    assert pairs[1].label() == "GPU 2,3"
    three = plan_slots(3, "cuda", _gpus(4), range(7))
    assert [[g.index for g in s.gpus] for s in three] == [[0], [1], [2]]
    assert [len(s.cores or ()) for s in three] == [2, 2, 2]
    assert set().union(*(s.cores or set() for s in three)) <= set(range(7))


def test_cpu_runs_share_only_the_cores() -> None:
    slots = plan_slots(2, "cpu", _gpus(4), [0, 1, 2, 3, 6, 7])  # the GPUs are not the CPU runs' business
    assert [s.gpus for s in slots] == [(), ()]
    assert [sorted(s.cores or ()) for s in slots] == [[0, 1, 2], [3, 6, 7]]
    assert slots[1].label() == slots[1].describe() == "cores 3,6-7"
    assert "CUDA_VISIBLE_DEVICES" not in slots[0].environ({})
    assert [s.gpus for s in plan_slots(2, "auto", [], [0, 1])] == [(), ()]  # auto without a GPU: the CPU


@pytest.mark.parametrize(
    ("parallel", "device", "gpus", "cores", "message"),
    [
        (0, "cuda", 4, 8, "must be at least 1"),
        (5, "cuda", 4, 64, "4 GPU(s) visible here, and runs side by side never share one"),
        (2, "cuda", 0, 8, "no GPU is visible here"),
        (3, "cpu", 0, 2, "may use 2 core(s)"),
    ],
)
def test_impossible_plans_are_refused_with_the_reason(
    parallel: int, device: str, gpus: int, cores: int, message: str
) -> None:
    with pytest.raises(BenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_slots(parallel, device, _gpus(gpus), range(cores))
