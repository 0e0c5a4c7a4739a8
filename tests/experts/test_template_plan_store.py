"""Plans kept on disk between runs (``plan_store``): a task analysed once is read back, by source,
policy and code; what does not read back is analysed again; the store stays bounded."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from actors.experts.template import Plan, analyse
from actors.experts.template.expert import AnalysisMode, TemplateExpert
from actors.experts.template.ir import KeepTorch
from actors.experts.template.plan_store import PlanStore, code_fingerprint
from actors.experts.template.render import render
from actors.experts.template.tuning import default_params
from schemas import GenerateRequest, Task
from tests.experts.template_cases import CASES

_SOURCES = [next(c for c in CASES if c.name == name).sources()[0] for name in ("gemm_mean_softmax", "linear_relu")]


def _plan(source: str) -> Plan:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return plan


def test_a_kept_plan_reads_back_for_its_source_and_policy_only(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    source = _SOURCES[0]
    assert store.get(source, KeepTorch.LAYOUT) is None
    plan = _plan(source)
    store.put(source, KeepTorch.LAYOUT, plan)
    assert store.get(source, KeepTorch.LAYOUT) == plan
    assert store.get(source, KeepTorch.ALL) is None
    assert store.get(source + "\n# edited\n", KeepTorch.LAYOUT) is None
    assert len(code_fingerprint()) == 64
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]  # no temporary file left


def test_a_file_that_does_not_read_back_is_removed_and_counts_as_absent(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    source = _SOURCES[0]
    store.put(source, KeepTorch.LAYOUT, _plan(source))
    path = store.path(source, KeepTorch.LAYOUT)
    path.write_text('{"nodes": [', encoding="utf-8")
    assert store.get(source, KeepTorch.LAYOUT) is None
    assert not path.exists()


def test_the_least_recently_used_plans_go_beyond_the_bound(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, kept=2)
    a, b = _SOURCES
    plan_a, plan_b = _plan(a), _plan(b)
    store.put(a, KeepTorch.LAYOUT, plan_a)
    store.put(b, KeepTorch.LAYOUT, plan_b)
    old = store.path(a, KeepTorch.LAYOUT)
    os.utime(old, (1.0, 1.0))
    store.put(a, KeepTorch.ALL, plan_a)
    assert not old.exists()
    assert store.get(b, KeepTorch.LAYOUT) == plan_b
    assert store.get(a, KeepTorch.ALL) == plan_a


def test_a_second_expert_reads_the_plan_the_first_kept_instead_of_analysing(tmp_path: Path) -> None:
    task = Task.from_source("gemm_mean_softmax", _SOURCES[0])
    request = GenerateRequest(run_id="r1", island="i0", task=task, n=3, seed=7)

    async def ask() -> tuple[TemplateExpert, list[str]]:
        expert = TemplateExpert(analysis=AnalysisMode.THREAD, plan_store=PlanStore(tmp_path))
        reply = await expert.generate(request)
        assert reply.decline is None, reply.decline
        return expert, [p.source for p in reply.proposals]

    first, sources = asyncio.run(ask())
    assert (first.stats().plans_traced, first.stats().plans_stored) == (1, 0)
    second, again = asyncio.run(ask())
    assert (second.stats().plans_traced, second.stats().plans_stored) == (0, 1)
    assert again == sources


_CONCAT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cat([x, torch.relu(x)], dim=1) * 2.0


def get_inputs():
    return [torch.randn(4, 6, 8)]


def get_init_inputs():
    return []
"""


def test_a_kept_plan_of_a_family_s_op_renders_in_a_process_that_never_analysed(tmp_path: Path) -> None:
    """A later run's expert reads the plan before anything loads the op families (a concatenation
    is a gather they register): it must schedule and render there as it did where it was analysed."""
    store = PlanStore(tmp_path)
    plan = _plan(_CONCAT)
    assert "cat" in plan.ops or any("cat" in op for op in plan.ops), plan.ops
    store.put(_CONCAT, KeepTorch.NONE, plan)
    expected = render(plan, default_params(plan))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from actors.experts.template.ir import KeepTorch\n"
        "from actors.experts.template.plan_store import PlanStore\n"
        "from actors.experts.template.render import render\n"
        "from actors.experts.template.tuning import default_params\n"
        "plan = PlanStore(Path(sys.argv[1])).get(sys.argv[2], KeepTorch.NONE)\n"
        "assert plan is not None\n"
        "sys.stdout.write(render(plan, default_params(plan)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), _CONCAT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == expected
