"""A whole model's later layers get launch shapes of their own: the row and convolution parameters
are chosen for the first kernel of each kind (the defaults and the GPU model read it), and a later
layer with shorter rows, fewer positions or more channels takes more rows per program, fewer warps
and smaller convolution tiles (``emit_row.row_shape``, ``ConvWriter._spread``); the TF32 weight
packing reads the weights in order (``ConvWriter._tap_major_rounding``). Checked on the rendered
launches and, under Triton's interpreter, on the outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import lookup
from actors.experts.template.interp_check import check_in_subprocess

LAYERS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.b2 = nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.b3 = nn.BatchNorm2d(64)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return torch.relu(self.b3(self.c3(x)))


def get_inputs():
    return [torch.randn(2, 3, 16, 16)]


def get_init_inputs():
    return []
"""

_LAUNCH = re.compile(r"^_L_(kf_(?:row|conv)\d+(?:_wr)?) = _KfLaunch\(\w+, \(([^)]*)\), (.*)\)$", re.M)


def _first_candidate() -> str:
    plan = analyse(LAYERS)
    assert isinstance(plan, Plan), plan
    hw = lookup("NVIDIA H100 80GB HBM3")
    assert hw is not None
    return render(plan, default_params(plan, hw, tf32=True))


def _launches(source: str) -> dict[str, tuple[int, dict[str, int]]]:
    """Kernel name -> (programs, constexprs and num_warps) of the task-shape launch table."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for name, grid, rest in _LAUNCH.findall(source):
        programs = 1
        for g in grid.split(","):
            if g.strip():
                programs *= int(g)
        values = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}
        out.setdefault(name, (programs, values))
    return out


def test_later_layers_take_rows_warps_and_tiles_of_their_own() -> None:
    launches = _launches(_first_candidate())
    rows = [
        v
        for k, v in sorted(launches.items(), key=lambda kv: int(re.sub(r"\D", "", kv[0])))
        if "BLOCK_M" in v[1] and "row" in k
    ]
    # the three batch norms' per-(image, channel) statistics: rows of 256, 64 and 16 positions
    stats = [(p, v) for p, v in rows if v["BLOCK_R"] in (256, 64, 16)]
    assert [v["BLOCK_R"] for _, v in stats] == [256, 64, 16], rows
    (p1, first), (p2, second), (p3, third) = stats
    assert first["BLOCK_M"] < second["BLOCK_M"] < third["BLOCK_M"], stats
    assert third["num_warps"] <= second["num_warps"] <= first["num_warps"], stats
    # the later ones: no more warps than give each thread 8 elements of the tile
    assert all(v["num_warps"] == 1 or v["BLOCK_M"] * v["BLOCK_R"] >= 256 * v["num_warps"] for _, v in stats[1:]), stats
    # and programs enough: never fewer than the first kernel launches
    assert min(p2, p3) >= min(p1, 32), stats
    convs = [
        launches[k] for k in sorted(launches, key=lambda n: int(re.sub(r"\D", "", n))) if re.fullmatch(r"kf_conv\d+", k)
    ]
    assert len(convs) == 3, launches
    tiles = [v["BLOCK_M"] * v["BLOCK_N"] for _, v in convs]
    assert tiles[0] > tiles[1] > tiles[2], convs
    assert all(p >= convs[0][0] for p, _ in convs[1:]), convs
    # the weights are packed by the tiled transpose (taps inside a program's block)
    assert all("TAPS" in launches[k][1] for k in launches if k.endswith("_wr")), launches


@pytest.mark.timeout(300)
def test_the_first_candidate_of_a_three_layer_model_is_right_under_the_interpreter(tmp_path: Path) -> None:
    # TF32 operands (rounded to nearest, as cuDNN's): within TF32's error of the fp32 reference
    verdict = check_in_subprocess(
        [{"reference": LAYERS, "candidate": _first_candidate(), "seeds": [5], "atol": 2e-2, "rtol": 2e-2}],
        tmp_path,
    )[0]
    assert verdict.ok, verdict
    assert verdict.err_vs_fp64 is not None, verdict
    assert verdict.err_vs_fp64 < 5e-3, verdict


def _any_batch_candidate() -> tuple[str, str]:
    """The three-layer model with a module-level batch (so the candidate has any-batch copies),
    rendered with the GPU model's first tiles in IEEE fp32 (exact enough to compare at 1e-4)."""
    source = LAYERS.replace("torch.randn(2, 3, 16, 16)", "torch.randn(batch_size, 3, 16, 16)").replace(
        "def get_inputs", "batch_size = 2\n\n\ndef get_inputs"
    )
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    hw = lookup("NVIDIA H100 80GB HBM3")
    assert hw is not None
    return source, render(plan, default_params(plan, hw, tf32=True).with_changes(conv_precision="ieee"))


