"""Batch norm, instance norm, vector norms and a whole conv block, under the Triton interpreter.

Every reference of ``template_norm_cases`` at each of its sizes, in the variants of
``template_interp`` (default, stress with multi-pass rows and no fusion, mutant, 64-bit). The
default run checks every case but the two costliest under the interpreter
(:data:`_IN_THE_SLOW_RUN`); the slow run checks those.
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


_CASES = (*NORM_CASES, *GRAPH_CASES)

_IN_THE_SLOW_RUN = frozenset({"batchnorm1d_many_rows", "resnet_helper_classes_and_methods"})
"""The cases only the slow run checks, about half of the module's interpreter time on a 2-core host:
a batch norm of 16384 rows (two row kernels and an elementwise one, as ``batchnorm2d_training_relu``,
which stays) and the second whole block (the first, with a class constant and a helper, stays)."""


def _by_default(case: str, size: int, variant: str) -> bool:
    """Whether the default run checks this candidate (:data:`_IN_THE_SLOW_RUN`)."""
    return case not in _IN_THE_SLOW_RUN


def _in_the_slow_run(case: str, size: int, variant: str) -> bool:
    return not _by_default(case, size, variant)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the default run checks."""
    return interp_verdicts(_CASES, _STRESS, tmp_path_factory.mktemp("interp-norm"), select=_by_default)


@pytest.fixture(scope="module")
def slow_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the slow run checks."""
    return interp_verdicts(_CASES, _STRESS, tmp_path_factory.mktemp("interp-norm-slow"), select=_in_the_slow_run)


@pytest.mark.parametrize("case", [c.name for c in _CASES if c.name not in _IN_THE_SLOW_RUN])
def test_norm_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(verdicts[case])


@pytest.mark.slow  # ~4 s of the module's ~8 s of interpreter time on a 2-core host
@pytest.mark.parametrize("case", [c.name for c in _CASES if c.name in _IN_THE_SLOW_RUN])
def test_the_costliest_norm_kernels_match_pytorch_under_the_interpreter(
    case: str, slow_verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    assert_all_correct(slow_verdicts[case])


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
