"""The convolution template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_conv_cases`` at each of its sizes, rendered with the default
parameters, a "stress" configuration (smallest tiles, the least fusion the plan allows), a
seeded mutant, the reduction order the default did not choose (``conv_taps_outer``), taps outside
with the other input tile layout, outer products (``fma``) and, at the first size, 64-bit
indexing. The checks run in two child processes with ``TRITON_INTERPRET=1``; each verdict requires
identical parameters under the same seed, outputs within 1e-4, unchanged inputs, and an error
against float64 no worse than 8x eager's. The default run checks every case but the costlier of
its kind (:data:`_IN_THE_SLOW_RUN`) at its first size in the default, stress, mutant and 64-bit
variants, and the other orders, layouts and precisions on one case of each geometry
(:data:`_EVERY_VARIANT_BY_DEFAULT`); the slow run checks the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import TemplateParams, default_params, relevant_params, render
from actors.experts.template.fuse import KernelKind, schedule
from actors.experts.template.interp_check import Verdict, check_in_subprocess, finish_check, start_check
from actors.experts.template.ir import ConvSpec, NodeKind
from tests.experts.template_cases import Case
from tests.experts.template_conv_cases import CONV_CASES
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of

pytestmark = pytest.mark.timeout(300)

_STRESS = {"conv_block_m": 16, "conv_block_n": 16, "conv_block_k": 16, "conv_warps": 1, "conv_stages": 1}
_plan = plan_of


_EVERY_VARIANT_BY_DEFAULT = frozenset(
    {
        "conv1d_strided_dilated_relu",
        "conv2d_grouped_asymmetric_mish_scale",
        "conv2d_depthwise_residual",
        "conv2d_pointwise_sigmoid",
        "conv3d_strided_asymmetric_kernel",
        "conv_transpose2d_grouped_clamp_divide",
    }
)
"""The cases whose first size the default run checks in every variant of :func:`_other_order`
too: one of each geometry (1-D, 2-D grouped, depthwise, 1x1, 3-D, transposed), each among the
cheaper under the interpreter. Every other case is checked there at its first size in the default,
stress, mutant and 64-bit variants; the rest (second sizes, the other cases' orders, layouts and
precisions) in the slow run, about two thirds of the module's interpreter time."""


_IN_THE_SLOW_RUN = frozenset(
    {
        "conv3d_no_bias_hardswish",
        "conv3d_spatial_mean_and_sum_plus_bias",
        "conv_relu_conv",
        "conv_transpose_phases_without_taps",
        "conv_transpose2d_dilation_shares_stride",
        "conv_transpose2d_strided_spatial_sum",
    }
)
"""The cases only the slow run checks, each the costlier under the interpreter of a kind the default
run keeps (3-D convolutions, transposed ones with strides or dilations, fused spatial sums, two
layers in a row: ``test_template_layers`` has three): about 8 s of the default run's 18 s of checks
here on a 2-core host. The default run's cases still cover every geometry (tested below)."""


def _by_default(case: str, size: int, variant: str) -> bool:
    """Whether the default run checks this candidate (:data:`_EVERY_VARIANT_BY_DEFAULT`,
    :data:`_IN_THE_SLOW_RUN`)."""
    if case in _IN_THE_SLOW_RUN:
        return False
    return size == 0 and (not variant.startswith("also") or case in _EVERY_VARIANT_BY_DEFAULT)


def _in_the_slow_run(case: str, size: int, variant: str) -> bool:
    return not _by_default(case, size, variant)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the default run checks."""
    workdir = tmp_path_factory.mktemp("interp-conv")
    return interp_verdicts(CONV_CASES, _STRESS, workdir, also=_other_order, select=_by_default)


@pytest.fixture(scope="module")
def slow_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the slow run checks."""
    workdir = tmp_path_factory.mktemp("interp-conv-slow")
    return interp_verdicts(CONV_CASES, _STRESS, workdir, also=_other_order, select=_in_the_slow_run)


