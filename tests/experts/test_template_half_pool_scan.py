"""Pools and scans of float16 and bfloat16 tensors in the template expert: max and average pooling
(1d, 2d, adaptive) and cumsum / cumprod (along the last dim, a middle dim, reversed), each with
elementwise ops before and after, read as float32, accumulated in float32 and stored once in the
model's own type; checked against the reference under ``TRITON_INTERPRET=1`` with the epilogue
fused and, in small chunks, unfused; the rendered ``ModelNew`` allocates its outputs in the
reference's output types."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.experts.template import Plan, TemplateParams, Unsupported, analyse, default_params, render
from actors.experts.template.interp_check import finish_check, start_check
from actors.experts.template.ir import NodeKind
from gpu_runner.compare import PARITY_FACTOR

pytestmark = pytest.mark.timeout(300)

POOLS = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.scale = nn.Parameter(torch.rand(3, 1, 1, dtype=torch.{dtype}) + 0.5)

    def forward(self, x, z):
        y = torch.relu(x * self.scale)
        return (
            torch.sigmoid(self.pool(y)) + 0.5,
            F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False) * 2.0,
            F.adaptive_avg_pool2d(x, 1) - 1.0,
            F.max_pool1d(z * 3.0, 4, stride=3, padding=2, dilation=2),
            torch.tanh(F.avg_pool1d(z, 3, stride=2, padding=1)),
            F.adaptive_max_pool1d(z, 7),
        )

def get_inputs():
    return [torch.randn(2, 3, 10, 13, dtype=torch.{dtype}), torch.randn(3, 5, 21, dtype=torch.{dtype})]

def get_init_inputs():
    return []
"""

SCANS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return (
            torch.cumsum(x * 0.5, dim=1),
            torch.cumsum(x.flip(1), 1).flip(1) + 1.0,
            torch.cumprod(y, dim=1),
            torch.cumsum(torch.sigmoid(y), dim=-1) * 2.0,
        )

def get_inputs():
    return [torch.rand(4, 150, dtype=torch.{dtype}), torch.rand(3, 70, 5, dtype=torch.{dtype}) + 0.5]

def get_init_inputs():
    return []
"""

_SMALL = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_warps": 1, "pw_warps": 1, "pw_ept": 1}
"""Scans in chunks of 64 (a carry between chunks), pools one warp per program, nothing fused."""

_SMALL_TOO = {("pools", "bfloat16"), ("scans", "float16")}
"""The models also rendered with ``_SMALL`` (one type each, to keep the test short)."""

_TOL = {"float16": 1e-2, "bfloat16": 2e-2}
"""Against the half reference, as ``test_template_half``. Under ``TRITON_INTERPRET=1`` (Triton 3.x)
``.to(tl.bfloat16)`` truncates (the GPU rounds to nearest even): bfloat16 candidates err 2-2.6x
the reference here, so the precision-parity bar is checked in float16, where both round alike."""


def _plan(source: str) -> Plan:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return plan


def test_half_pools_and_scans_match_the_reference_under_the_interpreter(tmp_path: Path) -> None:
    jobs, labels = [], []
    for name, body in (("pools", POOLS), ("scans", SCANS)):
        for dtype, tol in _TOL.items():
            source = body.format(dtype=dtype)
            plan = _plan(source)
            epilogue, prologue = plan.fusions[-1]
            small = TemplateParams.from_dict({**_SMALL, "fuse_epilogue": epilogue, "fuse_prologue": prologue})
            variants = [("default", default_params(plan)), ("small", small)]
            for label, params in variants if (name, dtype) in _SMALL_TOO else variants[:1]:
                jobs.append({"reference": source, "candidate": render(plan, params), "seeds": [3],
                             "atol": tol, "rtol": tol})  # fmt: skip
                labels.append(f"{name}/{dtype}/{label}")
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    for label, verdict in zip(labels, verdicts, strict=True):
        assert verdict.ok, (label, verdict.detail)
        assert verdict.err_vs_fp64 is not None
        assert verdict.ref_err_vs_fp64 is not None
        if "bfloat16" not in label:  # the interpreter truncates float32 to bfloat16 (see _TOL)
            assert verdict.err_vs_fp64 <= max(PARITY_FACTOR * verdict.ref_err_vs_fp64, 1e-6), (label, verdict)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_pools_and_scans_keep_the_models_type(dtype: str) -> None:
    for body, kind in ((POOLS, NodeKind.POOL), (SCANS, NodeKind.SCAN)):
        source = body.format(dtype=dtype)
        plan = _plan(source)
        assert {n.dtype for n in plan.nodes if n.kind is kind} == {dtype}
        namespace: dict[str, object] = {}
        exec(compile(source, "<reference>", "exec"), namespace)  # the reference's own output types
        model, inputs = namespace["Model"](), namespace["get_inputs"]()  # type: ignore[operator]
        with torch.no_grad():
            wanted = [str(t.dtype).removeprefix("torch.") for t in model(*inputs)]
        assert [plan.nodes[i].dtype for i in plan.outputs] == wanted == [dtype] * len(wanted)
        forward = render(plan, default_params(plan)).split("def forward")[1]
        assert forward.count(f"dtype=torch.{dtype})") >= len(wanted)
        assert "dtype=torch.float32" not in forward


MIXED = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x, w):
        return torch.cumsum(x, dim=1) * w, F.max_pool1d(x, 2) + 1.0

def get_inputs():
    return [torch.randn(3, 4, 12, dtype=torch.bfloat16), torch.randn(12)]

def get_init_inputs():
    return []
"""


def test_a_half_scan_beside_float32_promotes_as_pytorch_does() -> None:
    plan = _plan(MIXED)
    scaled, pooled = (plan.nodes[i] for i in plan.outputs)
    assert (scaled.dtype, plan.nodes[scaled.tensor_args()[0]].dtype, pooled.dtype) == (
        "float32",
        "bfloat16",
        "bfloat16",
    )


def test_half_pooling_with_indices_is_still_declined() -> None:
    source = POOLS.format(dtype="float16").replace(
        "F.adaptive_max_pool1d(z, 7)", "F.max_pool1d(z, 2, return_indices=True)[0]"
    )
    got = analyse(source)
    assert isinstance(got, Unsupported)
    assert "with_indices" in got.detail
