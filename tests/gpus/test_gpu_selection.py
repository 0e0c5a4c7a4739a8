"""``--gpus``/``--gpu``: parsing, the machine's GPUs under ``CUDA_VISIBLE_DEVICES``, one-line errors, sizing."""

from __future__ import annotations

import pytest

from actors.commands.run import default_inflight
from actors.runtime.errors import ConfigError
from actors.runtime.gpus import (
    BUSY_CORES,
    Gpu,
    SelectionKind,
    compile_workers_per_gpu,
    evaluator_sizing,
    list_gpus,
    parse_selection,
    parse_smi,
    select_gpus,
    select_one,
    visible,
)
from tests.gpus.conftest import FakeSmi, four_h200

SMI = """0, GPU-aaaa0000-1111-2222-3333-444444444444, NVIDIA H200, 143771
1, GPU-bbbb0000-1111-2222-3333-444444444444, NVIDIA H200, 143771
2, GPU-cccc0000-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 81559
"""


def test_nvidia_smi_rows_become_gpus_with_their_memory() -> None:
    gpus = parse_smi(SMI)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[2].name == "NVIDIA H100 80GB HBM3"
    assert gpus[0].memory_bytes == 143771 << 20
    assert gpus[1].uuid.startswith("GPU-bbbb")


def test_unexpected_nvidia_smi_output_is_an_error_naming_the_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_smi("No devices were found")
    assert "No devices were found" in str(err.value)


@pytest.mark.parametrize(
    ("cvd", "uuids"),
    [
        (None, ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]),
        ("2,0", ["GPU-cccc", "GPU-aaaa"]),
        ("GPU-bbbb", ["GPU-bbbb"]),
        ("", []),
        ("1,7,0", ["GPU-bbbb"]),  # like CUDA: the list ends at the first entry naming no GPU
        ("0,0", ["GPU-aaaa"]),
    ],
)
def test_cuda_visible_devices_narrows_and_renumbers_the_gpus(cvd: str | None, uuids: list[str]) -> None:
    seen = visible(parse_smi(SMI), cvd)
    assert [g.uuid[:8] for g in seen] == uuids
    assert [g.index for g in seen] == list(range(len(uuids)))


def test_selection_forms_parse() -> None:
    assert parse_selection("all").kind is SelectionKind.ALL
    assert parse_selection("3").count == 3
    assert parse_selection("0,2").indices == (0, 2)
    assert parse_selection("3,").indices == (3,)
    assert parse_selection(" 1 , 0 ").indices == (1, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,0", "GPU 0 is listed twice"),
        ("1,2,1", "GPU 1 is listed twice"),
        ("0", "a number of GPUs (>= 1)"),
        ("-1", "expected all"),
        ("one", "expected all"),
        ("0,x", "numbers >= 0 separated by commas"),
        (",", "numbers >= 0 separated by commas"),
    ],
)
def test_bad_selections_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_selection(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def _gpus(n: int) -> list[Gpu]:
    return [Gpu(index=i, uuid=f"GPU-{i:08d}", name="NVIDIA H200", memory_bytes=1 << 30) for i in range(n)]


def test_selection_picks_the_named_gpus_in_order() -> None:
    gpus = _gpus(4)
    assert [g.index for g in select_gpus(parse_selection("all"), gpus)] == [0, 1, 2, 3]
    assert [g.index for g in select_gpus(parse_selection("2"), gpus)] == [0, 1]
    assert [g.index for g in select_gpus(parse_selection("3,1"), gpus)] == [3, 1]
    assert select_one(2, gpus).uuid == "GPU-00000002"


def test_an_index_out_of_range_names_the_gpus_there_are() -> None:
    with pytest.raises(ConfigError) as err:
        select_gpus(parse_selection("0,5"), _gpus(4))
    assert str(err.value) == "--gpus 0,5: there is no GPU 5; 4 GPU(s) visible here: 0, 1, 2, 3 (NVIDIA H200)"
    with pytest.raises(ConfigError) as err:
        select_gpus(parse_selection("8"), _gpus(4))
    assert "asks for 8 GPUs, 4 GPU(s) visible here" in str(err.value)
    with pytest.raises(ConfigError) as err:
        select_one(4, _gpus(4))
    assert str(err.value).startswith("--gpu 4: there is no GPU 4")


def test_gpus_on_a_machine_without_a_gpu_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as err:
        select_gpus(parse_selection("all"), [])
    assert "no GPU is visible here" in str(err.value)
    assert "--device cpu" in str(err.value)


def test_compile_workers_share_the_cores_fairly_with_at_least_one_each() -> None:
    assert compile_workers_per_gpu(1, cores=16) == 16
    assert compile_workers_per_gpu(4, cores=16) == 4
    assert compile_workers_per_gpu(3, cores=16) == 5
    assert compile_workers_per_gpu(8, cores=4) == 1
    with pytest.raises(ConfigError):
        compile_workers_per_gpu(0, cores=4)


def test_islands_keep_enough_in_flight_for_every_gpu() -> None:
    assert default_inflight(islands=2, evaluators=1) == 2  # unchanged on one GPU or the CPU
    assert default_inflight(islands=2, evaluators=4) == 8
    assert default_inflight(islands=3, evaluators=2) == 3
    assert default_inflight(islands=8, evaluators=1) == 2


def test_an_evaluator_with_cores_to_spare_on_a_gpu_judges_more_at_once_and_keeps_more_spares() -> None:
    assert evaluator_sizing(on_gpu=True, cores=16) == (4, 3)
    assert evaluator_sizing(on_gpu=True, cores=BUSY_CORES) == (4, 3)
    assert evaluator_sizing(on_gpu=True, cores=BUSY_CORES - 1) == (2, 2)
    assert evaluator_sizing(on_gpu=False, cores=64) == (2, 2)  # the CPU: its cores run the candidates
    # a run on one GPU of such a host: 2 islands keep 4 in flight each (twice what is judged at once)
    assert default_inflight(islands=2, evaluators=1, concurrency=4) == 4


def test_the_machines_gpus_come_from_nvidia_smi_under_cuda_visible_devices(fake_smi: FakeSmi) -> None:
    fake_smi(four_h200())
    assert [g.index for g in list_gpus()] == [0, 1, 2, 3]
    pinned = list_gpus({"CUDA_VISIBLE_DEVICES": "3,1"})
    assert [g.uuid[:12] for g in pinned] == ["GPU-00000003", "GPU-00000001"]
    assert list_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_the_runner_detects_the_gpu_it_is_pinned_to(fake_smi: FakeSmi) -> None:
    from gpu_runner.probe import detect_cuda

    folder = fake_smi(four_h200())
    # An nvidia-smi that answers -i GPU-00000002… with an H100 and anything else with an H200.
    (folder / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$2" in GPU-00000002*) echo "9.0, NVIDIA H100";; *) echo "9.0, NVIDIA H200";; esac\n'
    )
    assert detect_cuda() == {"backend": "cuda", "arch": 90, "warp": 32, "name": "NVIDIA H200"}
    pinned = detect_cuda("GPU-00000002-aaaa-bbbb-cccc-dddddddddddd")
    assert pinned is not None
    assert pinned["name"] == "NVIDIA H100"