def _other_order(default: TemplateParams) -> list[dict[str, object]]:
    """The reduction order the default did not choose (``conv_taps_outer``), taps outside with
    the other input tile layout (``conv_a_transposed``), outer products (``fma``), one TF32 pass
    of rounded operands (``tf32``), the input copied channels-last (``conv_layout``), and the
    operands rounded once before the loop (``conv_preround``), channels-last and not, and the flat
    order gathered rows fast (``conv_a_transposed``) or over (tap, channel) from a channels-last
    copy, in three passes and in one of rounded operands."""
    return [
        {"conv_taps_outer": not default.conv_taps_outer},
        {"conv_taps_outer": True, "conv_a_transposed": not default.conv_a_transposed},
        {"conv_precision": "fma"},
        {"conv_precision": "tf32", "conv_block_n": max(16, default.conv_block_n)},  # a dot: 16 columns at least
        {
            "conv_taps_outer": True,
            "conv_layout": "nhwc",
            "conv_precision": "ieee",
            "conv_block_n": max(16, default.conv_block_n),
        },
        {
            "conv_taps_outer": True,
            "conv_layout": "nhwc",
            "conv_a_transposed": True,
            "conv_precision": "tf32",
            "conv_preround": True,
            "conv_block_n": max(16, default.conv_block_n),
        },
        {
            "conv_taps_outer": False,
            "conv_precision": "tf32",
            "conv_preround": True,
            "conv_block_n": max(16, default.conv_block_n),
        },
        {"conv_taps_outer": False, "conv_a_transposed": True},
        {
            "conv_taps_outer": False,
            "conv_layout": "nhwc",
            "conv_precision": "ieee",
            "conv_block_n": max(16, default.conv_block_n),
        },
        {
            "conv_taps_outer": False,
            "conv_layout": "nhwc",
            "conv_precision": "tf32",
            "conv_preround": True,
            "conv_block_n": max(16, default.conv_block_n),
        },
    ]


_TF32 = ("also3", "also5", "also6", "also9")


@pytest.mark.parametrize("case", [c.name for c in CONV_CASES if c.name not in _IN_THE_SLOW_RUN])
def test_convolution_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case], tf32=_TF32)


