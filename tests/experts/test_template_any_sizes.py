"""Models at any size of their inputs (issue 38 item 1): the batch, image sizes, lengths and widths
at once (``any_sizes.py``). The fits of a plan's dimensions to the task's sizes, what has no such
path (a strided window, a kernel chosen by comparing a size), the refusals, and the copies checked
under Triton's interpreter against the reference at sizes the run never saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.experts.template import any_batch, any_sizes, default_params, mutate
from actors.experts.template.any_sizes import Decided, SymN, _fit, at_task
from actors.experts.template.hardware import TABLE
from actors.experts.template.ir import Plan, Unsupported, plan_from_dict, plan_to_dict
from actors.experts.template.params import TemplateParams
from actors.experts.template.render import analyse, render
from actors.experts.template.size_fits import Fit
from tests.experts.test_template_any_batch import ALL_CASES, COMPILE, _source
from tests.experts.test_template_any_batch import _check_in_child as check_batches_in_child
from tests.experts.test_template_any_size import _load

CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv(x)))).flatten(1).softmax(dim=1)

batch_size = 4
height = 12
width = 10

def get_inputs():
    return [torch.randn(batch_size, 3, height, width)]

def get_init_inputs():
    return []
"""

COVERED = 59
"""Test cases (at their first sizes, plain parameters) with an any-size path when this was written."""


