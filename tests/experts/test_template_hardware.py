"""The GPU model behind the template families' first configurations: device lookup, tiles that
fill the SMs, rows per program for few long rows, 16-byte vectors, stages that fit shared memory;
and the first configurations it gives, which stay correct (Triton's interpreter, small sizes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from actors.experts.template import default_params, render
from actors.experts.template.hardware import CPU_FALLBACK, TABLE, detect, from_properties, lookup
from actors.experts.template.interp_check import finish_check, start_check
from tests.experts.template_interp import plan_of

H100, H200, A100 = TABLE["H100"], TABLE["H200"], TABLE["A100"]

MATMUL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.relu(a @ b)


M, K, N = {m}, {k}, {n}


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
"""

SOFTMAX = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
"""

SCALE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.gelu(x) * 2.0


def get_inputs():
    return [torch.randn({numel}, dtype=torch.{dtype})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    ("name", "model"),
    [("NVIDIA H100 80GB HBM3", H100), ("NVIDIA H200", H200), ("NVIDIA A100-SXM4-80GB", A100), ("Tesla T4", None)],
)
def test_device_names_map_to_the_table(name: str, model: object) -> None:
    assert lookup(name) is model


def test_a_device_outside_the_table_keeps_its_own_sm_count_and_shared_memory() -> None:
    model = from_properties("NVIDIA RTX 6000 Ada Generation", 142, 101_376, 96 << 20)
    assert (model.sm_count, model.smem_per_block, model.l2_bytes) == (142, 101_376, 96 << 20)
    assert model.is_gpu
    assert detect("NVIDIA H200") is H200


def test_matrix_tiles_fill_every_sm_or_are_the_smallest() -> None:
    assert H100.mm_tiles(4096, 4096) == (128, 128)
    for m, n, batch in ((1024, 1024, 1), (512, 256, 1), (128, 128, 16), (64, 8192, 1)):
        bm, bn = H100.mm_tiles(m, n, batch)
        tiles = batch * math.ceil(m / bm) * math.ceil(n / bn)
        assert tiles >= H100.sm_count or (bm, bn) == (32, 32), (m, n, batch, bm, bn)
        # Nothing larger would also have filled the machine.
        if (bm, bn) != (128, 128):
            assert batch * math.ceil(m / 128) * math.ceil(n / 128) < H100.sm_count


def test_few_long_rows_get_one_row_per_program_and_many_short_rows_get_several() -> None:
    assert H100.rows_per_program(64, 65536) == 1
    assert H100.rows_per_program(1 << 20, 64) == 32
    few = H100.rows_per_program(300, 16)  # 300 rows of 16: a tile of 2048 would leave 3 programs
    assert 300 // few >= 2 * H100.sm_count or few == 1


def test_vector_width_is_16_bytes_and_stages_fit_shared_memory() -> None:
    assert (H100.vector_width(4), H100.vector_width(2), H100.vector_width(8)) == (4, 8, 2)
    stages = A100.stages_that_fit(256, 256, 64, 4, most=8)
    assert stages * (256 * 64 * 2) * 4 <= A100.smem_per_block
    assert H100.stages_that_fit(64, 64, 32, 4, most=3) == 3


def test_first_configurations_follow_the_gpu_and_the_cpu_fallback_changes_nothing() -> None:
    gemm = plan_of(MATMUL.format(m=256, k=8192, n=512))  # small output, long K
    shapes_only = default_params(gemm)
    assert default_params(gemm, CPU_FALLBACK) == shapes_only
    fitted = default_params(gemm, H100)
    assert math.ceil(256 / fitted.mm_block_m) * math.ceil(512 / fitted.mm_block_n) >= 64
    assert fitted.mm_block_m * fitted.mm_block_n < shapes_only.mm_block_m * shapes_only.mm_block_n
    assert (fitted.mm_precision, shapes_only.mm_precision) == ("tf32x3", "ieee")  # tensor cores pay on H100
    assert (H100.tf32x3_pays, A100.tf32x3_pays, CPU_FALLBACK.tf32x3_pays) == (True, True, False)
    rows = plan_of(SOFTMAX.format(rows=64, cols=32768))
    assert default_params(rows, H100).row_block_m == 1
    big = default_params(plan_of(SCALE.format(numel=1 << 22, dtype="float32")), H100)
    assert (big.pw_ept, big.pw_warps) == (4, 8)  # 16-byte accesses, and plenty of programs per SM
    small = default_params(plan_of(SCALE.format(numel=1 << 16, dtype="float32")), H100)
    assert small.pw_warps < big.pw_warps  # a small tensor still gives every SM a program


@pytest.mark.timeout(300)
def test_gpu_fitted_first_configurations_are_correct_in_the_interpreter(tmp_path: Path) -> None:
    sources = [
        MATMUL.format(m=48, k=96, n=80),
        SOFTMAX.format(rows=6, cols=300),
        SCALE.format(numel=5000, dtype="float32"),
    ]
    jobs = []
    for source in sources:
        plan = plan_of(source)
        for hw in (H100, A100):
            jobs.append(
                {
                    "reference": source,
                    "candidate": render(plan, default_params(plan, hw)),
                    "seeds": [3],
                    "atol": 1e-4,
                    "rtol": 1e-4,
                }
            )
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert len(verdicts) == len(jobs)
    bad = [v for v in verdicts if not v.ok]
    assert not bad, bad


CONV = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d({cin}, {cout}, 3, groups={groups}, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(2, {cin}, 34, 34)]


def get_init_inputs():
    return []
"""


