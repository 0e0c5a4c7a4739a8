"""Half-precision models in the template expert: float16 and bfloat16 inputs and parameters through
elementwise ops, reductions and norms, computed in float32 and stored in the model's own type,
checked against the reference under ``TRITON_INTERPRET=1``; what it does not cover in half
(matrix products, convolutions) is declined with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.interp_check import finish_check, start_check

BODY = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(70, dtype=torch.{dtype}))

    def forward(self, x, y):
        z = torch.relu(x * self.scale + y)
        return torch.softmax(z, dim=-1), z.sum(dim=1), torch.nn.functional.layer_norm(x, (70,))

def get_inputs():
    return [torch.randn(33, 70, dtype=torch.{dtype}), torch.randn(33, 70, dtype=torch.{dtype})]

def get_init_inputs():
    return []
"""

MIXED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        # bfloat16 with float32: float32, as PyTorch promotes (its sigmoid rounded to bfloat16 first,
        # the candidate's not: within bfloat16's tolerance, and nearer float64)
        return torch.sigmoid(x) + y

def get_inputs():
    return [torch.randn(17, 40, dtype=torch.bfloat16), torch.randn(17, 40)]

def get_init_inputs():
    return []
"""

LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32).to(torch.bfloat16)

    def forward(self, x):
        return self.fc(x)

def get_inputs():
    return [torch.randn(8, 64, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
"""


def test_half_models_render_and_match_the_reference_under_the_interpreter(tmp_path: Path) -> None:
    jobs = []
    for source, tol in ((BODY.format(dtype="bfloat16"), 2e-2), (BODY.format(dtype="float16"), 1e-2), (MIXED, 1e-2)):
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [3, 4],
                     "atol": tol, "rtol": tol})  # fmt: skip
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=600)
    for verdict in verdicts:
        assert verdict.ok, verdict.detail


def test_half_outputs_keep_the_models_type() -> None:
    plan = analyse(BODY.format(dtype="bfloat16"))
    assert isinstance(plan, Plan)
    assert "dtype=torch.bfloat16" in render(plan, default_params(plan))
    mixed = analyse(MIXED)
    assert isinstance(mixed, Plan)
    assert "dtype=torch.bfloat16" not in render(mixed, default_params(mixed)).split("def forward")[1]


@pytest.mark.parametrize("source", [LINEAR])
def test_half_products_are_declined_with_the_reason(source: str) -> None:
    got = analyse(source)
    assert not isinstance(got, Plan)
    assert "float16/bfloat16" in str(got)
