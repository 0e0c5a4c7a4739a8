"""Batch norm, instance norm, vector norms and a whole conv block, under the Triton interpreter.

Every reference of ``template_norm_cases`` at each of its sizes, in the variants of
``template_interp`` (default, stress with multi-pass rows and no fusion, mutant, 64-bit).
"""

from __future__ import annotations

import pytest

from actors.experts.template import default_params, render
from actors.experts.template.fuse import KernelKind, schedule
from actors.experts.template.interp_check import Verdict
from actors.experts.template.ir import NodeKind
from tests.experts.template_interp import assert_all_correct, interp_verdicts, plan_of
from tests.experts.template_norm_cases import GRAPH_CASES, NORM_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"row_block_m": 2, "row_block_r": 64, "row_block_i": 8, "row_one_pass": False, "pw_ept": 1}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    return interp_verdicts((*NORM_CASES, *GRAPH_CASES), _STRESS, tmp_path_factory.mktemp("interp-norm"))


@pytest.mark.parametrize("case", [c.name for c in (*NORM_CASES, *GRAPH_CASES)])
def test_norm_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


def _norm_source(module: str, shape: str) -> str:
    """A reference whose forward is the norm module ``module`` on ``torch.rand`` of ``shape``."""
    return (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        self.norm = {module}\n\n    def forward(self, x):\n"
        f"        return self.norm(x)\n\n\ndef get_inputs():\n    return [torch.rand{shape}]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


_BIG_NORMS = {
    "batch_norm": ("nn.BatchNorm2d(64)", "(64, 64, 512, 512)"),
    "group_norm": ("nn.GroupNorm(8, 64)", "(112, 64, 512, 512)"),
    "layer_norm": ("nn.LayerNorm((64, 256, 256))", "(16, 64, 256, 256)"),
}


@pytest.mark.parametrize("name", sorted(_BIG_NORMS))
def test_a_norm_whose_statistics_take_two_kernels_stores_no_full_size_intermediate(name: str) -> None:
    """The normalised output's ``x - mean`` is computed where the output is, from ``x`` and the
    small mean: the kernel that reduces the variance does not store its own ``x - mean`` for it
    (an extra write and read of the whole tensor: batch norm at 33% of speed-of-light on an H200)."""
    plan = plan_of(_norm_source(*_BIG_NORMS[name]))
    sched = schedule(plan, default_params(plan))
    assert sum(k.kind is KernelKind.ROW for k in sched.kernels) >= 2  # statistics in two stages
    full = plan.nodes[plan.output].numel
    stored = [nid for k in sched.kernels for nid in k.exports if plan.nodes[nid].numel == full]
    assert stored == [plan.output], [plan.nodes[n] for n in stored]


_READ_TWICE = {**_BIG_NORMS, "instance_norm": ("nn.InstanceNorm2d(64)", "(112, 64, 256, 256)")}


@pytest.mark.parametrize("name", sorted(_READ_TWICE))
def test_a_norm_at_kernelbench_sizes_reads_its_input_twice(name: str) -> None:
    """Once for the statistics (the mean and the squared deviations from one read: Welford per
    lane, Chan's merge over split parts and over the batch) and once for the output; the two
    statistics' passes made three reads of the whole tensor before."""
    plan = plan_of(_norm_source(*_READ_TWICE[name]))
    assert plan.nodes[0].kind is NodeKind.INPUT
    rendered = render(plan, default_params(plan))
    assert rendered.count("tl.load(p0 + ") == 2, rendered
