"""The template kernels on a CUDA GPU (Triton compiled for real): ``pytest -m gpu``.

Every test case at its small sizes and every example task at KernelBench sizes is rendered with
the default parameters, a multi-pass/small-tile configuration, seeded mutants and (for matrix
products) the ``tf32x3`` dot, then run on the GPU against the reference: parameters identical
under the same seed, outputs within 1e-4, error against float64 at most 8x the eager
reference's. A plain-TF32 dot must fail that precision bar (the bar can catch what it is for).
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, render
from tests.experts.template_cases import CASES

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_COUNTER = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _load(source: str, directory: Path) -> ModuleType:
    path = directory / f"kf_gpu_{next(_COUNTER)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm((a.double() - b.double()).flatten()) / torch.linalg.vector_norm(b.double()))


def _float64(model: torch.nn.Module, inputs: list[Any]) -> Any:
    """The model's output in float64 (its integer inputs kept), on the GPU where CUDA has a float64
    kernel for every op it runs and on the CPU where not (CUDA's ``nll_loss`` has none)."""

    def run(device: str) -> Any:
        args = [x.to(device, torch.float64) if x.is_floating_point() else x.to(device) for x in inputs]
        return model.to(device).double()(*args)

    try:
        return run("cuda")
    except (NotImplementedError, RuntimeError):
        return run("cpu").cuda()


def _run(reference: str, candidate: str, directory: Path) -> tuple[torch.Tensor, torch.Tensor, Any]:
    ref_mod, cand_mod = _load(reference, directory), _load(candidate, directory)
    torch.manual_seed(0)
    init = list(ref_mod.get_init_inputs())
    torch.manual_seed(0)
    ref = ref_mod.Model(*init).cuda()
    torch.manual_seed(0)
    new = cand_mod.ModelNew(*init).cuda()
    for (k1, v1), (k2, v2) in zip(ref.state_dict().items(), new.state_dict().items(), strict=True):
        assert k1 == k2
        assert torch.equal(v1, v2)
    torch.manual_seed(1)
    inputs = [x.cuda() for x in ref_mod.get_inputs()]
    with torch.no_grad():
        expected = ref(*inputs)
        actual = new(*inputs)
        exact = _float64(ref, inputs)
    torch.cuda.synchronize()
    return expected, actual, exact


def _assert_close(reference: str, candidate: str, directory: Path) -> None:
    expected, actual, exact = _run(reference, candidate, directory)
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    if not expected.is_floating_point():
        assert torch.equal(actual, expected)
        return
    # Element-wise against eager: 1e-4, or a few times eager's own worst error against float64
    # (long fp32 reductions, e.g. K=2048, round differently in cuBLAS and in a tiled kernel).
    eager_worst = float((expected.double() - exact).abs().max())
    torch.testing.assert_close(actual, expected, atol=max(1e-4, 4 * eager_worst), rtol=1e-4)
    err, ref_err = _rel_l2(actual, exact), _rel_l2(expected, exact)
    assert err <= max(8 * ref_err, 1e-6), (err, ref_err)


def _variants(plan: Plan) -> list[TemplateParams]:
    first = default_params(plan)
    out = [first]
    epilogue, prologue = plan.fusions[-1]
    out.append(
        first.with_changes(
            row_one_pass=False,
            row_block_r=64,
            row_block_m=2,
            row_block_i=8,
            pw_ept=1,
            mm_block_m=32,
            mm_block_n=32,
            mm_block_k=16,
            mm_warps=2,
            fuse_epilogue=epilogue,
            fuse_prologue=prologue,
        )
    )
    rng = np.random.default_rng(0)
    out += [mutate(plan, first, rng, diagnosis=None) for _ in range(2)]
    if "mm" in plan.template:
        out.append(first.with_changes(mm_precision="tf32x3"))
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_kernels_match_pytorch_on_the_gpu(case: Any, tmp_path: Path) -> None:
    for source in case.sources():
        plan = analyse(source)
        assert isinstance(plan, Plan)
        for params in _variants(plan):
            _assert_close(source, render(plan, params), tmp_path)


_TASKS = [*sorted((_EXAMPLES / "tasks").glob("*.py")), _EXAMPLES / "quickstart.py"]


@pytest.mark.parametrize("path", _TASKS, ids=lambda p: p.stem)
def test_example_task_kernels_match_pytorch_at_kernelbench_sizes(path: Path, tmp_path: Path) -> None:
    source = path.read_text()
    plan = analyse(source)
    assert isinstance(plan, Plan)
    for params in _variants(plan)[:3] + _variants(plan)[4:]:
        _assert_close(source, render(plan, params), tmp_path)


def test_a_plain_tf32_dot_fails_the_precision_bar(tmp_path: Path) -> None:
    source = (_EXAMPLES / "tasks" / "matmul_bias_gelu.py").read_text()
    plan = analyse(source)
    assert isinstance(plan, Plan)
    honest = render(plan, default_params(plan))
    tf32 = honest.replace('input_precision="ieee"', 'input_precision="tf32"')
    assert tf32 != honest
    expected, actual, exact = _run(source, tf32, tmp_path)
    assert _rel_l2(actual, exact) > 8 * _rel_l2(expected, exact)


_LAUNCH_SITES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 2.0


def get_inputs():
    return [torch.randn(2, 8, 20, 20)]


def get_init_inputs():
    return []
"""


def test_launch_sites_keep_their_compiled_kernels_only_while_the_specialisation_holds(tmp_path: Path) -> None:
    """After a site's first launch the kernel it compiled is launched directly (the same results);
    a misaligned input goes through ``triton.jit`` again (its own specialisation), and a model
    rendered without launch sites gives the same outputs."""
    plan = analyse(_LAUNCH_SITES)
    assert isinstance(plan, Plan)
    module = _load(render(plan, default_params(plan)), tmp_path)
    plain = _load(render(plan, default_params(plan), direct=False), tmp_path)
    ref = _load(_LAUNCH_SITES, tmp_path)
    sites = [v for k, v in vars(module).items() if k.startswith("_L_kf_")]
    assert sites
    torch.manual_seed(0)
    model = ref.Model().cuda()
    torch.manual_seed(0)
    new = module.ModelNew().cuda()
    torch.manual_seed(0)
    old = plain.ModelNew().cuda()
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 8, 20, 20, device="cuda")
            want = model(x)
            got = new(x)
            assert _rel_l2(got, want) < 1e-3, step
            assert torch.equal(got, old(x))
        assert all(site.ck is not None and site.where == torch.cuda.current_device() for site in sites)
        base = torch.randn(2 * 8 * 20 * 20 + 1, device="cuda")
        shifted = base[1:].view(2, 8, 20, 20)  # 4 bytes past an aligned start
        assert shifted.data_ptr() % 16
        assert _rel_l2(new(shifted), model(shifted)) < 1e-3


_DEPTHWISE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d({c}, {c}, {k}, stride={s}, padding={p}, groups={c}, bias=False)
        self.bn = nn.BatchNorm2d({c})

    def forward(self, x):
        return torch.clamp(self.bn(self.conv(x)), 0.0, 6.0)


def get_inputs():
    return [torch.rand({n}, {c}, {h}, {h})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    ("c", "k", "s", "h", "n"), [(144, 5, 2, 56, 2), (240, 5, 1, 28, 10), (96, 3, 2, 112, 2), (480, 3, 1, 14, 10)]
)
def test_depthwise_convolutions_in_long_tiles_match_pytorch(
    c: int, k: int, s: int, h: int, n: int, tmp_path: Path
) -> None:
    """EfficientNet's depthwise convolutions with their norm, in the 1024-row tiles the H200 model
    picks for outer products: on Triton 3.6 a ``[1024, 1]`` tile of a 5x5, stride-2 depthwise
    convolution came out wrong in every channel (KernelBench L3-22), so one output channel's tile
    is a vector (``ConvWriter.one_channel``)."""
    from actors.experts.template.hardware import lookup

    reference = _DEPTHWISE.format(c=c, k=k, s=s, p=k // 2, h=h, n=n)
    plan = analyse(reference)
    assert isinstance(plan, Plan)
    first = default_params(plan, lookup("H200"))
    tiles = [(64, 128, 4), (16, 16, 4), (16, 16, 2), (32, 4, 4)]  # 1024, 256, 256 and 128 rows
    for params in [first] + [first.with_changes(conv_block_m=m, conv_block_n=n, conv_warps=w) for m, n, w in tiles]:
        candidate = render(plan, params)
        assert "acc = tl.zeros((BLOCK_M,), dtype=tl.float32)" in candidate
        _assert_close(reference, candidate, tmp_path)