_COPY = re.compile(r"(_kf_(?:row|conv)\d+)_b\[.*?\]\(kf_B, [^)]*?((?:BLOCK_\w+=\d+, )+)num_warps=(\d+)")


@pytest.mark.slow  # ~4 s on a 2-core host; the default run keeps the three-layer model's first candidate
@pytest.mark.timeout(600)
def test_the_any_batch_copies_take_the_later_layers_shapes_too_and_hold_at_other_batches(tmp_path: Path) -> None:
    from tests.experts.test_template_any_batch import _check_in_child, _job

    source, rendered = _any_batch_candidate()
    copies: dict[str, dict[str, int]] = {}
    for name, blocks, warps in _COPY.findall(rendered):
        copies[name] = {**{k: int(v) for k, v in re.findall(r"(BLOCK_\w+)=(\d+)", blocks)}, "num_warps": int(warps)}
    stats = [v for v in copies.values() if "BLOCK_M" in v and v.get("BLOCK_R") in (256, 64, 16)]
    assert [v["BLOCK_R"] for v in stats] == [256, 64, 16], copies
    assert stats[0]["BLOCK_M"] < stats[1]["BLOCK_M"] < stats[2]["BLOCK_M"], stats
    convs = [v for k, v in copies.items() if "conv" in k]
    assert len(convs) == 3, copies
    assert convs[0]["BLOCK_M"] * convs[0]["BLOCK_N"] > convs[2]["BLOCK_M"] * convs[2]["BLOCK_N"], convs
    plan = analyse(source)
    assert isinstance(plan, Plan)
    outcomes = _check_in_child([_job("layers", source, plan, rendered, tmp_path)], tmp_path)
    assert outcomes == {"layers": [1, 3]}, outcomes


BRANCHES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 16, 1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 16, 1)

    def forward(self, x):
        return torch.cat([self.a(x), torch.relu(self.b(x)), self.c(torch.tanh(x))], dim=1)


def get_inputs():
    return [torch.randn(2, 8, 9, 11)]


def get_init_inputs():
    return []
"""


@pytest.mark.timeout(300)
def test_convolutions_of_one_input_share_its_channels_last_copy(tmp_path: Path) -> None:
    plan = analyse(BRANCHES)
    assert isinstance(plan, Plan), plan
    params = default_params(plan).with_changes(
        conv_taps_outer=True, conv_layout="nhwc", conv_precision="ieee", conv_block_n=16
    )
    rendered = render(plan, params)
    forward = rendered[rendered.index("    def forward") :]
    task = forward[: forward.index("return")]
    # two convolutions read x: one copy of it; the third reads tanh(x): a copy of its own
    copies = re.findall(r"_L_kf_conv\d+_in\(", task)
    assert len(copies) == 2, task
    convs = re.findall(r"_L_kf_conv\d+\(", task)
    assert len(convs) == 3, task
    verdict = check_in_subprocess(
        [{"reference": BRANCHES, "candidate": rendered, "seeds": [2], "atol": 1e-4, "rtol": 1e-4}], tmp_path
    )[0]
    assert verdict.ok, verdict