def test_dimensions_are_fitted_as_products_of_affine_factors_of_the_sizes() -> None:
    s0 = (4, 12, 10)  # batch, height, width
    # 8 * (H - 2) * (W - 2): an unpadded 3x3 convolution's flattened image
    flat = _fit(8 * 10 * 8, [(640, 640), (8 * 11 * 8, 8 * 12 * 8), (8 * 10 * 9, 8 * 10 * 10)], s0)
    assert flat == Fit(8, ((1, 1, -2), (2, 1, -2)))
    assert flat.text(("kf_b", "kf_h", "kf_w")) == "(8 * (kf_h - 2) * (kf_w - 2))"
    assert flat.at((1, 3, 5)) == 8 * 1 * 3
    assert _fit(7, [(7, 7), (7, 7), (7, 7)], s0) == Fit(7)
    # (H - 3) // 2 + 1, a strided window: 5, 5, 6 at heights 12, 13, 14 is not affine, and two
    # steps do not show its period
    assert _fit(5, [(7, 7), (5, 6), (7, 7)], s0) is None
    # over two periods it is a floor factor: 3 * ((H - 1) // 2) channels by rows
    rows = [3 * ((h - 1) // 2) for h in range(13, 17)]
    assert _fit(15, [(15, 15), rows, (15, 15)], s0) == Fit(3, (), ((1, 1, -1, 2),))
    assert Fit(3, (), ((1, 1, -1, 2),)).text(("kf_b", "kf_h", "kf_w")) == "(3 * ((kf_h - 1) // 2))"


def test_a_convolutional_model_takes_any_batch_and_image_size_and_is_correct_there(tmp_path: Path) -> None:
    plan = analyse(CONV)
    assert isinstance(plan, Plan), plan
    assert plan.sizes is not None
    assert plan.sizes.names == ("batch_size", "height", "width")
    conv = next(n for n in plan.nodes if n.kind.value == "conv")
    texts = [f.text(plan.sizes.variables) if f else None for f in plan.sizes.dims[conv.id]]
    assert texts == ["kf_batch_size", None, "(kf_height - 2)", "(kf_width - 2)"]
    # the run's first parameters here (every case and parameter set in the slow run)
    rendered = render(plan, default_params(plan))
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert any_batch.METHOD not in rendered  # the any-size path supersedes the batch's
    points = [{"batch_size": 1, "height": 3, "width": 3}, {"batch_size": 3, "height": 17, "width": 6}]
    outcomes = _check_in_child([_job("default", CONV, rendered, tmp_path, points)], tmp_path)
    assert outcomes == {"default": 2}, outcomes


def test_sizes_below_what_the_reference_takes_are_refused_saying_so(tmp_path: Path) -> None:
    plan = analyse(CONV)
    assert isinstance(plan, Plan)
    module = _load(render(plan, TemplateParams()), tmp_path / "kf_sizes_refuse.py")
    with pytest.raises(ValueError, match=r"sizes batch_size=2, height=2, width=9: too small for this model"):
        module.ModelNew()(torch.randn(2, 3, 2, 9))
    with pytest.raises(ValueError, match=r"dimension 1 is 4, not 3\. This ModelNew's kernels take any batch_size, "):
        module.ModelNew()(torch.randn(2, 4, 12, 10))


@pytest.mark.slow  # ~3 s on a 2-core host; the default run keeps a convolutional model at any size
def test_a_strided_window_is_fitted_as_a_floor_and_the_model_takes_any_size(tmp_path: Path) -> None:
    # a stride-2 convolution then a 2x2 max pool: (H - 1) // 2 then (H - 1) // 4, which two steps
    # of a size do not show; the sizes are moved over two periods of the strides (8 steps)
    source = CONV.replace("nn.Conv2d(3, 8, 3)", "nn.Conv2d(3, 8, 3, stride=2)").replace(
        "return torch.relu(self.conv2(torch.relu(self.conv(x))))",
        "return torch.relu(self.conv2(F.max_pool2d(torch.relu(self.conv(x)), 2)))",
    )
    source = source.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n")
    source = source.replace("height = 12", "height = 21").replace("width = 10", "width = 30")
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    assert plan.sizes is not None
    pool = next(n for n in plan.nodes if n.kind.value == "pool")
    texts = [f.text(plan.sizes.variables) if f else None for f in plan.sizes.dims[pool.id]]
    assert texts == ["kf_batch_size", None, "((kf_height - 1) // 4)", "((kf_width - 1) // 4)"]
    rendered = render(plan, default_params(plan))
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert _correct_at(plan, source, rendered, tmp_path, ((1, 7, 7), (2, 8, 13), (3, 26, 10))) == 3
    module = _load(rendered, tmp_path / "kf_sizes_strided_refuse.py")
    with pytest.raises(ValueError, match=r"sizes batch_size=2, height=4, width=9: too small"):
        module.ModelNew()(torch.randn(2, 3, 4, 9))  # a pooled image of no rows


def test_a_size_compared_by_a_writer_is_decided_only_where_every_size_decides_alike() -> None:
    x = SymN(64, "(kf_h * kf_w)")
    with pytest.raises(Decided, match=r"\(kf_h \* kf_w\) compared with 128"):
        _ = x < 128
    with pytest.raises(Decided):
        min(128, x)
    assert x != 64  # a size that moves is never a given number
    assert x == SymN(99, "(kf_h * kf_w)")
    y = x * 2 + 1
    assert (int(y), str(y)) == (129, "(((kf_h * kf_w) * 2) + 1)")
    # a choice of speed reads the value at the task's sizes, the same in every rendering
    z = SymN.linear(300, "(kf_h * kf_w)", None, task=64) * 2 + 1
    assert (int(z), at_task(z), at_task(7)) == (601, 129, 7)


def test_a_convolutions_fused_spatial_sums_take_any_size_looping_over_the_images_a_tile_spans(
    tmp_path: Path,
) -> None:
    # A global average pool joins the convolution's kernel: its tiles add their rows' sums per
    # image and channel. How many images a tile spans follows the image's size against the tile,
    # so the any-size copy counts them at run time (KernelBench L2-52, 67 and 73's bests on an
    # H200 refused every other image size before); 3x3 images put 1 position per image, so a
    # tile spans dozens of images, the last beyond the batch.
    source = _source(ALL_CASES["conv2d_gelu_global_avg_pool"], 0)
    plan = analyse(source)
    assert isinstance(plan, Plan)
    assert plan.sizes is not None
    params = default_params(plan).with_changes(fuse_epilogue=True)
    rendered = render(plan, params)
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert "for j" in rendered.split(f"def {any_sizes.METHOD}")[0]  # the copy's kernel loops
    assert _correct_at(plan, source, rendered, tmp_path, ((1, 3, 3), (5, 4, 9), (2, 21, 17))) == 3


DEPTHWISE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.pointwise = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))

batch_size = 3
height = 40
width = 36

def get_inputs():
    return [torch.randn(batch_size, 6, height, width)]

def get_init_inputs():
    return []
"""


@pytest.mark.slow  # ~7 s on a 2-core host; the default run keeps a convolutional model at any size
def test_a_depthwise_convolution_takes_any_image_size_its_tiles_per_image_counted_at_run_time(
    tmp_path: Path,
) -> None:
    # one output channel per group: a tile is one image's run of positions, several tiles per
    # image at the task's size, and how many follows the image (KernelBench L1-86's best on an H200
    # refused every other image size before)
    plan = analyse(DEPTHWISE)
    assert isinstance(plan, Plan)
    assert plan.sizes is not None
    rendered = render(plan, default_params(plan))
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert "nb = pid // ((((kf_height * kf_width)" in rendered
    assert _correct_at(plan, DEPTHWISE, rendered, tmp_path, ((1, 1, 1), (2, 5, 7), (4, 45, 33))) == 3


GROUPED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, 8)

    def forward(self, x):
        return torch.sigmoid(self.norm(x))

batch_size = 2
height = 192
width = 192

def get_inputs():
    return [torch.randn(batch_size, 8, height, width)]

def get_init_inputs():
    return []
"""


