"""``bench/conv_bench.py`` on the CPU: which problems it picks and the table it prints (its timing needs a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.conv_bench import conv_problems, table
from bench.conv_bench import main as conv_bench_main

CONV = "import torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n        self.c = nn.{op}(3, 8, 3)\n"
RELU = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x)\n"


def test_only_development_convolutions_are_picked(tmp_path: Path) -> None:
    level = tmp_path / "level1"
    level.mkdir()
    (level / "63_conv_standard_2D.py").write_text(CONV.format(op="Conv2d"))
    (level / "57_conv_transposed_2D.py").write_text(CONV.format(op="ConvTranspose2d"))
    (level / "19_ReLU.py").write_text(
        "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x)\n"
    )
    (level / "64_conv_transposed_1D.py").write_text(CONV.format(op="ConvTranspose1d"))  # not in the subset
    assert [p.number for p in conv_problems(tmp_path, [1], None)] == [57, 63]
    assert [p.number for p in conv_problems(tmp_path, [1], "63")] == [63]


def test_the_table_sets_each_row_against_eager_and_compile() -> None:
    common: dict[str, Any] = {
        "problem": "L1-63 x",
        "tflops": 1.0,
        "pct_tf32": 1.0,
        "pct_fp32": 1.0,
        "rel_err": 1e-4,
        "max_err": 1e-3,
    }
    rows: list[dict[str, Any]] = [
        {**common, "row": "eager (TF32, PyTorch's default)", "ms": 6.0},
        {**common, "row": "torch.compile", "ms": 3.0},
        {**common, "row": "template first candidate", "ms": 2.0},
        {"problem": "L1-63 x", "row": "run's best", "error": "no runs/level1_063/best_model.py"},
    ]
    text = table(rows, "GPU")
    first = next(line for line in text.splitlines() if "first candidate" in line)
    assert first.rstrip().endswith("| 3.00x | 1.50x |")
    assert "no runs/level1_063/best_model.py" in text


def test_bad_arguments_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        conv_bench_main([str(tmp_path), "--levels", "1,2", "--problems", "63"])
    assert "--problems needs exactly one --levels" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        conv_bench_main([str(tmp_path), "--levels", "7"])
    assert "development subset has levels" in capsys.readouterr().err


def test_errors_in_chunks_are_the_whole_arrays_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from bench import conv_bench

    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    out = (truth + 1e-3 * torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)).float()
    diff = out.double() - truth
    want = (float(diff.norm() / truth.norm()), float(diff.abs().max()))
    monkeypatch.setattr(conv_bench, "CHUNK", 8)  # 105 elements: 14 chunks, the last short
    got = conv_bench.errors((out,), truth)
    assert got == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="elements"):
        conv_bench.errors(out[:2], truth)
