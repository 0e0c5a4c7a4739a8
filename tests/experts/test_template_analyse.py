"""The template expert's pure parts: analysis, declines, parameters, header, mutation."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.experts.template import (
    Plan,
    TemplateParams,
    Unsupported,
    analyse,
    default_params,
    mutate,
    params_from_source,
    relevant_params,
    render,
)
from actors.experts.template.errors import InvalidParams
from actors.experts.template.params import SPACE
from schemas import DiagnosisCategory
from tests.experts.template_cases import CASES, UNSUPPORTED

_BY_NAME = {c.name: c for c in CASES}


def _plan(name: str, size: int = 0) -> tuple[str, Plan]:
    source = _BY_NAME[name].sources()[size]
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return source, plan


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_uncovered_references_are_declined_with_a_reason(name: str) -> None:
    result = analyse(UNSUPPORTED[name])
    assert isinstance(result, Unsupported)
    assert len(result.detail) > 10


def test_decline_names_the_uncovered_module() -> None:
    result = analyse(UNSUPPORTED["conv_reflect_padding"])
    assert isinstance(result, Unsupported)
    assert "padding_mode='reflect'" in result.detail


def test_analysis_neither_allocates_real_tensors_nor_moves_the_global_rng() -> None:
    state = torch.get_rng_state()
    _, plan = _plan("gemm_groupnorm_swish")
    assert torch.equal(state, torch.get_rng_state())
    assert plan.template == "mm+row"


def test_header_round_trips_template_and_params() -> None:
    _, plan = _plan("bmm_scale_softmax")
    params = mutate(plan, default_params(plan), np.random.default_rng(5), diagnosis=None)
    source = render(plan, params)
    assert source.startswith("# kf-template: {")
    found = params_from_source(source)
    assert found == (plan.template, params)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nclass ModelNew: pass\n",
        '# kf-template: {"template": "pw", "params": {"pw_warps": 3}}\n',
        '# kf-template: {"template": "pw", "params": {"no_such_param": 1}}\n',
        "# kf-template: {not json}\n",
        '# kf-template: {"params": {}}\n',
    ],
)
def test_params_from_source_returns_none_for_foreign_or_broken_headers(source: str) -> None:
    assert params_from_source(source) is None


def test_params_outside_the_space_fail_loudly_naming_the_value() -> None:
    with pytest.raises(InvalidParams) as info:
        TemplateParams(pw_warps=3)
    assert info.value.name == "pw_warps"
    assert "3" in str(info.value)
    with pytest.raises(InvalidParams, match="shared memory"):
        TemplateParams(mm_block_m=256, mm_block_n=256, mm_block_k=128, mm_stages=5, mm_warps=16)
    with pytest.raises(InvalidParams, match="unknown parameter"):
        TemplateParams.from_dict({"tile": 4})


def test_every_space_value_is_a_valid_default_neighbour() -> None:
    base = TemplateParams()
    for name, values in SPACE.items():
        for value in values:
            try:
                params = base.with_changes(**{name: value})
            except InvalidParams:
                continue
            assert getattr(params, name) == value


@pytest.mark.parametrize("name", ["act_modules", "softmax_scale", "gemm_groupnorm_swish", "reduce_middle"])
def test_mutation_changes_only_relevant_params_and_stays_valid(name: str) -> None:
    _, plan = _plan(name)
    rng = np.random.default_rng(0)
    parent = default_params(plan)
    relevant = set(relevant_params(plan, parent))
    seen = set()
    for _ in range(40):
        child = mutate(plan, parent, rng, diagnosis=None)
        assert child != parent
        changed = {k for k, v in child.as_dict().items() if v != parent.as_dict()[k]}
        assert changed <= relevant
        assert (child.fuse_epilogue, child.fuse_prologue) in plan.fusions
        seen.add(child)
    assert len(seen) > 5


def test_mutation_is_deterministic_under_a_seed() -> None:
    _, plan = _plan("gemm_mean_softmax")
    parent = default_params(plan)

    def walk(seed: int) -> list[TemplateParams]:
        rng = np.random.default_rng(seed)
        return [mutate(plan, parent, rng, diagnosis=None) for _ in range(10)]

    assert walk(3) == walk(3)
    assert walk(3) != walk(4)


def test_out_of_resources_diagnosis_shrinks_tiles() -> None:
    _, plan = _plan("linear_relu")
    parent = default_params(plan).with_changes(mm_block_m=128, mm_block_n=128, mm_block_k=64, mm_warps=8)
    rng = np.random.default_rng(1)
    for _ in range(20):
        child = mutate(plan, parent, rng, diagnosis=DiagnosisCategory.COMPILE_RESOURCES)
        for key in ("mm_block_m", "mm_block_n", "mm_block_k", "mm_stages"):
            assert getattr(child, key) <= getattr(parent, key)


def test_compute_bound_diagnosis_moves_matmul_params_only() -> None:
    _, plan = _plan("gemm_mean_softmax")
    parent = default_params(plan)
    rng = np.random.default_rng(2)
    for _ in range(20):
        child = mutate(plan, parent, rng, diagnosis=DiagnosisCategory.SLOW_COMPUTE_BOUND)
        changed = {k for k, v in child.as_dict().items() if v != parent.as_dict()[k]}
        assert changed
        assert all(k.startswith("mm_") for k in changed)


def test_launch_bound_diagnosis_fuses_an_unfused_parent() -> None:
    _, plan = _plan("gemm_mean_softmax")
    parent = default_params(plan).with_changes(fuse_epilogue=False)
    child = mutate(plan, parent, np.random.default_rng(0), diagnosis=DiagnosisCategory.SLOW_LAUNCH_BOUND)
    assert child.fuse_epilogue


def test_default_params_keep_short_rows_in_registers() -> None:
    _, plan = _plan("softmax_scale", 1)
    params = default_params(plan)
    assert params.row_one_pass
    source = render(plan, params)
    assert "for r0 in range" not in source
    multi = render(plan, params.with_changes(row_one_pass=False, row_block_r=64))
    assert multi.count("for r0 in range") == 2  # max and sum (online), output


def test_fp32_products_use_ieee_dot_by_default() -> None:
    _, plan = _plan("linear_relu")
    source = render(plan, default_params(plan))
    assert 'input_precision="ieee"' in source
    assert 'input_precision="tf32x3"' in render(plan, default_params(plan).with_changes(mm_precision="tf32x3"))


_ALLOWED_FORWARD_CALLS = {"tuple", "ValueError", "_kf_refuse", "_kf_any_size", "contiguous", "empty", "view"}
"""``_kf_refuse`` builds the error an input of another shape or dtype gets (raised, never computed with);
``_kf_any_size`` runs an elementwise model's run-time-sized kernels at another shape."""


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_forward_only_allocates_and_launches_kernels(name: str) -> None:
    source, plan = _plan(name)
    rendered = render(plan, default_params(plan))
    tree = ast.parse(rendered)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    kernels = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for call in (n for n in ast.walk(forward) if isinstance(n, ast.Call)):
        func = call.func
        if isinstance(func, ast.Subscript):  # kernel[grid](...)
            assert isinstance(func.value, ast.Name)
            assert func.value.id in kernels
        elif isinstance(func, ast.Attribute):
            assert func.attr in _ALLOWED_FORWARD_CALLS, ast.unparse(call)
        else:
            assert isinstance(func, ast.Name)
            site = func.id.startswith("_L") and func.id[2:] in kernels  # a kernel's launch site
            assert func.id in _ALLOWED_FORWARD_CALLS or site or func.id == "_kf_stream", ast.unparse(call)
    assert not any(isinstance(n, ast.Try) for n in ast.walk(tree))
    for forbidden in ("torch.compile", "exec(", "import os", "allow_tf32"):
        assert forbidden not in rendered
    init = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    reference_init = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    assert len(init.body) == len(reference_init.body)