def test_a_reduction_split_by_its_size_gets_an_any_size_copy_lowered_whole(tmp_path: Path) -> None:
    # 8 rows of 73728: the group norm's sums are split in parts for parallelism, as many as the
    # rows leave room for (another batch, another split: KernelBench L1-35 and L2-21 had no
    # any-size copy). The copy comes from the reference lowered without the split, and the plan
    # keeps it through the analysis child's JSON.
    plan = analyse(GROUPED)
    assert isinstance(plan, Plan)
    assert plan.sizes is not None
    assert plan.sizes.plan is not None
    assert len(plan.sizes.plan.nodes) < len(plan.nodes)
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    params = default_params(plan)
    rendered = render(plan, params)
    assert render(again, params) == rendered
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert _correct_at(plan, GROUPED, rendered, tmp_path, ((1, 1, 1), (3, 7, 5), (1, 33, 40))) == 3


LONG_K = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)

M = 16
N = 24
K = 2048

def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]

def get_init_inputs():
    return []
"""


@pytest.mark.slow  # ~2 s on a 2-core host; the default run keeps a split reduction at any size
def test_a_split_k_product_takes_any_size_its_slices_past_k_adding_zeros(tmp_path: Path) -> None:
    # the split is halved where K leaves a slice too few steps: a choice of speed, taken at the
    # sizes rendered (KernelBench L1-6 had no any-size copy); at a K of 40 three of the four
    # slices have nothing to add
    plan = analyse(LONG_K)
    assert isinstance(plan, Plan)
    assert plan.sizes is not None
    params = default_params(plan).with_changes(mm_split_k=4, mm_block_k=32, mm_tma=False)
    rendered = render(plan, params)
    assert f"def {any_sizes.METHOD}(self" in rendered
    copy = rendered[rendered.index("_s(kf_M") :]
    assert "k_lo = (w % 4)" in copy
    # 64 steps of K leave 128 slices too few: halved at the task's K in every rendering (at the
    # probe's threefold K it would be halved less, and the copy was lost)
    assert f"def {any_sizes.METHOD}(self" in render(plan, params.with_changes(mm_split_k=128))
    assert _correct_at(plan, LONG_K, rendered, tmp_path, ((1, 1, 1), (5, 7, 40), (17, 9, 700))) == 3


WINDOWED = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{body}

batch_size = 2
height = {h}
width = {w}

def get_inputs():
    return [torch.randn(batch_size, 3, height, width)]

def get_init_inputs():
    return []
"""

WINDOWS = {
    # (H - 1) // 2 + 1 with a ceil-mode pool's rounding: (H + 2) // 2
    "ceil_mode_pool_padded": (
        "self.conv = nn.Conv2d(3, 4, 3, padding=1)",
        "return F.max_pool2d(torch.relu(self.conv(x)), 3, stride=2, padding=1, ceil_mode=True)",
        (23, 18),
        "((kf_height + 2) // 2)",
    ),
    "average_pool_padding_not_counted": (
        "self.conv = nn.Conv2d(3, 4, 2)",
        "return F.avg_pool2d(self.conv(x), 3, stride=2, padding=1, count_include_pad=False)",
        (21, 16),
        "(kf_height // 2)",
    ),
    "dilated_stride_3_convolution": (
        "self.conv = nn.Conv2d(3, 5, 3, stride=3, dilation=2)",
        "return torch.sigmoid(self.conv(x))",
        (29, 26),
        "((kf_height - 2) // 3)",
    ),
    # down by a strided convolution, up by a transposed one: twice a floor
    "down_then_up": (
        "self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)\nself.up = nn.ConvTranspose2d(4, 3, 2, stride=2)",
        "return self.up(torch.relu(self.down(x)))",
        (16, 20),
        "(2 * ((kf_height + 1) // 2))",
    ),
    "strided_then_spatial_mean": (
        "self.conv = nn.Conv2d(3, 6, 5, stride=2)",
        "return torch.relu(self.conv(x)).mean(dim=(2, 3))",
        (27, 24),
        None,
    ),
}


