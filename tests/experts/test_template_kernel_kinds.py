"""The template expert's kernel kinds are plug-ins: each registers a ``KernelTemplate`` (its writer,
first parameters, the parameters that matter and how they answer a diagnosis) from one module;
the renderer and the tuner ask the registry and name no kind."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from actors.experts.template import Plan, analyse, default_params, mutate, relevant_params, render
from actors.experts.template import kernel_kinds as registry
from actors.experts.template.emit import Launch, PointwiseWriter
from actors.experts.template.fuse import KernelKind, schedule
from actors.experts.template.kernel_kinds import register, template_of, templates
from actors.experts.template.params import TemplateParams
from schemas.enums import DiagnosisCategory
from tests.experts.template_attn_cases import ATTN_CASES

TEMPLATE = Path(registry.__file__).parent


def test_every_kernel_kind_but_torch_has_one_template_from_its_own_module() -> None:
    by_kind = {t.kind: t for t in templates()}
    assert set(by_kind) == set(KernelKind) - {KernelKind.TORCH}
    assert template_of(KernelKind.TORCH) is None
    homes = {k.value: by_kind[k].defaults.__module__.rsplit(".", 2)[-2:] for k in by_kind}
    assert homes == {
        "pw": ["kernels", "pw"],
        "row": ["kernels", "row"],
        "mm": ["kernels", "mm"],
        "conv": ["kernels", "conv"],
        "pool": ["kernels", "pool"],
        "scan": ["families", "scan"],
        "attn": ["families", "attention"],
        "rec": ["families", "recurrent"],
    }


def test_the_renderer_and_the_tuner_name_no_kind() -> None:
    for name in ("render.py", "tuning.py", "kernel_kinds.py"):
        tree = ast.parse((TEMPLATE / name).read_text())
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [m for m in imported if ".kernels" in m or ".families" in m or ".emit_" in m], name
        # ``torch`` is no kernel (the reference's own op between kernels): the renderer skips it
        assert not re.search(r"KernelKind\.(?!TORCH\b)", (TEMPLATE / name).read_text()), name


def test_a_kind_registered_twice_is_refused() -> None:
    held = template_of(KernelKind.POOL)
    assert held is not None
    assert register(held) is held  # the same template again is no conflict (a module imported twice)
    with pytest.raises(ValueError, match="registered twice"):
        register(replace(held, relevant=lambda plan, sched, kernel, params: []))


SCALE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 3.0 + 1.0

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
"""


def test_a_kind_s_template_is_what_starts_renders_and_steps_its_kernels() -> None:
    """Swapping the elementwise kind's template (as a module registering another would) changes
    the first parameters, the kernel's source and what mutation steps, with no other edit."""
    plan = analyse(SCALE)
    assert isinstance(plan, Plan), plan
    assert relevant_params(plan, default_params(plan)) == ("pw_warps", "pw_ept")
    held = registry._REGISTRY[KernelKind.PW]

    assert held.writer is PointwiseWriter

    class Wide(PointwiseWriter):
        def write(self) -> Launch:
            launch = super().write()
            return replace(launch, source="# a wide elementwise kernel\n" + launch.source)

    registry._REGISTRY[KernelKind.PW] = replace(
        held,
        writer=Wide,
        defaults=lambda plan, sched, kernel, values: {"pw_warps": 2, "pw_ept": 16},
        relevant=lambda plan, sched, kernel, params: ["pw_warps"],
    )
    try:
        params = default_params(plan)
        assert (params.pw_warps, params.pw_ept) == (2, 16)
        assert "# a wide elementwise kernel" in render(plan, params)
        assert relevant_params(plan, params) == ("pw_warps",)
        stepped = mutate(plan, params, np.random.default_rng(0), diagnosis=DiagnosisCategory.SLOW_MEMORY_BOUND)
        assert stepped.pw_ept == 16
        assert stepped.pw_warps != 2
    finally:
        registry._REGISTRY[KernelKind.PW] = held
    assert "# a wide elementwise kernel" not in render(plan, default_params(plan))


def test_kernels_left_to_pytorch_add_no_parameters_to_step() -> None:
    """A multi-head attention keeps its layout steps in PyTorch (``torch`` kernels): they have no
    template, so mutation never spends a step on parameters no kernel of the plan reads (the row
    kernels' parameters were stepped for them before kinds were plug-ins)."""
    case = next(c for c in ATTN_CASES if c.name == "multihead_cross_attention_batch_first_no_bias")
    plan = analyse(case.sources()[0])
    assert isinstance(plan, Plan), plan
    kinds = {k.kind for k in schedule(plan, TemplateParams()).kernels}
    assert KernelKind.TORCH in kinds
    assert KernelKind.ROW not in kinds
    names = relevant_params(plan, default_params(plan))
    assert not [n for n in names if n.startswith("row_")]
    assert {n.split("_")[0] for n in names} == {"mm", "attn"}