_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted((_EXAMPLES / "tasks").glob("*.py")), ids=lambda p: p.stem)
def test_example_tasks_are_covered_at_kernelbench_sizes(path: Path) -> None:
    plan = analyse(path.read_text())
    assert isinstance(plan, Plan), plan
    biggest = max(math.prod(n.shape) for n in plan.inputs)
    assert biggest >= 1 << 16


def test_there_are_enough_example_tasks_and_a_small_quickstart() -> None:
    tasks = {p.stem: analyse(p.read_text()) for p in (_EXAMPLES / "tasks").glob("*.py")}
    assert len(tasks) >= 12
    templates = {plan.template for plan in tasks.values() if isinstance(plan, Plan)}
    assert {"pw", "row", "mm", "mm+row"} <= templates
    quick = analyse((_EXAMPLES / "quickstart.py").read_text())
    assert isinstance(quick, Plan)
    assert max(math.prod(n.shape) for n in quick.inputs) <= 1 << 15


NO_INIT = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 0.5

def get_inputs():
    return [torch.randn(37, 129), torch.randn(37, 129)]

def get_init_inputs():
    return []
"""


@pytest.mark.timeout(120)
def test_a_model_without_its_own_init_is_covered_and_renders_a_correct_kernel(tmp_path: Path) -> None:
    """A reference class with only ``forward`` (nn.Module's own ``__init__``) is KernelBench-valid:
    it was declined ("Model has no __init__ of its own")."""
    from actors.experts.template.interp_check import check_in_subprocess

    plan = analyse(NO_INIT)
    assert isinstance(plan, Plan), plan
    candidate = render(plan, default_params(plan))
    verdict = check_in_subprocess(
        [{"reference": NO_INIT, "candidate": candidate, "seeds": [3], "atol": 1e-5, "rtol": 1e-5}], tmp_path
    )[0]
    assert verdict.ok, verdict


def _einsum_source(equation: str, a: tuple[int, ...], b: tuple[int, ...]) -> str:
    return f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A, B):
        return torch.einsum("{equation}", A, B)

def get_inputs():
    return [torch.randn{a}, torch.randn{b}]

def get_init_inputs():
    return []
"""


@pytest.mark.timeout(240)
def test_einsums_that_are_matrix_products_render_correct_kernels(tmp_path: Path) -> None:
    """KernelBench writes a 4D tensor-matrix product as ``einsum("bijl,lk->bijk")``: it was declined."""
    from actors.experts.template.interp_check import check_in_subprocess

    cases = [
        ("bijl,lk->bijk", (2, 3, 5, 7), (7, 9)),
        ("bijl,kl->bijk", (2, 3, 5, 7), (9, 7)),
        ("bmc,bcn->bmn", (3, 5, 7), (3, 7, 9)),
    ]
    jobs = []
    for equation, a, b in cases:
        source = _einsum_source(equation, a, b)
        plan = analyse(source)
        assert isinstance(plan, Plan), (equation, plan)
        jobs.append(
            {
                "reference": source,
                "candidate": render(plan, default_params(plan)),
                "seeds": [4],
                "atol": 1e-4,
                "rtol": 1e-4,
            }
        )
    verdicts = check_in_subprocess(jobs, tmp_path)
    assert [v.ok for v in verdicts] == [True] * len(cases), verdicts


@pytest.mark.parametrize(
    ("equation", "a", "b"),
    [("ii,i->i", (3, 3), (3,)), ("...ij,jk->...ik", (2, 3, 4), (4, 5))],  # a diagonal, an ellipsis
)
def test_other_einsums_are_declined_naming_the_equation(equation: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    plan = analyse(_einsum_source(equation, a, b))
    assert isinstance(plan, Unsupported)
    assert equation in plan.detail


SCALAR_ARG = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, s: float) -> torch.Tensor:
        return A * s + s

def get_inputs():
    return [torch.randn(33, 65), 3.14]

def get_init_inputs():
    return []
"""


@pytest.mark.timeout(120)
def test_a_python_float_argument_is_read_at_run_time(tmp_path: Path) -> None:
    """KernelBench L1-5 passes its scalar as a Python float: it was declined. The number is read at
    each call (not baked in), so another value gives the right answer too."""
    from actors.experts.template.interp_check import check_in_subprocess

    plan = analyse(SCALAR_ARG)
    assert isinstance(plan, Plan), plan
    candidate = render(plan, default_params(plan))
    assert "3.14" not in candidate
    other = SCALAR_ARG.replace("3.14", "-0.5")
    verdicts = check_in_subprocess(
        [
            {"reference": SCALAR_ARG, "candidate": candidate, "seeds": [2], "atol": 1e-5, "rtol": 1e-5},
            {"reference": other, "candidate": candidate, "seeds": [2], "atol": 1e-5, "rtol": 1e-5},
        ],
        tmp_path,
    )
    assert [v.ok for v in verdicts] == [True, True], verdicts
