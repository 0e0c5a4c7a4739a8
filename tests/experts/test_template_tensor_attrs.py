"""Plain tensor attributes of the reference (``tensor_attrs.py``: tensors ``__init__`` assigns to
``self`` that are neither parameters nor buffers): read as constants ``ModelNew`` holds too,
overwritten by ``copy_`` and read after, checked against PyTorch on the CPU under the Triton
interpreter; and the stateful uses, declined with the reason."""

from __future__ import annotations

import pytest
import torch

from actors.experts.template import Plan, Unsupported, analyse, default_params, render
from actors.experts.template.interp_check import Verdict, check_in_subprocess
from actors.experts.template.trace import trace_reference
from tests.experts.template_cases import HEAD, Case, _model

pytestmark = pytest.mark.timeout(300)

_RNN_CELL = _model(
    "",
    "self.hidden = torch.randn(($B, $H))\nself.i2h = nn.Linear($I + $H, $H)\nself.h2o = nn.Linear($H, $O)",
    "x, initial_hidden=None",
    "if initial_hidden is not None:\n    self.hidden.copy_(initial_hidden)\nself.hidden = self.hidden.to(x.device)\n"
    "combined = torch.cat((x, self.hidden), dim=1)\nself.hidden = torch.tanh(self.i2h(combined))\n"
    "return self.h2o(self.hidden)",
    "torch.rand($B, $I), torch.rand($B, $H)",
    "",
)

_SCALER = (
    "class Scaler(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
    "        self.scale = torch.randn(n)\n\n"
)

CASES: tuple[Case, ...] = (
    Case(
        "a_vanilla_rnn_cell_copies_its_initial_hidden_into_an_attribute_then_reads_it",
        _RNN_CELL,
        ({"B": 3, "I": 5, "H": 7, "O": 4},),
    ),
    Case(
        "constant_scale_and_offset_attributes_drawn_at_construction_one_on_a_submodule",
        _SCALER
        + _model(
            "",
            "self.offset = torch.randn(1, $N) * 0.5\nself.fc = nn.Linear($N, $N)\nself.scaler = Scaler($N)",
            "x",
            "return torch.relu(self.fc(x) * self.scaler.scale + self.offset)",
            "torch.randn($B, $N)",
            "",
        ),
        ({"B": 3, "N": 6},),
    ),
    Case(
        "an_attribute_overwritten_from_a_lower_rank_source_then_updated_in_place",
        _model(
            "",
            "self.state = torch.zeros(1, $N)",
            "x, s",
            "self.state.copy_(s)\nself.state.mul_(2.0)\nreturn x + self.state",
            "torch.randn($B, $N), torch.randn($N)",
            "",
        ),
        ({"B": 4, "N": 5},),
    ),
)


def _plan(source: str) -> Plan:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return plan


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdict]:
    jobs: list[dict[str, object]] = []
    for case in CASES:
        source = case.sources()[0]
        plan = _plan(source)
        jobs.append(
            {
                "reference": source,
                "candidate": render(plan, default_params(plan)),
                "seeds": [5, 6],
                "atol": 1e-4,
                "rtol": 1e-4,
            }
        )
    results = check_in_subprocess(jobs, tmp_path_factory.mktemp("interp-attrs"), timeout=280)
    return {case.name: verdict for case, verdict in zip(CASES, results, strict=True)}


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_tensor_attribute_kernels_match_pytorch_under_the_interpreter(case: str, verdicts: dict[str, Verdict]) -> None:
    assert verdicts[case].ok, verdicts[case]


def test_tracing_puts_back_an_attribute_forward_rebinds_and_records_it() -> None:
    traced = trace_reference(CASES[0].sources()[0])
    assert isinstance(traced.root.hidden, torch.Tensor)
    assert traced.rebound == frozenset({"hidden"})
    nodes = list(traced.graph_module.graph.nodes)
    assert nodes[-1].op == "output"  # nothing recorded after it from a proxy left on the module


def test_a_read_only_attribute_is_read_from_modelnew_on_the_kernels_device() -> None:
    plan = _plan(CASES[1].sources()[0])
    source = render(plan, default_params(plan))
    assert "self.scaler.scale.to(" in source
    assert "self.offset.to(" in source


def test_an_attribute_overwritten_before_any_read_is_never_read_by_modelnew() -> None:
    plan = _plan(CASES[0].sources()[0])
    assert "self.hidden" not in render(plan, default_params(plan)).split("def forward")[1]


@pytest.mark.parametrize(
    ("init", "forward", "inputs", "reason"),
    [
        (
            "self.h = torch.zeros(3, 4)",
            "self.h = torch.tanh(x + self.h)\nreturn self.h * 2.0",
            "torch.randn(3, 4)",
            "reads the tensor attribute 'h' before it rebinds it",
        ),
        (
            "self.acc = torch.zeros(3, 4)",
            "self.acc.add_(x)\nreturn self.acc * 1.0",
            "torch.randn(3, 4)",
            "updates the tensor attribute 'acc' in place from the value an earlier call left",
        ),
        (
            "self.h = torch.zeros(3, 4)",
            "y = x * self.h\nself.h.copy_(x)\nreturn y + self.h",
            "torch.randn(3, 4)",
            "reads the tensor attribute 'h' before it writes it",
        ),
        (
            "self.h = torch.zeros(3, 4)",
            "self.h.copy_(x)\nreturn self.h + 1.0",
            "torch.randn(3, 1)",
            "copy_ of shape (3, 1) into shape (3, 4) (a broadcast) is not covered",
        ),
        (
            "self.idx = torch.zeros(3, 4, dtype=torch.int64)",
            "return x * self.idx",
            "torch.randn(3, 4)",
            "tensor attribute 'idx' of torch.int64",
        ),
    ],
)
def test_stateful_and_uncovered_uses_of_an_attribute_are_declined_with_the_reason(
    init: str, forward: str, inputs: str, reason: str
) -> None:
    plan = analyse(HEAD + _model("", init, "x", forward, inputs, ""))
    assert isinstance(plan, Unsupported), plan
    assert reason in (plan.detail or ""), plan.detail


def test_an_attribute_rebound_before_any_read_is_covered() -> None:
    _plan(
        HEAD
        + _model(
            "",
            "self.h = torch.zeros(3, 4)",
            "x",
            "self.h = torch.tanh(x)\nreturn self.h + 1.0",
            "torch.randn(3, 4)",
            "",
        )
    )
