"""The reference's forward timed op by op in the referee: families, the module each op is charged
to, shares, and the profile carried on every verdict's baselines (issue 35, Amdahl's law)."""

from __future__ import annotations

import pytest
import torch

from gpu_runner.cli import summary_text
from gpu_runner.config import RunnerConfig
from gpu_runner.sandboxed.op_profile import family_of, profile_ops
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus, OpFamily, ReferenceProfile
from tests.gpu_runner.conftest import job


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


class _Net(torch.nn.Module):
    """A block in a Sequential, a shared head used twice and code in forward itself."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(_Block(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Linear(8 * 8 * 8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x).flatten(1)
        z = self.head(y)
        out: torch.Tensor = torch.softmax(z, dim=-1).cumsum(-1) + self.head(y)
        return out


@pytest.mark.parametrize(
    ("op", "family"),
    [
        ("aten::convolution", "conv"),
        ("aten::cudnn_convolution_transpose", "conv"),
        ("aten::addmm", "mm"),
        ("aten::bmm", "mm"),
        ("aten::_scaled_dot_product_flash_attention", "attn"),
        ("aten::_cudnn_rnn", "rec"),
        ("aten::native_batch_norm", "row"),
        ("aten::_softmax", "row"),
        ("aten::nll_loss_forward", "row"),
        ("aten::max_pool2d_with_indices", "pool"),
        ("aten::cumsum", "scan"),
        ("aten::cat", "layout"),
        ("aten::constant_pad_nd", "layout"),
        ("aten::convolution_backward", "other"),
    ],
)
def test_aten_ops_are_sorted_into_the_families_the_kernels_are(op: str, family: str) -> None:
    assert family_of(op) == family
    assert OpFamily(family)


def test_an_op_no_table_knows_is_elementwise_only_where_it_keeps_its_inputs_size() -> None:
    assert family_of("aten::hardswish", out_numel=100, in_numel=100) == "pw"
    assert family_of("aten::some_reduction", out_numel=10, in_numel=100) == "other"
    assert family_of("aten::mystery") == "other"


def test_each_op_is_charged_to_the_innermost_module_that_called_it_and_shares_add_up() -> None:
    torch.manual_seed(0)
    model = _Net().eval()
    raw = profile_ops(model, lambda: [torch.randn(2, 4, 16, 16)], torch.device("cpu"))
    profile = ReferenceProfile.model_validate(raw)

    assert profile.timer == "cpu clock per op"
    assert profile.forward_us > 0
    assert profile.ops_us > 0
    assert sum(f.share for f in profile.families) == pytest.approx(1.0)
    assert sum(o.share for o in profile.ops) == pytest.approx(1.0)
    where = {(o.module, o.op): o for o in profile.ops}
    assert where["features.0.conv", "aten::convolution"].family is OpFamily.CONV
    assert where["features.0.norm", "aten::native_batch_norm"].family is OpFamily.ROW
    assert where["features.0", "aten::relu"].family is OpFamily.PW  # the block's own forward
    assert where["features.1", "aten::max_pool2d_with_indices"].family is OpFamily.POOL
    assert where["head", "aten::addmm"].calls == 2  # the shared head, both calls
    assert where["", "aten::_softmax"].family is OpFamily.ROW  # Model.forward's own code
    assert where["", "aten::cumsum"].family is OpFamily.SCAN
    assert not any(o.op in ("aten::view", "aten::t", "aten::_unsafe_view") for o in profile.ops)  # views
    assert [f.time_us for f in profile.families] == sorted((f.time_us for f in profile.families), reverse=True)
    assert {o.family for o in profile.ops} <= {f.family for f in profile.families}


def test_the_hooks_that_name_modules_are_gone_after_the_profile() -> None:
    model = _Net().eval()
    profile_ops(model, lambda: [torch.randn(1, 4, 16, 16)], torch.device("cpu"))
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks


async def test_every_verdict_carries_the_referees_profile_of_the_reference() -> None:
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    async with EvaluationService(cfg) as service:
        result = await service.evaluate(job("linear_relu", "honest_linear_relu"))

    assert result.status is EvalStatus.CORRECT, result.summary
    assert result.baselines is not None
    assert result.baselines.profile is not None
    profile = result.baselines.profile
    ops = {(o.module, o.op): o.family for o in profile.ops}
    assert ops["linear", "aten::addmm"] is OpFamily.MM
    assert ops["", "aten::relu"] is OpFamily.PW
    assert {f.family for f in profile.families} == {OpFamily.MM, OpFamily.PW}
    said = summary_text(result)  # what kfoundry eval prints
    assert "reference's time by family: " in said
    assert "reference's largest ops: " in said
    assert "addmm in linear" in said
