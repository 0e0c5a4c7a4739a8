"""The template's sine and cosine (``families/trig.py``) against float64, under the Triton
interpreter: sweeps over several ranges of ``|x|``, and NaN for NaN and infinities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.experts.template.exprs import helpers_source
from actors.experts.template.lowering import load_families

ROOT = Path(__file__).resolve().parents[2]

_SWEEP = """
import json
import torch
import triton


@triton.jit
def _kernel(x_ptr, s_ptr, c_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    tl.store(s_ptr + i, _kf_sin(x), mask=m)
    tl.store(c_ptr + i, _kf_cos(x), mask=m)


def run(x):
    s, c = torch.empty_like(x), torch.empty_like(x)
    block = 1 << 16
    _kernel[(triton.cdiv(x.numel(), block),)](x, s, c, x.numel(), BLOCK=block)
    return s, c


gen = torch.Generator().manual_seed(0)
errors = {}
for limit in (4.0, 1000.0, 1e6):
    x = torch.cat([torch.linspace(-limit, limit, 100001), (torch.rand(50000, generator=gen) * 2 - 1) * limit])
    s, c = run(x.float())
    exact = x.float().double()
    errors[str(limit)] = [
        (s.double() - exact.sin()).abs().max().item(),
        (c.double() - exact.cos()).abs().max().item(),
        (torch.sin(x.float()).double() - exact.sin()).abs().max().item(),
    ]
odd = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1e-30])
s, c = run(odd)
print(json.dumps({"errors": errors, "odd_sin": s.tolist(), "odd_cos": c.tolist()}))
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    load_families()
    module = tmp_path_factory.mktemp("trig") / "sweep.py"
    module.write_text(
        "import triton\nimport triton.language as tl\n" + helpers_source({"_kf_sin", "_kf_cos"}) + _SWEEP,
        encoding="utf-8",
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(module)], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(300)
def test_sine_and_cosine_are_within_two_ulp_of_one_against_float64_up_to_a_million(sweep: dict[str, object]) -> None:
    errors = sweep["errors"]
    assert isinstance(errors, dict)
    assert set(errors) == {"4.0", "1000.0", "1000000.0"}
    for limit, (sin_err, cos_err, torch_err) in errors.items():
        # PyTorch's own float32 sine is within half an ulp of 1 (6e-8); two ulp of 1 is 1.2e-7.
        assert torch_err < 6e-8, (limit, torch_err)
        assert sin_err < 1.2e-7, (limit, sin_err)
        assert cos_err < 1.2e-7, (limit, cos_err)


@pytest.mark.timeout(300)
def test_sine_and_cosine_of_nan_and_infinity_are_nan(sweep: dict[str, object]) -> None:
    sin, cos = sweep["odd_sin"], sweep["odd_cos"]
    assert isinstance(sin, list)
    assert isinstance(cos, list)
    assert all(v != v for v in sin[:3])
    assert all(v != v for v in cos[:3])
    assert sin[3:] == [0.0, pytest.approx(1e-30, rel=1e-6)]
    assert cos[3:] == [1.0, 1.0]
