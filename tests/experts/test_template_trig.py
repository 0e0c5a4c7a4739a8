"""The template's sine, cosine and their inverses (``families/trig.py``) against float64, under
the Triton interpreter: sweeps over several ranges of ``|x|``, and NaN where PyTorch gives NaN."""

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


@triton.jit
def _inverses(x_ptr, a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    tl.store(a_ptr + i, _kf_asin(x), mask=m)
    tl.store(b_ptr + i, _kf_acos(x), mask=m)
    tl.store(c_ptr + i, _kf_atan(x), mask=m)


def inverses(x):
    a, b, c = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    block = 1 << 16
    _inverses[(triton.cdiv(x.numel(), block),)](x, a, b, c, x.numel(), BLOCK=block)
    return a, b, c


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
unit = torch.cat([torch.linspace(-1, 1, 100001), 1 - torch.rand(20000, generator=gen) * 1e-3]).float()
wide = torch.cat([torch.linspace(-20, 20, 100001), torch.randn(20000, generator=gen) * 1e4]).float()
a, b, _ = inverses(unit)
_, _, t = inverses(wide)
exact_unit, exact_wide = unit.double(), wide.double()
rel = lambda got, want: ((got.double() - want).abs() / want.abs().clamp(min=1e-30)).max().item()
inverse_errors = {
    "asin": [rel(a, exact_unit.asin()), rel(torch.asin(unit), exact_unit.asin())],
    "acos": [rel(b, exact_unit.acos()), rel(torch.acos(unit), exact_unit.acos())],
    "atan": [rel(t, exact_wide.atan()), rel(torch.atan(wide), exact_wide.atan())],
}
outside = torch.tensor([1.5, -1.0001, float("nan"), float("inf"), -float("inf")])
a, b, t = inverses(outside)
print(json.dumps({
    "errors": errors, "odd_sin": s.tolist(), "odd_cos": c.tolist(), "inverse_errors": inverse_errors,
    "outside": [a.tolist(), b.tolist(), t.tolist()],
}))
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    load_families()
    module = tmp_path_factory.mktemp("trig") / "sweep.py"
    module.write_text(
        "import triton\nimport triton.language as tl\n"
        + helpers_source({"_kf_sin", "_kf_cos", "_kf_inverse_trig"})
        + _SWEEP,
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


@pytest.mark.timeout(300)
def test_inverse_sine_cosine_and_tangent_are_within_three_ulp_relative_against_float64(
    sweep: dict[str, object],
) -> None:
    errors = sweep["inverse_errors"]
    assert isinstance(errors, dict)
    for name, (ours, torch_own) in errors.items():
        # relative errors; one float32 ulp is 1.2e-7 relative at most (Cephes' asinf peaks near 2 ulp)
        assert torch_own < 1.2e-7, (name, torch_own)
        assert ours < 3.6e-7, (name, ours)


@pytest.mark.timeout(300)
def test_inverse_sine_and_cosine_outside_one_are_nan_and_atan_of_infinity_is_a_right_angle(
    sweep: dict[str, object],
) -> None:
    outside = sweep["outside"]
    assert isinstance(outside, list)
    asin, acos, atan = outside
    assert all(v != v for v in asin)
    assert all(v != v for v in acos)
    assert atan[:2] == [pytest.approx(0.982793723, rel=1e-6), pytest.approx(-0.785448, rel=1e-5)]
    assert atan[2] != atan[2]
    assert atan[3:] == [pytest.approx(1.5707963), pytest.approx(-1.5707963)]
