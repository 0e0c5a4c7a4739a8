"""The template expert's op families are plug-ins: each is one module under ``families/`` that
registers its lowerings (``actors.experts.template.lowering``); the lowerer and the core ops never
import one by name, and a new op needs one module with its spelling and its lowering."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.experts.template import Plan, analyse, default_params, render, spellings
from actors.experts.template import lowering as registry
from actors.experts.template.lowering import LowerContext, lowering, registered
from actors.experts.template.spellings import Spec, spell

TEMPLATE = Path(registry.__file__).parent


def test_every_family_module_registers_its_ops() -> None:
    by_module = registered()
    families = {f"actors.experts.template.families.{p.stem}" for p in (TEMPLATE / "families").glob("[!_]*.py")}
    assert set(by_module.values()) == families
    for canon in ("conv", "conv_transpose", "max_pool", "sdpa", "mha", "cumsum", "mse_loss", "layer_norm", "norm"):
        assert canon in by_module


def test_the_lowerer_and_the_core_ops_import_no_family_by_name() -> None:
    for name in ("lower.py", "composites.py", "attn_pattern.py", "lowering.py", "keep_torch.py", "products.py"):
        tree = ast.parse((TEMPLATE / name).read_text())
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)] + [
            a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
        ]
        assert not [m for m in imported if ".families" in m], name


def test_an_op_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):

        @lowering("conv")
        def _other(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
            return None


SINH = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.sinh(x) * 2.0

def get_inputs():
    return [torch.randn(64, 128)]

def get_init_inputs():
    return []
"""


def test_a_new_op_is_one_spelling_and_one_lowering() -> None:
    """``torch.sinh`` (not covered) becomes a covered op with a spelling and a lowering written
    here, as a family module would hold them; it then renders as one elementwise kernel."""
    assert not isinstance(analyse(SINH), Plan)

    @lowering("sinh")
    def _sinh(lw: LowerContext, canon: str, b: dict[str, Any], traced: Any) -> object:
        x = lw.tensor(b["input"], canon)
        return lw.ew("mul", lw.ew("sub", lw.ew("exp", x), lw.ew("exp", lw.ew("neg", x))), 0.5)

    spell(Spec("sinh", (("input", spellings.REQUIRED),)), functions=(torch.sinh,), methods=("sinh",))
    try:
        plan = analyse(SINH)
        assert isinstance(plan, Plan), plan
        source = render(plan, default_params(plan))
        assert source.count("@triton.jit") == 2  # the kernel, and its run-time-sized copy (any_size.py)
        assert "def _kf_pw0_any(" in source
        assert "tl.exp" in source
    finally:
        registry._REGISTRY.pop("sinh", None)
        spellings.FUNCTIONS.pop(torch.sinh, None)
        spellings.METHODS.pop("sinh", None)
        spellings.METHODS.pop("sinh_", None)
    assert not isinstance(analyse(SINH), Plan)
