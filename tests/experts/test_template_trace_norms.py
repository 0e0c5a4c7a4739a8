"""Tracing takes a batch or instance norm module's output shape from its input (``trace._kept_shape``)
instead of running PyTorch's decomposition on meta tensors; every traced value must still be the
one the module computes, and modules of other types (a subclass with its own ``forward``) or other
calls keep the ordinary path."""

from __future__ import annotations

import torch

from actors.experts.template.trace import _kept_shape, trace_reference

_SOURCE = """
import torch
import torch.nn as nn

class Squeezing(nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x).mean(dim=1)

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        self.inorm = nn.InstanceNorm2d(c, affine=True)
        self.bn1 = nn.BatchNorm1d(c)
        self.bn3 = nn.BatchNorm3d(c)
        self.squeeze = Squeezing(c)

    def forward(self, x):
        y = self.inorm(self.bn(x))
        z = self.bn1(y.flatten(2))
        w = self.bn3(y.unsqueeze(2))
        return z.sum() + w.sum() + self.squeeze(y)

def get_inputs():
    return [torch.rand(2, 3, 5, 7)]

def get_init_inputs():
    return [3]
"""


def test_traced_values_of_norm_modules_are_what_the_modules_compute() -> None:
    traced = trace_reference(_SOURCE)
    namespace: dict[str, object] = {}
    exec(_SOURCE, namespace)
    model = namespace["Model"](3)  # type: ignore[operator]
    real: dict[str, torch.Tensor] = {}
    hooks = [
        module.register_forward_hook(lambda _m, _a, out, name=name: real.__setitem__(name, out))
        for name, module in model.named_modules()
        if name
    ]
    model(*namespace["get_inputs"]())  # type: ignore[operator]  # training mode, as traced
    for hook in hooks:
        hook.remove()
    modules = {n.target: n for n in traced.graph_module.graph.nodes if n.op == "call_module"}
    assert set(modules) == {"bn", "inorm", "bn1", "bn3"}  # the subclass is traced through
    for name, node in modules.items():
        value = traced.values[node]
        assert value.shape == real[name].shape, name
        assert value.dtype == real[name].dtype, name
    output = next(n for n in traced.graph_module.graph.nodes if n.op == "output")
    assert traced.values[output.args[0]].shape == real["squeeze"].shape == (2, 5, 7)


def test_only_plain_norm_calls_on_meta_tensors_of_their_channels_take_the_input_shape() -> None:
    bn = torch.nn.BatchNorm2d(4)
    meta = torch.empty(2, 4, 3, 3, device="meta")
    kept = _kept_shape(bn, (meta,), {})
    assert kept is not None
    assert kept.shape == meta.shape
    assert kept.device.type == "meta"
    assert _kept_shape(bn, (torch.empty(2, 5, 3, 3, device="meta"),), {}) is None  # other channels
    assert _kept_shape(bn, (torch.empty(2, 4, 3, 3),), {}) is None  # a real tensor: computed
    assert _kept_shape(torch.nn.LayerNorm(3), (meta,), {}) is None  # not a batch or instance norm

    class Sub(torch.nn.BatchNorm2d):
        pass

    assert _kept_shape(Sub(4), (meta,), {}) is None