def test_first_convolutions_sum_few_channels_without_dot_and_use_tf32x3_where_it_pays() -> None:
    from actors.experts.template.errors import InvalidParams
    from actors.experts.template.params import TemplateParams

    dense = plan_of(CONV.format(cin=16, cout=128, groups=1))  # KernelBench L1-63's channels
    assert default_params(dense).conv_precision == "ieee"
    assert default_params(dense, CPU_FALLBACK).conv_precision == "ieee"
    # a forward convolution of 3x3 taps walks taps outside into an ieee dot (faster than tf32x3
    # there on an H200); a transposed one takes tf32x3
    first = default_params(dense, H100)
    assert (first.conv_precision, first.conv_taps_outer, first.conv_a_transposed) == ("ieee", True, False)
    assert "tl.trans(tl.load(" in render(dense, first.with_changes(conv_a_transposed=True))
    transposed = plan_of(CONV.format(cin=16, cout=128, groups=1).replace("nn.Conv2d", "nn.ConvTranspose2d"))
    first = default_params(transposed, H100)
    assert (first.conv_precision, first.conv_taps_outer, first.conv_a_transposed) == ("tf32x3", True, False)
    few = plan_of(CONV.format(cin=3, cout=64, groups=1))  # 3 channels: the flat index packs them
    assert (default_params(few, H100).conv_precision, default_params(few, H100).conv_taps_outer) == ("tf32x3", False)
    depthwise = plan_of(CONV.format(cin=64, cout=64, groups=64))  # L1-82: one channel per group
    for hw in (None, H100):
        first = default_params(depthwise, hw)
        assert (first.conv_precision, first.conv_block_n, first.conv_taps_outer) == ("fma", 1, True)
        assert "tl.dot" not in render(depthwise, first)
        assert "acc += a * b" in render(depthwise, first)  # outer products (one channel: vectors), no 3-D tile
    # a depthwise convolution followed by a pointwise one (L1-86): the conv_* parameters are shared,
    # the pointwise one needs tl.dot and the depthwise one takes outer products all the same
    separable = plan_of(
        CONV.format(cin=64, cout=64, groups=64)
        .replace("return self.conv(x)", "return self.point(self.conv(x))")
        .replace("bias=False)", "bias=False)\n        self.point = nn.Conv2d(64, 128, 1, bias=False)")
    )
    first = default_params(separable, H100)
    assert first.conv_precision == "tf32x3"
    assert first.conv_block_n >= 16
    source = render(separable, first)
    assert source.count("tl.dot(") == 1
    assert "acc += a * b" in source
    with pytest.raises(InvalidParams, match="conv_block_n"):
        TemplateParams(conv_block_n=8)  # tl.dot needs 16 columns
    TemplateParams(conv_precision="fma", conv_block_n=8)  # fma does not
    with pytest.raises(InvalidParams, match="conv_warps"):  # fma's [M, N] products per thread
        TemplateParams(conv_precision="fma", conv_block_m=256, conv_block_n=128, conv_warps=1)