@pytest.mark.slow  # the other sizes, orders and layouts, and _IN_THE_SLOW_RUN (default run's checks: 18 -> 10 s)
@pytest.mark.parametrize(
    "case", [c.name for c in CONV_CASES if len(c.sizes) > 1 or c.name not in _EVERY_VARIANT_BY_DEFAULT]
)
def test_convolution_kernels_match_pytorch_under_the_interpreter_in_every_other_variant(
    case: str, slow_verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(slow_verdicts[case], tf32=_TF32)


def _geometry(case: Case) -> set[str]:
    """What the case's convolutions have: dimensions, transposed, stride, dilation, padding,
    groups, depthwise."""
    seen: set[str] = set()
    plan = _plan(case.sources()[0])
    for node in plan.nodes:
        if node.kind is not NodeKind.CONV:
            continue
        spec = ConvSpec.from_attrs(node.attrs)
        seen.add(f"{len(node.shape) - 2}d" + ("T" if spec.transposed else ""))
        seen.update(
            name
            for name, hit in (
                ("stride", max(spec.stride) > 1),
                ("dilation", max(spec.dilation) > 1),
                ("padding", max(spec.padding) > 0),
                ("groups", spec.groups > 1),
            )
            if hit
        )
        if spec.groups == node.shape[1] > 1:
            seen.add("depthwise")
    return seen


def test_conv_cases_cover_every_geometry() -> None:
    seen = set().union(*(_geometry(case) for case in CONV_CASES))
    assert {"1d", "2d", "3d", "1dT", "2dT", "3dT", "stride", "dilation", "padding", "groups", "depthwise"} <= seen


def test_the_default_run_checks_every_variant_on_each_geometry() -> None:
    """The cases the default run checks in every variant are cases, and among them are 1-D, 2-D,
    3-D and transposed convolutions, strided, dilated, padded, grouped and depthwise."""
    by_name = {case.name: case for case in CONV_CASES}
    assert set(by_name) >= _EVERY_VARIANT_BY_DEFAULT
    seen = set().union(*(_geometry(by_name[name]) for name in _EVERY_VARIANT_BY_DEFAULT))
    assert {"1d", "2d", "3d", "2dT", "stride", "dilation", "padding", "groups", "depthwise"} <= seen


def test_the_default_run_checks_every_geometry() -> None:
    """The cases left to the slow run (:data:`_IN_THE_SLOW_RUN`) are cases, and the others cover
    every geometry the cases do."""
    assert {case.name for case in CONV_CASES} >= _IN_THE_SLOW_RUN
    kept = set().union(*(_geometry(case) for case in CONV_CASES if case.name not in _IN_THE_SLOW_RUN))
    assert {"1d", "2d", "3d", "1dT", "2dT", "3dT", "stride", "dilation", "padding", "groups", "depthwise"} <= kept


def test_conv_epilogue_fuses_into_one_kernel_and_unfused_splits() -> None:
    case = next(c for c in CONV_CASES if c.name == "conv2d_grouped_asymmetric_mish_scale")
    plan = _plan(case.sources()[0])
    assert plan.template == "conv"
    assert (False, True) in plan.fusions
    unfused = render(plan, default_params(plan).with_changes(fuse_epilogue=False))
    assert "_L_kf_conv0(_kfs, " in unfused
    assert "_L_kf_pw1(_kfs, " in unfused
    assert "_kf_pw1" not in render(plan, default_params(plan))
    assert "_kf_pw1[" in render(plan, default_params(plan).with_changes(fuse_epilogue=False), direct=False)
    assert "conv_block_m" in relevant_params(plan, default_params(plan))


@pytest.mark.parametrize("fuse_epilogue", [True, False])
def test_a_convolution_output_read_through_a_view_and_directly_is_stored_once(fuse_epilogue: bool) -> None:
    """KernelBench L2-92: the group norm reads the convolution's output through its (N, G, -1)
    view and the residual add reads it as it is. With the epilogue fused the convolution stored it
    twice, once per reader (the same values), and the norm's second pass read both copies."""
    case = next(c for c in CONV_CASES if c.name == "conv_groupnorm_residual_logsumexp")
    plan = _plan(case.sources()[0])
    sched = schedule(plan, default_params(plan).with_changes(fuse_epilogue=fuse_epilogue))
    conv = next(k for k in sched.kernels if k.kind is KernelKind.CONV)
    full = plan.nodes[conv.mm].numel
    stored = [nid for nid in conv.exports if plan.nodes[nid].numel == full]
    assert len(stored) == 1, [plan.nodes[n] for n in stored]
    assert plan.nodes[stored[0]].kind is not NodeKind.VIEW


def test_three_pass_tf32_dots_over_64_row_tiles_launch_at_most_4_warps() -> None:
    """On an H100 every KernelBench L3-25 candidate with such a kernel at 8 warps was wrong (the
    same tiles at 4 warps were right): the launch keeps 4; one-pass TF32, IEEE and 128-row tiles
    keep the warps asked for."""
    import re

    case = next(c for c in CONV_CASES if c.name == "conv2d_grouped_asymmetric_mish_scale")
    plan = _plan(case.sources()[0])
    base = default_params(plan).with_changes(conv_block_n=16, conv_block_k=16, conv_warps=8, conv_taps_outer=True)

    def warps(**changes: object) -> set[int]:
        text = render(plan, base.with_changes(**changes))
        return {int(w) for w in re.findall(r"_L_kf_conv\d+ = _KfLaunch\(.*num_warps=(\d+)", text)}

    assert warps(conv_precision="tf32x3", conv_block_m=64) == {4}
    assert warps(conv_precision="tf32x3", conv_block_m=128) == {8}
    assert warps(conv_precision="tf32", conv_block_m=64) == {8}
    assert warps(conv_precision="ieee", conv_block_m=64) == {8}


def test_interpreter_check_rejects_a_wrong_convolution(tmp_path: Path) -> None:
    case = next(c for c in CONV_CASES if c.name == "conv_transpose2d_grouped_clamp_divide")
    source = case.sources()[0]
    plan = _plan(source)
    good = render(plan, default_params(plan))
    bad = good.replace("nt0 = (3 - r0 + 1) // 2", "nt0 = (3 - r0) // 2")  # a stride phase loses a tap
    assert bad != good
    proc = start_check(
        [
            {"reference": source, "candidate": good, "seeds": [3], "atol": 1e-4, "rtol": 1e-4},
            {"reference": source, "candidate": bad, "seeds": [3], "atol": 1e-4, "rtol": 1e-4},
        ],
        tmp_path,
    )
    ok, wrong = finish_check(proc, timeout=120)
    assert ok.ok
    assert not wrong.ok


def test_the_gpu_family_test_variants_build_and_render() -> None:
    """Every variant the GPU family test compiles is valid and renders here, so that test can only
    fail on the GPU for what the GPU does (its tf32x3 variant once raised InvalidParams for narrow
    convolutions, and nothing of those cases ran on a GPU for two sessions)."""
    from actors.experts.template import Plan, analyse
    from tests.experts.test_template_families_gpu import _CASES, _variants

    rendered = 0
    for case in _CASES:
        for source in case.sources():
            plan = analyse(source)
            assert isinstance(plan, Plan), (case.name, plan)
            for params in _variants(plan):
                assert "@triton.jit" in render(plan, params)
                rendered += 1
    assert rendered >= 5 * len(_CASES)


_ATEN_SCRIPT = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from actors.experts.template import analyse, default_params, render
from gpu_runner.aten_policy import ALLOWED_ATEN_OPS
from gpu_runner.sandboxed.reference import load_module
src = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.randn(2, 8, 10, 10)]
def get_init_inputs():
    return []
