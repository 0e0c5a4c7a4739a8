"""Elementwise models at any input shape (issue 38 item 1, its first family): the template writes
its kernels for the reference's shapes and, for a model elementwise from end to end, run-time-sized
copies that ``forward`` calls at any other shape. Checked under Triton's interpreter against the
reference at shapes the run never saw (odd, one element, another rank, empty), and what is refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from actors.experts.template.ir import Unsupported
from actors.experts.template.params import TemplateParams
from actors.experts.template.render import analyse, render

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
SHAPES = [(5, 3), (1, 1), (7, 33, 2), (0, 4), (3, 1025)]


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _load(source: str, path: Path) -> ModuleType:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # triton.jit reads the kernels' source through their module
    spec.loader.exec_module(module)
    return module


def _reference(source: str) -> dict[str, object]:
    ns: dict[str, object] = {}
    exec(compile(source, "reference.py", "exec"), ns)  # the test's own task files
    return ns


@pytest.mark.parametrize(
    "task", ["swish_hardtanh_mish", "relu_scale_residual", "elu_selu_softplus_hardswish", "mingpt_new_gelu"]
)
def test_an_elementwise_model_is_correct_at_shapes_the_run_never_saw(task: str, tmp_path: Path) -> None:
    source = (TASKS / f"{task}.py").read_text()
    plan = analyse(source)
    assert not isinstance(plan, Unsupported)
    rendered = render(plan, TemplateParams())
    assert "def _kf_any_size(self" in rendered
    module = _load(rendered, tmp_path / f"kf_any_{task}.py")
    ns = _reference(source)
    init = list(ns["get_init_inputs"]())  # type: ignore[operator]
    reference, candidate = ns["Model"](*init), module.ModelNew(*init)  # type: ignore[operator]
    arity = len(list(ns["get_inputs"]()))  # type: ignore[operator]
    torch.manual_seed(0)
    for shape in SHAPES:
        inputs = [torch.randn(*shape) for _ in range(arity)]
        got, want = candidate(*inputs), reference(*inputs)
        assert got.shape == want.shape, shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{task} at {shape}")


def test_what_the_any_shape_path_refuses_and_what_stays_specialised(tmp_path: Path) -> None:
    source = (TASKS / "relu_scale_residual.py").read_text()
    module = _load(render(analyse(source), TemplateParams()), tmp_path / "kf_any_refuse.py")  # type: ignore[arg-type]
    model = module.ModelNew(1.5)
    with pytest.raises(ValueError, match=r"^residual has shape \(3, 6\): dimension 1 is 6, not 5\. This ModelNew "):
        model(torch.randn(3, 5), torch.randn(3, 6))  # broadcasting is not taken
    with pytest.raises(ValueError, match=r"^x is float64, not float32\. This ModelNew takes inputs of any shape"):
        model(torch.randn(3, 5).double(), torch.randn(3, 5))
    # not elementwise throughout (a product): any batch (its one free size, ``any_sizes.py``), a
    # clear refusal elsewhere
    linear = render(analyse((ROOT / "examples" / "quickstart.py").read_text()), TemplateParams())  # type: ignore[arg-type]
    assert "def _kf_any_size(self" not in linear
    quick = _load(linear, tmp_path / "kf_any_linear.py").ModelNew(256, 256)
    with pytest.raises(ValueError, match=r"^x has shape \(23, 100\): dimension 1 is 100, not 256\. .* any batch_size;"):
        quick(torch.randn(23, 100))
