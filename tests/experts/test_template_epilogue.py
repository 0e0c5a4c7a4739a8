"""Fused epilogues that stay cheap in registers and instructions: operands read along one axis of
a product or convolution tile load as vectors and broadcast, and Mish costs one exp and one
division, at PyTorch's accuracy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.experts.template import Plan, TemplateParams, analyse, render
from actors.experts.template.exprs import HELPERS
from actors.experts.template.interp_check import check_in_subprocess

pytestmark = pytest.mark.timeout(180)

CONV_BIAS = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3)
        self.bias = nn.Parameter(torch.randn(32, 1, 1))

    def forward(self, x):
        return F.mish(self.conv(x) + self.bias)

def get_inputs():
    return [torch.randn(2, 8, 12, 12)]

def get_init_inputs():
    return []
"""

LINEAR_BIAS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 48)
        self.shift = nn.Parameter(torch.randn(48))

    def forward(self, x):
        return torch.relu(self.fc(x) - self.shift)

def get_inputs():
    return [torch.randn(16, 64)]

def get_init_inputs():
    return []
"""


def _rendered(source: str) -> str:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return render(plan, TemplateParams())


def test_a_convolution_reads_per_channel_operands_once_per_tile_column() -> None:
    text = _rendered(CONV_BIAS)
    loads = [line.strip() for line in text.splitlines() if "tl.load(" in line and line.strip().startswith("l")]
    assert loads, text
    assert all(line.endswith("[None, :]") and "mask=nmask" in line for line in loads), loads
    assert not any("co[None, :], mask=cmask" in line for line in text.splitlines())


def test_a_product_reads_its_bias_once_per_tile_column() -> None:
    text = _rendered(LINEAR_BIAS)
    loads = [line.strip() for line in text.splitlines() if "tl.load(" in line and "+ rn," in line]
    assert loads, text
    assert all(line.endswith("[None, :]") and "(rn < 48)" in line for line in loads), loads


MISH_SCRIPT = """
import sys, torch, triton, triton.language as tl
ns = {"triton": triton, "tl": tl}
exec(sys.stdin.read(), ns)
exec('''
@triton.jit
def k(x_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(o_ptr + offs, _kf_mish(tl.load(x_ptr + offs)))
''', ns)
edges = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 19.99, 20.0, 20.01, 88.0, 89.0, -87.0, -104.0]
edges = torch.tensor(edges)
x = torch.cat([torch.linspace(-110, 110, 2000), torch.linspace(-1, 1, 2084), edges])
assert x.numel() == 4096
out = torch.empty_like(x)
ns["k"][(1,)](x, out, N=4096)
want = torch.nn.functional.mish(x.double())
normal = torch.isfinite(want) & (want.abs() > 1e-37)  # float32's normal range: relative error means something
rel = ((out.double() - want).abs() / want.abs())[normal].max().item()
ours = torch.nn.functional.mish(x)
torch_rel = ((ours.double() - want).abs() / want.abs())[normal].max().item()
special = ~normal
same_special = bool(torch.equal(torch.isnan(out[special]), torch.isnan(ours[special])))
same_special &= bool(torch.allclose(out[special], ours[special], atol=1e-37, rtol=0, equal_nan=True))
print(rel, torch_rel, same_special, flush=True)
"""


def test_mish_in_one_exp_matches_pytorch_to_its_own_rounding() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", MISH_SCRIPT],
        input=textwrap.dedent(HELPERS["_kf_mish"]),
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    rel, torch_rel, same = done.stdout.split()
    # within twice PyTorch's own float32 error against float64 (a few ulp), with NaN, infinities
    # and signed zeros where PyTorch has them
    assert float(rel) <= max(2 * float(torch_rel), 4e-7), (rel, torch_rel)
    assert same == "True"


def test_mish_renders_without_the_softplus_and_tanh_helpers() -> None:
    text = _rendered(CONV_BIAS)
    assert "_kf_mish(" in text
    assert "_kf_softplus" not in text
    assert "_kf_tanh" not in text


def test_the_epilogue_cases_are_checked_under_the_interpreter(tmp_path: Path) -> None:
    jobs = [
        {"reference": source, "candidate": _rendered(source), "seeds": [0, 1], "atol": 1e-4, "rtol": 1e-4}
        for source in (CONV_BIAS, LINEAR_BIAS)
    ]
    verdicts = check_in_subprocess(jobs, tmp_path)
    assert all(v.ok for v in verdicts), verdicts
