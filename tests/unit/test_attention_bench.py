"""``bench/attention_bench.py`` on the CPU: its quick mode end to end (eager, SDPA, the template's
first candidate under Triton's interpreter, a run's best), its cases and its refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.attention_bench import main as attention_bench_main
from bench.attention_cases import kernelbench_cases, sweep_cases
from schemas import source_fingerprint

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    "eager (the reference, PyTorch's defaults)",
    "SDPA math",
    "SDPA efficient",
    "SDPA flash",
    "SDPA cuDNN",
    "torch.compile",
    "template first candidate",
]
BEST = """import torch
import torch.nn.functional as F


class ModelNew(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)
"""


def test_kernelbench_cases_are_the_published_shapes() -> None:
    l1, l3 = kernelbench_cases(quick=False)
    assert (l1.b, l1.h, l1.s, l1.d, l1.dtype, l1.causal) == (32, 32, 512, 1024, "float32", False)
    assert "scaled_dot_product_attention(q, k, v, is_causal=False)" in l1.source
    assert (l3.b, l3.h, l3.s, l3.d, l3.dtype, l3.causal, l3.explicit) == (128, 8, 512, 96, "float32", True, True)
    assert "masked_fill(self.bias[:, :, :T, :T] == 0" in l3.source
    assert l3.flops == 4 * 128 * 8 * 512 * 512 * 96 / 2
    sweep = sweep_cases([64, 1024], [512, 8192], ["bfloat16"], [False, True], tokens=16384, hidden=2048, quick=False)
    assert len(sweep) == 8
    assert {(c.b, c.h, c.s, c.d) for c in sweep} == {
        (32, 32, 512, 64),
        (2, 32, 8192, 64),
        (32, 2, 512, 1024),
        (2, 2, 8192, 1024),
    }


@pytest.mark.slow  # ~3 s on a 2-core host: the bench end to end
def test_quick_cpu_run_measures_every_row_against_float64(tmp_path: Path) -> None:
    l1 = kernelbench_cases(quick=True)[0]
    run = tmp_path / "run-l1"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"task_id": source_fingerprint(l1.source)}))
    (run / "best_model.py").write_text(BEST)
    out = tmp_path / "out" / "attention.md"
    argv = ["--device", "cpu", "--quick", "--no-compile", "--dims", "16", "--seqs", "40", "--dtypes", "float32"]
    argv += [
        "--causal",
        "yes",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--best",
        str(run),
        "--write-refs",
        str(tmp_path / "refs"),
    ]
    # its own process, as the README runs it: Triton's interpreter is chosen when triton.jit first runs,
    # which in this test process may be before the environment says so (the kernels were then compiled ones)
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-m", "bench.attention_bench", *argv, "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    payload = json.loads(out.with_suffix(".json").read_text())
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in payload["rows"]:
        rows.setdefault(f"{r['case']} {r['shape']}", []).append(r)
    assert list(rows) == ["L1-97 ScaledDotProductAttention 2x2x32x64", "L3-43 MinGPT-core 2x2x32x24", "sweep 1x2x40x16"]
    for case, got in rows.items():
        labels = [r["row"] for r in got]
        assert labels[: len(ROWS)] == ROWS, case
        by = {r["row"]: r for r in got}
        for label in (ROWS[0], "SDPA math", "template first candidate"):
            assert by[label]["status"] == "measured", (case, by[label])
            assert math.isfinite(by[label]["ms"])
            assert by[label]["ms"] > 0
            assert math.isfinite(by[label]["rel_err"])
            assert by[label]["rel_err"] < 1e-5, (case, by[label])
            assert math.isfinite(by[label]["err_vs_eager"])
        for label in ("SDPA efficient", "SDPA cuDNN"):  # CUDA-only backends: n/a, with the reason
            assert by[label]["status"] == "n/a", by[label]
            assert by[label]["note"], by[label]
        assert by["torch.compile"]["note"] == "skipped: --no-compile"
    assert [r["row"] for r in rows["L1-97 ScaledDotProductAttention 2x2x32x64"]][-1] == "run's best (run-l1)"
    assert rows["L1-97 ScaledDotProductAttention 2x2x32x64"][-1]["rel_err"] < 1e-5
    assert all(len(got) == len(ROWS) for case, got in rows.items() if not case.startswith("L1-97"))

    text = out.read_text()
    assert text.count("| template first candidate | ") == 3
    assert text.count("| SDPA efficient | n/a: ") == 3
    refs = sorted(p.name for p in (tmp_path / "refs").iterdir())
    assert refs == [
        "l1-97_2x2x32x64_float32.py",
        "l3-43_2x2x32x24_float32_causal.py",
        "sweep_1x2x40x16_float32_causal.py",
    ]
    assert (tmp_path / "refs" / refs[0]).read_text() == l1.source


def test_bad_arguments_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        attention_bench_main(["--dtypes", "float64"])
    assert "each one of float32, bfloat16, float16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        attention_bench_main(["--dims", "64,x"])
    assert "comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        attention_bench_main(["--device", "cpu", "--best", str(tmp_path)])
    assert "no report.json with a task_id" in capsys.readouterr().err