@pytest.mark.slow
def test_strided_windows_of_every_kind_take_any_size_and_are_correct_there(tmp_path: Path) -> None:
    jobs = []
    for name, (init, body, (h, w), height_text) in WINDOWS.items():
        source = WINDOWED.format(init=textwrap.indent(init, " " * 8), body=textwrap.indent(body, " " * 8), h=h, w=w)
        plan = analyse(source)
        assert isinstance(plan, Plan), (name, plan)
        assert plan.sizes is not None, name
        out = plan.nodes[plan.output]
        fit = plan.sizes.dims[out.id][2] if len(out.shape) > 2 else None  # the output's height
        assert (fit.text(plan.sizes.variables) if fit is not None else None) == height_text, name
        rendered = render(plan, default_params(plan))
        assert f"def {any_sizes.METHOD}(self" in rendered, name
        sizes = [(1, h + 1, w + 3), (3, h - 4, w - 5), (2, 2 * h + 1, w + 2), (1, 9, 10)]
        points = [dict(zip(plan.sizes.names, p, strict=True)) for p in sizes]
        jobs.append(_job(name, source, rendered, tmp_path, points))
    outcomes = _check_in_child(jobs, tmp_path)
    assert outcomes == dict.fromkeys(WINDOWS, 4), outcomes


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_any_size_kernels_compile_for_a_hopper_gpu_without_one(tmp_path: Path) -> None:
    # The interpreter takes what the compiler may refuse (a loop over a run-time count, a block
    # shape that is not a constant): the copies of this module's models, compiled for an H200 as
    # the evaluator's compile stage does, at sizes other than the task's.
    pooled = _source(ALL_CASES["conv2d_gelu_global_avg_pool"], 0)
    models: dict[str, tuple[str, Any, bool, dict[str, Any], tuple[int, ...]]] = {
        "pooled": (pooled, TABLE["H200"], False, {}, (5, 4, 9)),
        "pooled_nhwc": (
            pooled,
            TABLE["H200"],
            True,
            {"conv_layout": "nhwc", "conv_precision": "tf32", "conv_block_n": 16},
            (5, 4, 9),
        ),
        "depthwise": (DEPTHWISE, TABLE["H200"], False, {}, (2, 5, 7)),
        "grouped": (GROUPED, TABLE["H200"], False, {}, (3, 7, 5)),
        "long_k": (LONG_K, TABLE["H200"], False, {"mm_split_k": 4}, (5, 7, 40)),
    }
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    for name, (source, hw, tf32, changes, sizes) in models.items():
        plan = analyse(source)
        assert isinstance(plan, Plan)
        assert plan.sizes is not None
        rendered = render(plan, default_params(plan, hw, tf32).with_changes(**changes))
        assert f"def {any_sizes.METHOD}(self" in rendered, name
        candidate, reference = tmp_path / f"cand_{name}.py", tmp_path / f"ref_{name}.py"
        candidate.write_text(rendered)
        reference.write_text(source)
        at = json.dumps(dict(zip(plan.sizes.names, sizes, strict=True)))
        argv = [sys.executable, str(script), str(candidate), str(reference), "-", at, any_sizes.METHOD]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert json.loads(done.stdout.strip().splitlines()[-1])["kernels"] >= 1, name
    cubins = {p.stem for p in (tmp_path / "cache").rglob("*.cubin")}
    assert "_kf_conv0_in_s" in cubins, cubins  # the channels-last path's copy of its input
    assert all(c.endswith(any_sizes.SUFFIX) for c in cubins), cubins


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_every_case_with_an_any_size_path_is_correct_at_sizes_the_run_never_saw(tmp_path: Path) -> None:
    covered: list[str] = []
    jobs = []
    for name, case in ALL_CASES.items():
        source = _source(case, 0)
        plan = analyse(source)
        if isinstance(plan, Unsupported) or plan.sizes is None:
            continue
        for label, params in _variants(plan):
            rendered = render(plan, params)
            if f"def {any_sizes.METHOD}(self" not in rendered:
                continue
            if label == "plain":
                covered.append(name)
            s0 = plan.sizes.values
            points = [
                [max(1, (3 * s // 4) | 1) for s in s0],
                [2 * s + 3 + 2 * i for i, s in enumerate(s0)],
                [1] * len(s0),
            ]
            sized = [dict(zip(plan.sizes.names, p, strict=True)) for p in points]
            jobs.append(_job(f"{name} {label}", source, rendered, tmp_path, sized))
    outcomes = _check_in_child(jobs, tmp_path)
    bad = {k: v for k, v in outcomes.items() if not isinstance(v, int)}
    assert not bad, bad
    assert len(covered) >= COVERED, covered


def _variants(plan: Plan) -> list[tuple[str, TemplateParams]]:
    """Plain parameters, the run's first ones and a mutation of them (no TMA: the interpreter has
    no tensor descriptors)."""
    start = default_params(plan)
    mutant = mutate(plan, start, np.random.default_rng(3), diagnosis=None).with_changes(mm_tma=False)
    return [("plain", TemplateParams()), ("default", start), ("mutant", mutant)]


def _correct_at(plan: Plan, source: str, rendered: str, tmp_path: Path, sizes: tuple[tuple[int, ...], ...]) -> Any:
    """How many of ``sizes`` (values of the plan's sizes, in order) the rendered model matched the
    reference at, under the interpreter in a child process (or the error it raised)."""
    assert plan.sizes is not None
    points = [dict(zip(plan.sizes.names, p, strict=True)) for p in sizes]
    return _check_in_child([_job("sizes", source, rendered, tmp_path, points)], tmp_path)["sizes"]


def _job(label: str, source: str, rendered: str, tmp_path: Path, points: list[dict[str, int]]) -> dict[str, Any]:
    path = tmp_path / f"kf_sizes_{abs(hash(label))}.py"
    return {"label": label, "source": source, "rendered": rendered, "path": str(path), "points": points}


CHILD = """
import json, sys
from pathlib import Path
import torch
from tests.experts.test_template_any_size import _load

def flat(v):
    return [x for i in v for x in flat(i)] if isinstance(v, (tuple, list)) else [v]

out = {}
for job in json.loads(Path(sys.argv[1]).read_text()):
    try:
        module = _load(job["rendered"], Path(job["path"]))
        ns = {}
        exec(compile(job["source"], job["label"], "exec"), ns)
        checked = 0
        for point in job["points"]:
            ns.update(point)
            torch.manual_seed(0)
            inputs, init = list(ns["get_inputs"]()), list(ns["get_init_inputs"]())
            torch.manual_seed(1)
            reference = ns["Model"](*init)
            torch.manual_seed(1)
            candidate = module.ModelNew(*init)
            try:
                want = flat(reference(*inputs))
            except Exception:  # the reference refuses these sizes: nothing to compare
                continue
            got = flat(candidate(*inputs))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape, (point, g.shape, w.shape)
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"at {point}: {m}")
            checked += 1
        out[job["label"]] = checked
    except Exception as exc:
        out[job["label"]] = f"{type(exc).__name__}: {exc}"[:3000]
print(json.dumps(out))
"""
"""Runs the checks in a process of its own with ``TRITON_INTERPRET=1`` from its start (see
``test_template_any_batch``): the number of sizes checked per job, or the error that stopped it."""


def _check_in_child(jobs: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    return check_batches_in_child(jobs, tmp_path, CHILD)


SOFT_ASSIGN = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.centers = nn.Parameter(torch.randn(16, 12) * 0.25)
        self.norm = nn.BatchNorm1d(12)

    def forward(self, x):
        n = x.size(1)
        flat = x.view(-1, 16)
        weights = F.softmax(self.norm(flat @ self.centers), dim=1)[:, :8]
        weights = weights.view(-1, n, 8)
        return torch.matmul(weights.transpose(1, 2), x) - weights.sum(dim=1, keepdim=True).transpose(1, 2)

batch_size = 64
points = 100

def get_inputs():
    return [torch.randn(batch_size, points, 16)]

def get_init_inputs():
    return []
"""


def test_a_slice_that_keeps_a_dim_whole_takes_any_size_of_it(tmp_path: Path) -> None:
    # Soft assignment to clusters (NetVLAD-like): a batch norm over all batch x points rows, whose
    # sums are split by the row count, then a slice keeping every row and the first 8 clusters.
    # The slice's count of rows was a constant, so no plan at other sizes was the same: the model
    # had no copy for other sizes (KernelBench L3-46's best raised at every held-out shape).
    plan = analyse(SOFT_ASSIGN)
    assert isinstance(plan, Plan)
    assert plan.sizes is not None
    assert plan.sizes.names == ("batch_size", "points")
    rendered = render(plan, default_params(plan))
    assert f"def {any_sizes.METHOD}(self" in rendered
    assert _correct_at(plan, SOFT_ASSIGN, rendered, tmp_path, ((1, 2), (3, 7), (5, 100))) == 3
