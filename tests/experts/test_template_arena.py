"""Where a rendered forward keeps its intermediates (``arena.py``): one buffer per dtype, space
reused once a tensor is dead, never while it is live, and tensors that PyTorch code, a shape
check or an output touches left as tensors of their own."""

from __future__ import annotations

import pytest

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.arena import ALIGN, place
from actors.experts.template.emit import Launch

pytestmark = pytest.mark.timeout(120)


def _launch(name: str, pointers: list[int], lead: tuple[str, ...] = ()) -> Launch:
    params = [*(["dst"] if lead else []), *(f"p{b}" for b in pointers)]
    return Launch(
        source=f"@triton.jit\ndef {name}({', '.join(params)}, BLOCK: tl.constexpr):\n    pass",
        name=name,
        pointers=pointers,
        grid=(1,),
        constexprs={"BLOCK": 128},
        num_warps=4,
        num_stages=1,
        lead_args=lead,
    )


def test_dead_tensors_space_is_reused_and_live_ones_never_overlap() -> None:
    # k0 writes b1; k1 reads b1, writes b2; k2 reads b2, writes b3; k3 reads b3: b1 dies at k1
    stages = [
        [_launch("k0", [0, 1])],
        [_launch("k1", [1, 2])],
        [_launch("k2", [2, 3])],
        [_launch("k3", [3, 4])],
    ]
    members = {f"_b{n}": (n - 1, (1000,), "float32") for n in (1, 2, 3)}
    arena = place(stages, members, texts=["return _b4"])
    size = 1024  # 1000 rounded up to the alignment
    assert size % ALIGN == 0
    offsets = {name: arena.slots[name][1] for name in members}
    assert offsets["_b1"] != offsets["_b2"]  # both live in k1
    assert offsets["_b2"] != offsets["_b3"]  # both live in k2
    assert offsets["_b3"] == offsets["_b1"]  # b1 died at k1: its space comes back
    assert arena.sizes == {"_ws_float32": ("float32", 2 * size)}
    # each kernel moves the pointers of its members to their offsets (0 included: share.py passes it)
    moved = {k: dict(v) for k, v in arena.shifts.items()}
    for name, params in moved.items():
        for param, offset in params.items():
            assert offset % ALIGN == 0, (name, param)
    slots = {param: arena.slots[f"_b{param[1:]}"][1] for params in moved.values() for param in params}
    assert all(offset == slots[param] for params in moved.values() for param, offset in params.items()), moved
    assert arena.arg("_b4") == "_b4"
    assert arena.arg("_b2") == "_ws_float32"


def test_a_tensor_named_outside_kernel_arguments_keeps_its_own_allocation() -> None:
    stages = [[_launch("k0", [0, 1])], [_launch("k1", [1, 2])], [_launch("k2", [2, 3])]]
    members = {"_b1": (0, (64,), "float32"), "_b2": (1, (64,), "float32"), "_xc2": (2, (64,), "float32")}
    arena = place(stages, members, texts=["_b5 = torch.relu(_b2)", "return _b3"])
    assert "_b2" not in arena.slots  # read by PyTorch code
    assert "_xc2" not in arena.slots  # no kernel passes it
    assert set(arena.slots) == {"_b1"}


def test_dtypes_get_buffers_of_their_own() -> None:
    stages = [[_launch("k0", [0, 1, 2])], [_launch("k1", [1, 2, 3])]]
    members = {"_b1": (0, (10,), "float32"), "_b2": (0, (10,), "int64")}
    arena = place(stages, members, texts=[])
    assert arena.slots == {"_b1": ("_ws_float32", 0), "_b2": ("_ws_int64", 0)}


def test_a_rendered_model_allocates_its_intermediates_once() -> None:
    source = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.n = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.b(torch.relu(self.n(self.a(x)))).sum(dim=(2, 3))


def get_inputs():
    return [torch.randn(2, 4, 12, 12)]


def get_init_inputs():
    return []
"""
    plan = analyse(source)
    assert isinstance(plan, Plan)
    text = render(plan, default_params(plan))
    forward = text[text.index("    def forward") :]
    assert forward.count("torch.empty(") == 2  # the arena and the output
    assert "_ws_float32 = torch.empty(" in forward
