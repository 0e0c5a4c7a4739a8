"""Half-precision models in the template expert: float16 and bfloat16 inputs and parameters through
elementwise ops, reductions and norms, computed in float32 and stored in the model's own type,
and matrix products (half operands straight into ``tl.dot``, summed in float32), checked against the
reference under ``TRITON_INTERPRET=1``. Pools and scans of half tensors: ``test_template_half_pool_scan``."""

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


PRODUCT = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn({n}, dtype=torch.{dtype}))

    def forward(self, x, w):
        return torch.relu({product} + self.bias) * 0.5

def get_inputs():
    return [torch.randn({x_shape}, dtype=torch.{dtype}), torch.randn({w_shape}, dtype=torch.{dtype})]

def get_init_inputs():
    return []
"""

HALF_PRODUCTS = [
    (LINEAR, 2e-2),
    (PRODUCT.format(n=40, product="x @ w", x_shape="37, 96", w_shape="96, 40", dtype="float16"), 1e-2),
    (PRODUCT.format(n=24, product="x @ w.transpose(-1, -2)", x_shape="3, 20, 72", w_shape="3, 24, 72",
                    dtype="bfloat16"), 2e-2),
    (PRODUCT.format(n=1, product="x @ w", x_shape="9, 130", w_shape="130, 1", dtype="bfloat16"), 2e-2),
]  # fmt: skip
"""Half matrix products: a bfloat16 ``Linear``, a float16 product with an epilogue, a batched
bfloat16 product of a transposed operand, and a bfloat16 matrix-vector product."""


def test_half_products_render_and_match_the_reference_under_the_interpreter(tmp_path: Path) -> None:
    jobs = []
    for source, tol in HALF_PRODUCTS:
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [5],
                     "atol": tol, "rtol": tol})  # fmt: skip
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=600)
    for verdict in verdicts:
        assert verdict.ok, verdict.detail


def test_half_products_reach_the_tensor_cores_as_they_are() -> None:
    """On a GPU ``tl.dot`` takes the half operands as they are, 64 of K per step; only the
    interpreter (whose bfloat16 products are wrong) widens them, through ``_KF_INTERPRETED``."""
    plan = analyse(HALF_PRODUCTS[1][0])
    assert isinstance(plan, Plan)
    params = default_params(plan)
    assert params.mm_block_k == 64
    source = render(plan, params)
    assert "tl.dot(a.to(tl.float32) if WIDE else a, b.to(tl.float32) if WIDE else b, acc)" in source
    assert "_KF_INTERPRETED = int(not isinstance(" in source
    assert "WIDE=_KF_INTERPRETED" in source
    assert "dtype=torch.float16" in source.split("def forward")[1]


CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.{cls}({cin}, {cout}, 3, {extra}).to(torch.{dtype})

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5

def get_inputs():
    return [torch.randn({x_shape}, dtype=torch.{dtype})]

def get_init_inputs():
    return []
"""

HALF_CONVS = [
    (CONV.format(cls="Conv2d", cin=16, cout=32, extra="padding=1", x_shape="2, 16, 9, 9", dtype="bfloat16"), 2e-2),
    (CONV.format(cls="Conv1d", cin=8, cout=8, extra="groups=8", x_shape="3, 8, 40", dtype="float16"), 1e-2),
    (CONV.format(cls="ConvTranspose2d", cin=16, cout=16, extra="stride=2, padding=1", x_shape="2, 16, 5, 6",
                 dtype="bfloat16"), 2e-2),
    (CONV.format(cls="Conv2d", cin=4, cout=16, extra="", x_shape="2, 4, 8, 8", dtype="float16"), 1e-2),
]  # fmt: skip
"""Half convolutions: a bfloat16 2-D one in ``tl.dot`` (taps outside), a float16 depthwise one
(outer products, widened), a bfloat16 strided transposed one (stride phases) and a float16 one of
4 input channels (the flat order)."""


@pytest.mark.slow  # ~2 s on a 2-core host; the default run keeps the half models and products
def test_half_convolutions_render_and_match_the_reference_under_the_interpreter(tmp_path: Path) -> None:
    jobs = []
    for source, tol in HALF_CONVS:
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        first = default_params(plan)
        for params in (first, first.with_changes(conv_layout="nhwc")):
            candidate = render(plan, params)
            assert "WIDE=_KF_INTERPRETED" in candidate or "tl.dot" not in candidate
            jobs.append({"reference": source, "candidate": candidate, "seeds": [6], "atol": tol, "rtol": tol})
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=600)
    for verdict in verdicts:
        assert verdict.ok, verdict.detail
