"""``kfoundry export``: a run directory's best model written as a module that stands alone, under a
header saying where it was verified; and the one-line refusals (not a run's folder, no correct
candidate, an existing file, another task's file, a model that imports Kernel Foundry). The whole
path on a real run (``kfoundry run``, then ``export``, then ``eval`` of the exported file) is in
``tests/e2e/test_run_cli.py``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from actors.commands.cli import main
from actors.experts.template import Plan, analyse, default_params, render
from schemas import source_fingerprint

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x) + y


def get_inputs():
    return [torch.randn(16, 40), torch.randn(16, 40, dtype=torch.float32)]


def get_init_inputs():
    return []
"""


def _run_dir(tmp_path: Path, best: bool = True, model: str | None = None) -> tuple[Path, Path]:
    """A run folder as ``kfoundry run`` writes it (the report's fields export reads) and its task."""
    task = tmp_path / "task.py"
    task.write_text(TASK)
    plan = analyse(TASK)
    assert isinstance(plan, Plan)
    run = tmp_path / "run"
    run.mkdir()
    (run / "best_model.py").write_text(model if model is not None else render(plan, default_params(plan)))
    report = {
        "run_id": "r1",
        "task_id": source_fingerprint(TASK),
        "task_name": "relu add",
        "gpus": [{"name": "NVIDIA H200"}],
        "best": {"speedup_vs_eager": 1.5, "speedup_vs_compiled": 1.1, "median_ms": 0.25, "precision": "reference",
                 "err_vs_fp64": 1e-7, "ref_err_vs_fp64": 2e-7} if best else None,
    }  # fmt: skip
    (run / "report.json").write_text(json.dumps(report))
    return run, task


def test_export_writes_the_best_model_under_a_header_of_where_it_was_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, task = _run_dir(tmp_path)
    out = tmp_path / "mine.py"
    assert main(["export", str(run), "--task", str(task), "--out", str(out)]) == 0
    text = out.read_text()
    head = text.split("\n\n")[0]
    assert "from run r1" in head
    assert "NVIDIA H200" in head
    assert "x: (16, 40) float32" in head
    assert "y: (16, 40) float32" in head
    assert "1.500x eager PyTorch, 1.100x torch.compile" in head
    assert f"kfoundry eval {task} {out} --device cuda" in head
    assert text.endswith((run / "best_model.py").read_text())
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"torch", "triton"}, imported
    assert f"wrote {out}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # without --out: the task's name as a module name, here
    assert main(["export", str(run)]) == 0
    assert (tmp_path / "relu_add_kernels.py").read_text().startswith("# Exported by `kfoundry export`")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_dir", "is not a directory"),
        ("no_report", "has no report.json"),
        ("no_best", "found no correct candidate"),
        ("exists", "exists; give --force"),
        ("other_task", "is not this run's task"),
        ("imports_us", "imports actors.experts: not a module that stands alone"),
    ],
)
def test_export_refuses_in_one_line(
    case: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "import actors.experts\nclass ModelNew:\n    pass\n" if case == "imports_us" else None
    run, task = _run_dir(tmp_path, best=case != "no_best", model=model)
    out = tmp_path / "out.py"
    args = ["export", str(run), "--out", str(out)]
    if case == "no_dir":
        args[1] = str(tmp_path / "nowhere")
    elif case == "no_report":
        (run / "report.json").unlink()
    elif case == "exists":
        out.write_text("mine")
    elif case == "other_task":
        task.write_text(TASK.replace("relu", "sigmoid"))
        args += ["--task", str(task)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("kfoundry: "), err
    assert expected in err[0], err
    if case == "exists":
        assert out.read_text() == "mine"
