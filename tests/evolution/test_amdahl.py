"""Where the time goes (Amdahl's law): the best's breakdown per family beside the reference's
profile, the lines a person and an LLM read, and the template's mutations aimed by share."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from actors.evolution.amdahl import breakdown, breakdown_lines, family_weights, steering_shares
from actors.experts.template import Plan, analyse, default_params
from actors.experts.template.tuning import mutate, relevant_by_kind
from actors.llm.prompts import result_section
from schemas import (
    Baselines,
    EvalResult,
    EvalStatus,
    FamilyShare,
    KernelTime,
    OpFamily,
    OpTime,
    Profile,
    ReferenceProfile,
)

_REFERENCE = ReferenceProfile(
    timer="cuda events per op",
    forward_us=1000.0,
    ops_us=1000.0,
    families=(
        FamilyShare(family=OpFamily.CONV, time_us=800.0, share=0.8),
        FamilyShare(family=OpFamily.ROW, time_us=150.0, share=0.15),
        FamilyShare(family=OpFamily.PW, time_us=50.0, share=0.05),
    ),
    ops=(
        OpTime(module="features.0", op="aten::convolution", family=OpFamily.CONV, calls=1, time_us=800.0, share=0.8),
        OpTime(
            module="features.1", op="aten::native_batch_norm", family=OpFamily.ROW, calls=1, time_us=150, share=0.15
        ),
        OpTime(module="", op="aten::relu", family=OpFamily.PW, calls=1, time_us=50.0, share=0.05),
    ),
)


def _result(kernels: tuple[KernelTime, ...] = (), reference: ReferenceProfile | None = _REFERENCE) -> EvalResult:
    return EvalResult(
        run_id="r",
        candidate_id="c",
        island="i0",
        task_id="t",
        status=EvalStatus.CORRECT,
        summary="ok",
        baselines=Baselines(profile=reference),
        profile=Profile(kernel_times=kernels, kernel_timer="cuda events per launch" if kernels else None),
        torch_ops=("aten::native_batch_norm",),
    )


_KERNELS = (
    KernelTime(name="_kf_conv0", family=OpFamily.CONV, launches=1, time_us=400.0),  # relu fused in
    KernelTime(name="_kf_row1", family=OpFamily.ROW, launches=2, time_us=100.0),
)


def test_each_family_gets_its_share_its_speedup_and_what_it_alone_makes_of_the_whole() -> None:
    b = breakdown(_result(_KERNELS))
    assert b is not None
    rows = {r.family: r for r in b.families}
    assert [r.family for r in b.families] == [OpFamily.CONV, OpFamily.ROW, OpFamily.PW]
    conv = rows[OpFamily.CONV]
    assert conv.kernels == ("_kf_conv0",)
    assert conv.speedup == pytest.approx(2.0)
    assert conv.alone == pytest.approx(1 / (0.2 + 0.8 / 2))  # Amdahl: 1.667x
    assert rows[OpFamily.ROW].speedup == pytest.approx(1.5)
    assert rows[OpFamily.PW].candidate_us is None
    assert rows[OpFamily.PW].kernels == ()
    assert b.candidate_kernels_us == pytest.approx(500.0)
    assert [o.op for o in b.torch_ops] == ["aten::native_batch_norm"]

    lines = breakdown_lines(b)
    assert lines[0] == "conv: 80% of the reference's time; its 1 kernel(s) 2.00x on it, 1.67x on the whole alone"
    assert "no kernel of its own" in lines[2]
    assert any(line.startswith("the reference's largest ops: convolution in features.0 80%") for line in lines)
    assert "left to PyTorch: aten::native_batch_norm in features.1, 15% of the reference" in lines


def test_nothing_profiled_is_no_breakdown_and_an_llm_reads_the_breakdown_where_there_is_one() -> None:
    assert breakdown(_result(reference=None)) is None
    assert "where the time goes" not in result_section(_result(reference=None))
    text = result_section(_result(_KERNELS))
    assert "where the time goes" in text
    assert "conv: 80% of the reference's time" in text


def test_the_search_aims_where_the_time_is_left_and_at_the_reference_before_anything_ran() -> None:
    assert steering_shares(None) == {}
    assert steering_shares(_result()) == {OpFamily.CONV: 0.8, OpFamily.ROW: 0.15, OpFamily.PW: 0.05}
    ours = steering_shares(_result(_KERNELS))
    assert ours == {OpFamily.CONV: pytest.approx(0.8), OpFamily.ROW: pytest.approx(0.2)}
    weights = family_weights(ours, {"conv", "row", "pool", "nonsense"})
    assert weights == {"conv": pytest.approx(0.85), "row": pytest.approx(0.25), "pool": pytest.approx(0.05)}


_LINEAR_SOFTMAX = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 48)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=1)

def get_inputs():
    return [torch.randn(32, 64)]

def get_init_inputs():
    return []
"""


def test_mutations_go_to_the_kernel_kind_that_holds_the_time() -> None:
    plan = analyse(_LINEAR_SOFTMAX)
    assert isinstance(plan, Plan), plan
    start = default_params(plan)
    by_kind = relevant_by_kind(plan, start)
    own = {k: set(v) for k, v in by_kind.items() if k}
    assert {"mm", "row"} <= set(own), by_kind
    only_mm, only_row = own["mm"] - own["row"], own["row"] - own["mm"]

    def changed_kinds(shares: dict[str, float] | None, seed: int) -> Counter[str]:
        rng = np.random.default_rng(seed)
        counts: Counter[str] = Counter()
        for _ in range(200):
            child = mutate(plan, start, rng, diagnosis=None, shares=shares)
            diff = {n for n, v in child.as_dict().items() if start.as_dict()[n] != v}
            counts["mm"] += bool(diff & only_mm)
            counts["row"] += bool(diff & only_row)
        return counts

    aimed = changed_kinds({"mm": 0.95, "row": 0.05}, seed=1)
    assert aimed["mm"] > 4 * aimed["row"], aimed
    flipped = changed_kinds({"mm": 0.05, "row": 0.95}, seed=1)
    assert flipped["row"] > 4 * flipped["mm"], flipped
    blind = changed_kinds(None, seed=1)
    assert blind["mm"] > 0, blind
    assert blind["row"] > 0, blind