'''
plan = analyse(src)
class Rec(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
tf32 = {"conv_precision": "tf32", "conv_block_n": 16, "conv_preround": True}
for i, changes in enumerate([
    {**tf32, "conv_taps_outer": True, "conv_layout": "nhwc"},
    {**tf32, "conv_taps_outer": False},
    {**tf32, "conv_taps_outer": True, "conv_layout": "nchw"},
]):
    ns = load_module(render(plan, default_params(plan).with_changes(**changes)), "<c>", f"kf_aten_{i}")
    model = ns["ModelNew"]()
    before = model.conv.weight.detach().clone()
    x = torch.randn(2, 8, 10, 10)
    with torch.no_grad(), Rec() as rec:
        model(x)
    bad = sorted(op for op in rec.ops if op.rstrip("_") not in ALLOWED_ATEN_OPS and op not in ALLOWED_ATEN_OPS)
    kept = [k for k, v in ns.items() if k.startswith("_L_kf_") and (v.ck is not None or v.where is not None)]
    print(i, bad, bool(torch.equal(before, model.conv.weight)), kept)
"""


def test_pre_rounding_and_channels_last_copies_dispatch_no_torch_compute(tmp_path: Path) -> None:
    """The copies before a convolution (channels-last, TF32 rounding of input and weights) are
    Triton kernels: the evaluator rejects a forward that computes with PyTorch ops (only data
    movement is allowed, ``gpu_runner.aten_policy``), and the model's weights stay as they were."""
    import subprocess
    import sys

    script = tmp_path / "aten.py"
    script.write_text(_ATEN_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    # and the launch sites kept no kernel: the interpreter compiles none, and CPU tensors have no stream
    assert lines == ["0 [] True []", "1 [] True []", "2 [] True []"], run.stdout


@pytest.mark.slow  # three more candidates under the interpreter (~20 s); the cases above check the default
def test_spatial_sums_join_the_convolution_only_where_nothing_else_reads_its_output(tmp_path: Path) -> None:
    """A global average pool after a convolution is summed in the convolution's tiles (the output
    never stored); with outer products' long tiles (many images per tile) the sums are added
    element by element, and still right. A convolution whose output is also returned, or centred
    by its own mean (a batch norm), keeps its output and its sums in a kernel of their own."""
    case = next(c for c in CONV_CASES if c.name == "conv2d_gelu_global_avg_pool")
    source = case.sources()[0].replace("torch.randn(3, 3, 10, 10)", "torch.randn(9, 3, 10, 10)")
    assert "torch.randn(9, 3, 10, 10)" in source
    plan = _plan(source)
    fused = render(plan, default_params(plan))
    assert fused.count("@triton.jit") == 2
    assert "tl.atomic_add" in fused
    assert ".zero_()" in fused
    unfused = render(plan, default_params(plan).with_changes(fuse_prologue=False))
    assert "tl.atomic_add" not in unfused
    assert "_L_kf_row1(_kfs, " in unfused
    long_tiles = default_params(plan).with_changes(conv_precision="fma", conv_block_m=256, conv_block_n=128)
    elementwise = render(plan, long_tiles)
    assert "nb[:, None] * 5 + co[None, :]" in elementwise  # 9 images in a tile of 1024 rows
    proc = start_check(
        [
            {"reference": source, "candidate": cand, "seeds": [3], "atol": 1e-4, "rtol": 1e-4}
            for cand in (fused, unfused, elementwise)
        ],
        tmp_path,
    )
    assert all(v.ok for v in finish_check(proc, timeout=240))
    kept = (
        "return x, torch.mean(x, dim=(2, 3))",
        "return x - torch.mean(x, dim=(2, 3), keepdim=True)",
    )
    pooled = "x = F.adaptive_avg_pool2d(x, 1)\n        return x.squeeze(-1).squeeze(-1)"
    assert pooled in source
    for body in kept:
        other = _plan(source.replace(pooled, body))
        assert other.nodes != plan.nodes
        assert "tl.atomic_add" not in render(other, default_params(other))


def test_one_output_channel_per_group_is_a_vector_tile(tmp_path: Path) -> None:
    """A depthwise convolution's tile is one output channel's positions of one image, kept 1-D
    (Triton 3.6 miscompiled its ``[BLOCK_M, 1]`` form on an H200, KernelBench L3-22, and 1-D tiles
    straddling two images at other sizes), at most the power of two that holds an image; two
    output channels per group keep the 2-D tile. Right under the interpreter with one tile per
    image and with several."""
    depthwise = next(c for c in CONV_CASES if c.name == "conv2d_depthwise_residual")
    reference = depthwise.sources()[1]  # 20 x 11 outputs per image: 220, a 256-row tile
    plan = plan_of(reference)
    first = default_params(plan)
    source = render(plan, first)
    assert "acc = tl.zeros((BLOCK_M,), dtype=tl.float32)" in source
    assert "acc += a * b" in source
    assert "tl.zeros((BLOCK_M, BLOCK_N)" not in source
    assert "nb = pid\n" in source
    assert "sp = tl.arange(0, BLOCK_M)" in source
    assert "BLOCK_M=256," in source
    assert "rm = " not in source.split("def _kf_conv0")[1].split("@triton.jit")[0]
    short = render(plan, first.with_changes(conv_block_m=32, conv_block_n=1, conv_warps=1))
    assert "nb = pid // 7" in short
    assert "sp = (pid % 7) * BLOCK_M + tl.arange(0, BLOCK_M)" in short
    jobs = [{"reference": reference, "candidate": c, "seeds": [3], "atol": 1e-4, "rtol": 1e-4} for c in (source, short)]
    verdicts = check_in_subprocess(jobs, tmp_path, timeout=280)
    assert all(v.ok for v in verdicts), [v.detail for v in verdicts]
    doubled = depthwise.sources()[0].replace("nn.Conv2d(6, 6, 3,", "nn.Conv2d(6, 12, 3,")
    doubled = doubled.replace("return x + torch.tanh(self.conv(x))", "return torch.tanh(self.conv(x))")
    plan2 = plan_of(doubled)
    source2 = render(plan2, default_params(plan2))
    assert "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" in source2
    assert "acc += a[:, None] * b[None, :]" in source2
