"""Kernels of one rendered file that are the same code share one ``triton.jit`` function
(``share.py``): canonical forms (numbered locals renamed, arena offsets as run-time arguments),
names of the first kernel for the others, and launch sites that pass their own offsets. Checked
on the texts and, under Triton's interpreter, on a model whose layers repeat, at its own batch
and through its any-batch copies at others."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.hardware import lookup
from actors.experts.template.interp_check import check_in_subprocess
from actors.experts.template.share import Kernel, canonical, share

ROW_A = """@triton.jit
def _kf_row3(p8, p9, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    l1 = tl.load(p8 + offs, mask=offs < 64, other=0.0)
    v10 = tl.exp2(l1).to(tl.float32)
    tl.store(p9 + offs, v10, mask=offs < 64)"""

ROW_B = ROW_A.replace("_kf_row3", "_kf_row7").replace("p8", "p40").replace("p9", "p41").replace("v10", "v42")


def test_canonical_forms_rename_numbered_locals_in_order_and_nothing_else() -> None:
    text = canonical(ROW_A, "_kf_row3")
    assert "def KF(p_0, p_1, BLOCK: tl.constexpr):" in text
    assert "l_2 = tl.load(p_0 + offs, mask=offs < 64, other=0.0)" in text
    assert "v_3 = tl.exp2(l_2).to(tl.float32)" in text  # attributes (exp2, float32) stay
    assert canonical(ROW_B, "_kf_row7") == text
    # a kernel that differs in a constant is another form
    assert canonical(ROW_B.replace("< 64", "< 65"), "_kf_row7") != text


def test_a_local_spelt_as_a_keyword_keeps_the_kernel_as_it_is() -> None:
    odd = ROW_A.replace("mask=offs < 64, other", "mask=offs < 64, l1=1, other")
    with pytest.raises(ValueError, match="keyword"):
        canonical(odd, "_kf_row3")
    shared = share([Kernel("_kf_row3", odd, (("p8", 128),)), Kernel("_kf_row7", ROW_B, (("p40", 256),))])
    assert shared.functions == 2
    assert "    p8 = p8 + 128" in shared.texts["_kf_row3"]
    assert shared.args == {}


def test_kernels_of_one_code_become_one_function_with_offsets_from_their_launches() -> None:
    kernels = [
        Kernel("_kf_row3", ROW_A, (("p9", 4096), ("p8", 1024))),
        Kernel("_kf_row7", ROW_B, (("p41", 8192), ("p40", 64))),
        Kernel("_kf_row9", ROW_B.replace("_kf_row7", "_kf_row9"), (("p41", 128),)),  # one offset: another form
        Kernel("_kf_pw1", ROW_A.replace("_kf_row3", "_kf_pw1").replace("tl.exp2", "tl.exp")),
    ]
    shared = share(kernels)
    assert shared.functions == 3
    first = shared.texts["_kf_row3"]
    assert first.startswith("@triton.jit\ndef _kf_row3(p_0, p_1, kf_o0, kf_o1, BLOCK: tl.constexpr):"), first
    # offsets numbered in the parameters' order, whatever order the arena listed them in
    assert "    p_0 = p_0 + kf_o0\n    p_1 = p_1 + kf_o1\n" in first
    assert shared.texts["_kf_row7"] == "_kf_row7 = _kf_row3"
    assert shared.args["_kf_row3"] == {"kf_o0": 1024, "kf_o1": 4096}
    assert shared.args["_kf_row7"] == {"kf_o0": 64, "kf_o1": 8192}
    # alone: its own text with its constant offset, nothing passed
    assert "    p41 = p41 + 128" in shared.texts["_kf_row9"]
    assert "_kf_row9" not in shared.args
    assert shared.texts["_kf_pw1"] == kernels[3].source


REPEATED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(
            *[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()) for _ in range(3)]
        )

    def forward(self, x):
        return self.blocks(x) * 0.5


batch_size = 2


def get_inputs():
    return [torch.randn(batch_size, 16, 6, 7)]


def get_init_inputs():
    return []
"""


def _repeated() -> tuple[Plan, str]:
    plan = analyse(REPEATED)
    assert isinstance(plan, Plan), plan
    hw = lookup("NVIDIA H100 80GB HBM3")
    assert hw is not None
    return plan, render(plan, default_params(plan, hw, tf32=True).with_changes(conv_precision="ieee"))


def test_a_model_of_repeated_layers_compiles_each_layer_s_code_once() -> None:
    _, rendered = _repeated()
    defs = re.findall(r"^def (_kf_\w+)\(", rendered, re.M)
    aliases = dict(re.findall(r"^(_kf_\w+) = (_kf_\w+)$", rendered, re.M))
    # three convolutions, each with its batch norm and ReLU: the second and third are the first's names
    convs = re.findall(r"^_L(_kf_conv\d+) = _KfLaunch", rendered, re.M)
    assert len(convs) == 3, convs
    assert aliases.get(convs[1]) == convs[0], aliases
    assert aliases.get(convs[2]) == convs[0], aliases
    assert len(aliases) >= 4, aliases
    # every launch of a shared kernel whose buffers moved passes its own offsets
    sites = re.findall(r"^_L(_kf_\w+) = _KfLaunch\((\w+), .*?((?:kf_o\d+=\d+, )*)BLOCK", rendered, re.M)
    moved = [(name, fn, offsets) for name, fn, offsets in sites if offsets]
    assert moved, sites
    # fewer functions than launch sites, the copies for other batches shared as well
    assert len(defs) < len(sites) + len(re.findall(r"^def _kf_\w+_b\(", rendered, re.M)), (defs, sites)
    assert any(name.endswith("_b") for name in aliases), aliases


@pytest.mark.timeout(600)
def test_shared_kernels_are_right_at_the_task_s_batch_and_at_others(tmp_path: Path) -> None:
    from tests.experts.test_template_any_batch import _check_in_child, _job

    plan, rendered = _repeated()
    verdict = check_in_subprocess(
        [{"reference": REPEATED, "candidate": rendered, "seeds": [3], "atol": 1e-4, "rtol": 1e-4}], tmp_path
    )[0]
    assert verdict.ok, verdict
    outcomes = _check_in_child([_job("repeated", REPEATED, plan, rendered, tmp_path)], tmp_path)
    assert outcomes == {"repeated": [1, 3]}, outcomes