def test_convolutions_start_in_tf32_where_the_run_admits_the_reference_s_own_precision() -> None:
    """Under precision parity a fp32 convolution may run as cuDNN runs it at PyTorch's defaults:
    one TF32 pass (the narrow ones keep fma); otherwise no mutation proposes TF32."""
    import numpy as np

    from actors.experts.precision import tf32_admitted
    from actors.experts.template import mutate
    from schemas import GenerateRequest, PrecisionMode, Task

    dense = plan_of(CONV.format(cin=16, cout=128, groups=1))
    first = default_params(dense, H200, tf32=True)
    assert first.conv_precision == "tf32"
    # the tiles that suit one TF32 pass (bench.conv_orders --sweep on an H200)
    assert (first.conv_block_m, first.conv_block_n, first.conv_warps, first.conv_stages) == (128, 64, 4, 3)
    # the input copied channels-last and rounded to TF32 in that copy (bench.conv_orders --sweep layout)
    assert (first.conv_taps_outer, first.conv_layout, first.conv_preround) == (True, "nhwc", True)
    assert default_params(dense, H200).conv_precision == "ieee"  # as before
    assert default_params(dense, CPU_FALLBACK, tf32=True).conv_precision == "ieee"  # no tensor cores
    depthwise = plan_of(CONV.format(cin=64, cout=64, groups=64))
    assert default_params(depthwise, H200, tf32=True).conv_precision == "fma"
    assert 'input_precision="tf32"' in render(dense, default_params(dense, H200, tf32=True))
    rng = np.random.default_rng(0)
    base = default_params(dense, H200)
    seen = {mutate(dense, base, rng, diagnosis=None).conv_precision for _ in range(300)}
    assert "tf32" not in seen
    assert "tf32x3" in seen
    seen = {mutate(dense, base, rng, diagnosis=None, tf32=True).conv_precision for _ in range(300)}
    assert "tf32" in seen

    source = CONV.format(cin=16, cout=128, groups=1)

    def request(precision: PrecisionMode, text: str = source) -> GenerateRequest:
        return GenerateRequest(run_id="r", island="i0", task=Task.from_source("conv", text), precision=precision)

    assert tf32_admitted(request(PrecisionMode.REFERENCE))
    assert not tf32_admitted(request(PrecisionMode.EXACT))
    own = "import torch\ntorch.backends.cudnn.allow_tf32 = False\n" + source
    assert not tf32_admitted(request(PrecisionMode.REFERENCE, own))


def test_convolution_mutations_change_the_kernel() -> None:
    """A mutation steps only parameters the convolution's kernel reads: the input's layout and the
    tile's gather order for dots, the channel tile and the order not for outer products."""
    import numpy as np

    from actors.experts.template import mutate, relevant_params

    flat = plan_of(CONV.format(cin=3, cout=64, groups=1))  # 3 channels: the flat order
    depthwise = plan_of(CONV.format(cin=64, cout=64, groups=64))
    dense = plan_of(CONV.format(cin=16, cout=128, groups=1))
    names = relevant_params(flat, default_params(flat, H100))
    assert {"conv_taps_outer", "conv_a_transposed", "conv_layout"} <= set(names)
    names = relevant_params(depthwise, default_params(depthwise, H100))
    assert not {"conv_block_k", "conv_taps_outer", "conv_a_transposed"} & set(names)
    assert "conv_a_transposed" in relevant_params(dense, default_params(dense, H100))
    rng = np.random.default_rng(11)
    for plan in (flat, depthwise, dense):
        first = default_params(plan, H100)
        source = render(plan, first)
        for _ in range(40):
            child = mutate(plan, first, rng, diagnosis=None)
            assert render(plan, child) != source, {k: v for k, v in child.as_dict().items() if v != getattr(first, k)}
