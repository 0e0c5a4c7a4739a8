"""``bench.kernel_profile``: kernel names grouped into kinds (the template's and PyTorch's), the
table it prints, and its refusal without a GPU (the profile is of device time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.kbench.problems import Problem
from bench.kernel_profile import Row, kind_of, main, table


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("_kf_row61", "row"),
        ("_kf_conv81_wr", "conv_wr"),
        ("_kf_conv5_in", "conv_in"),
        ("_kf_row61_b", "row_b"),
        ("_kf_mm136", "mm"),
        ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(...)", "cudnn::bn_fw_tr_1C11_singleread"),
    ],
)
def test_kernels_are_grouped_by_kind(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def test_the_table_lists_each_rows_kinds_largest_first_and_failures() -> None:
    problem = Problem(3, 19, Path("19_MobileNetV1.py"))
    rows = [
        Row("eager", 1.02, 110, {"cudnn::bn": 0.42, "conv_depthwise2d": 0.2}),
        Row("template first candidate", 0.77, 165, {"conv": 0.32, "row": 0.19}, [("_kf_conv0", 0.03)]),
        Row("broken", error="RuntimeError: boom"),
    ]
    text = table([(problem, rows)], "NVIDIA H100", kinds=1, top=1)
    assert "| 19_MobileNetV1 | eager | 1.020 | 110 | cudnn::bn 0.420 |" in text
    assert "| 19_MobileNetV1 | template first candidate | 0.770 | 165 | conv 0.320 |" in text
    assert "failed: RuntimeError: boom" in text
    assert "`_kf_conv0` 0.0300" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
