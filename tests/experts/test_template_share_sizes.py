"""Kernels that differ only in constants share one function, the constants passed by their launches
(``const_args.py``, ``share(constants=True)``, the template parameter ``share_sizes``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.const_args import numbers, with_args
from actors.experts.template.hardware import lookup
from actors.experts.template.interp_check import check_in_subprocess
from actors.experts.template.share import Kernel, share
from actors.experts.template.tuning import SHARE_SIZES_FROM, relevant_params

KERNEL = """def _kf_row3(p8, p9, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * 4 + tl.arange(0, 32)
    n = 640
    rmask = rows < n
    width = 3136
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((32, 64), dtype=tl.float32)
    for k in range(0, 9 * 2):
        v = tl.load(p8 + rows[:, None] * width + cols[None, :], mask=rmask[:, None] & (cols < 3136)[None, :], other=0.0)
        acc += tl.sum(v, axis=1)[:, None]
    tl.store(p9 + rows, tl.sum(acc, axis=1) / 3136.0, mask=rmask)"""


def _movable(text: str, floats: bool = False) -> dict[tuple[int, int | float], bool]:
    """(line, value) → whether that constant may move (one entry per line and value)."""
    return {(n.line, n.value): ok for n, ok in numbers(text, floats)}


def test_constants_that_only_reach_run_time_values_may_move_and_shapes_and_axes_may_not() -> None:
    found = _movable(KERNEL)
    assert found[(1, 4)] is True  # a program's row offset: arithmetic on program_id
    assert found[(1, 0)] is False
    assert found[(1, 32)] is False
    assert found[(2, 640)] is True  # assigned to a name used only in a mask
    assert found[(4, 3136)] is True  # a stride through a name, into a load's pointer
    assert found[(6, 32)] is False
    assert found[(6, 64)] is False
    assert found[(7, 9)] is True
    assert found[(7, 2)] is True
    assert found[(8, 3136)] is True  # in a load's mask
    assert found[(9, 1)] is False  # an axis
    assert (10, 3136.0) not in found  # floats only where asked
    assert _movable(KERNEL, floats=True)[(10, 3136.0)] is True


def test_a_constant_that_reaches_a_shape_through_a_name_stays() -> None:
    text = """def _kf_pw1(p0, BLOCK: tl.constexpr):
    n = 16
    offs = tl.arange(0, n)
    tl.store(p0 + offs, tl.load(p0 + offs + 16))"""
    found = _movable(text)
    assert found[(1, 16)] is False  # n sizes an arange
    assert found[(3, 16)] is True


def test_a_constant_in_a_condition_a_subscript_or_an_unknown_call_stays() -> None:
    text = """def _kf_pw1(p0, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if 3 > 2:
        tl.store(p0 + offs, _helper(offs, 5))
    x = tl.load(p0 + offs)
    tl.store(p0 + offs, tl.where(offs < 7, x, x[None, :][0]) + tl.load(p0 + 4).to(tl.float32))"""
    found = _movable(text)
    assert found[(2, 3)] is False
    assert found[(2, 2)] is False
    assert found[(3, 5)] is False  # an argument of a helper whose parameters are not known
    assert found[(5, 7)] is True  # tl.where's condition
    assert found[(5, 0)] is False  # a subscript
    assert found[(5, 4)] is True  # through .to() into an expression of run-time values


def test_with_args_puts_the_constants_before_the_constexpr_parameters() -> None:
    text = "def KF(p_0, kf_o0, BLOCK: tl.constexpr):\n    tl.store(p_0 + kf_o0 + 12, 1.5)"
    (twelve, ok), (_, _) = numbers(text, floats=True)
    assert ok
    assert twelve.value == 12
    assert with_args(text, {twelve: "kf_c0"}) == (
        "def KF(p_0, kf_o0, kf_c0, BLOCK: tl.constexpr):\n    tl.store(p_0 + kf_o0 + kf_c0, 1.5)"
    )


def test_an_int_and_a_float_of_equal_values_are_two_arguments() -> None:
    def kernel(name: str, n: int) -> Kernel:
        text = f"@triton.jit\ndef {name}(p1, BLOCK: tl.constexpr):\n    tl.store(p1 + {n}, tl.load(p1) / {n}.0)"
        return Kernel(name, text, sized=True)

    shared = share([kernel("_kf_row1", 64), kernel("_kf_row2", 96)], constants=True, floats=True)
    assert shared.functions == 1
    assert shared.args["_kf_row1"] == {"kf_c0": 64, "kf_c1": 64.0}
    assert type(shared.args["_kf_row2"]["kf_c0"]) is int
    assert type(shared.args["_kf_row2"]["kf_c1"]) is float


def _row(name: str, width: int, rows: int, block: int = 32) -> str:
    return f"""@triton.jit
def {name}(p1, p2, BLOCK: tl.constexpr):
    r{name[-1]} = tl.program_id(0) * {block} + tl.arange(0, {block})
    v = tl.load(p1 + r{name[-1]} * {width}, mask=r{name[-1]} < {rows}, other=0.0)
    tl.store(p2 + r{name[-1]}, v * 2, mask=r{name[-1]} < {rows})"""


def test_kernels_differing_in_movable_constants_become_one_function_and_launches_pass_theirs() -> None:
    kernels = [
        Kernel("_kf_row1", _row("_kf_row1", 64, 640), (("p2", 128),), sized=True),
        Kernel("_kf_row2", _row("_kf_row2", 96, 960), (("p2", 4096),), sized=True),
        Kernel("_kf_row3", _row("_kf_row3", 64, 640, block=64), sized=True),  # another arange: its own
        Kernel("_kf_row4", _row("_kf_row4", 32, 320)),  # not launched with the shared arguments
    ]
    plain = share(kernels)
    assert plain.functions == 4
    shared = share(kernels, constants=True)
    assert shared.functions == 3
    first = shared.texts["_kf_row1"]
    assert "def _kf_row1(p_0, p_1, kf_o0, kf_c0, kf_c1, BLOCK: tl.constexpr):" in first, first
    assert "tl.arange(0, 32)" in first, first
    assert "* kf_c0" in first, first
    assert "< kf_c1" in first, first
    assert shared.texts["_kf_row2"] == "_kf_row2 = _kf_row1"
    assert shared.args["_kf_row1"] == {"kf_o0": 128, "kf_c0": 64, "kf_c1": 640}
    assert shared.args["_kf_row2"] == {"kf_o0": 4096, "kf_c0": 96, "kf_c1": 960}
    # the 2 of `v * 2` is the same in both: it stays a constant
    assert "v * 2" in first
    assert "kf_c" not in shared.texts["_kf_row3"]
    assert "kf_c" not in shared.texts["_kf_row4"]


WIDENING = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        widths = [32, 64, 96, 128]
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU())
                for a, b in zip(widths, widths[1:])
            ]
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = self.blocks(x)
        return self.head(x.mean(dim=(2, 3)))


batch_size = 2


def get_inputs():
    return [torch.randn(batch_size, 32, 6, 7)]


def get_init_inputs():
    return []
"""


def _widening() -> tuple[Plan, str, str]:
    plan = analyse(WIDENING)
    assert isinstance(plan, Plan), plan
    hw = lookup("NVIDIA H100 80GB HBM3")
    assert hw is not None
    params = default_params(plan, hw, tf32=True).with_changes(conv_precision="ieee")
    return (
        plan,
        render(plan, params.with_changes(share_sizes=False)),
        render(plan, params.with_changes(share_sizes=True)),
    )


def _main_defs(text: str) -> list[str]:
    """The functions of the task's own shape (not the copies for other batches)."""
    return [d for d in re.findall(r"^def (_kf_\w+)\(", text, re.M) if not d.endswith("_b")]


def test_layers_of_other_widths_share_their_functions_with_share_sizes() -> None:
    plan, apart, together = _widening()
    sites = re.findall(r"^_L(_kf_\w+) = _KfLaunch", together, re.M)
    assert sites == re.findall(r"^_L(_kf_\w+) = _KfLaunch", apart, re.M)
    convs = [s for s in sites if re.fullmatch(r"_kf_conv\d+", s)]
    assert len(convs) == 3, convs
    aliases = dict(re.findall(r"^(_kf_\w+) = (_kf_\w+)$", together, re.M))
    # the first convolution's 32 input channels are one step of its reduction (other code); the
    # second's 64 and the third's 96 are two and three: one function
    assert aliases.get(convs[2]) == convs[1], aliases
    assert convs[1] not in aliases, aliases
    assert convs[0] not in aliases, aliases
    assert len(_main_defs(together)) < len(_main_defs(apart)), (_main_defs(together), _main_defs(apart))
    # each convolution's launch passes its own channel counts
    passed = {
        name: dict(re.findall(r"(kf_c\d+)=(\d+)", line))
        for name, line in re.findall(r"^_L(_kf_conv\d+) = _KfLaunch\((.*)$", together, re.M)
    }
    assert passed[convs[1]], passed
    assert passed[convs[1]] != passed[convs[2]], passed
    assert set(passed[convs[1]]) == set(passed[convs[2]]), passed
    # the switch is the tuner's only for plans of many kernels
    assert len(sites) < SHARE_SIZES_FROM
    assert not default_params(plan).share_sizes
    assert "share_sizes" not in relevant_params(plan, default_params(plan))


def test_the_copies_for_other_batches_share_theirs_too_and_their_launches_pass_them() -> None:
    _, apart, together = _widening()
    mine, theirs = (re.findall(r"^def (_kf_\w+_b)\(", text, re.M) for text in (together, apart))
    assert 0 < len(mine) < len(theirs), (mine, theirs)
    launched = re.findall(r"^\s+(_kf_conv\d+_b)\[.*\]\((kf_B, .*)\)$", together, re.M)
    assert len(launched) == 3, launched
    passing = [args for _, args in launched if "kf_c" in args]
    assert len(passing) >= 2, launched


@pytest.mark.timeout(900)
def test_layers_sharing_their_functions_are_right_at_the_task_s_batch_and_at_others(tmp_path: Path) -> None:
    from tests.experts.test_template_any_batch import _check_in_child, _job

    plan, _, together = _widening()
    verdict = check_in_subprocess(
        [{"reference": WIDENING, "candidate": together, "seeds": [3, 4], "atol": 1e-4, "rtol": 1e-4}], tmp_path
    )[0]
    assert verdict.ok, verdict
    outcomes = _check_in_child([_job("widening", WIDENING, plan, together, tmp_path)], tmp_path)
    assert outcomes == {"widening": [1, 3]}, outcomes


def test_names_that_feed_each_other_in_a_loop_are_judged_together() -> None:
    # a and b feed each other; b also sizes an arange: neither constant may move, whatever order
    # the names are looked at in
    text = """def _kf_pw1(p0, BLOCK: tl.constexpr):
    a = 4
    b = 8
    for k in range(0, 3):
        a = b + 1
        b = a * 2
    tl.store(p0 + tl.arange(0, b), 1.0)
    c = 5
    tl.store(p0 + c, 1.0)"""
    found = _movable(text)
    assert found[(1, 4)] is False
    assert found[(2, 8)] is False
    assert found[(4, 1)] is False
    assert found[(7, 5)] is True


def test_a_copys_launch_line_gets_its_kernels_constants_and_an_unknown_form_is_refused() -> None:
    from actors.experts.template.render import _passing

    method = "    def m(self, kf_B, x):\n        _kf_row1_b[(kf_B,)](kf_B, x, BLOCK=64, num_warps=4, num_stages=1)\n"
    args = {"_kf_row1_b": {"kf_c0": 96}}
    assert "(kf_B, x, BLOCK=64, kf_c0=96, num_warps=4, num_stages=1)" in _passing(method, args)
    assert _passing(method, {}) == method
    with pytest.raises(ValueError, match="_kf_row1_b"):  # render then keeps the copies' constants
        _passing(method.replace(", num_stages=1)", ")"), args)
