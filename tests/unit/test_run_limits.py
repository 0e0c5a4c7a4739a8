"""The run's limits are computed in one place, ``RunSpec``: the deadline, and each island's share
of candidates and tokens by one rounding rule."""

from __future__ import annotations

import pytest

from schemas import Budget, RunSpec, Task, split_evenly

pytestmark = pytest.mark.timeout(10)

SOURCE = "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n"


def _spec(
    islands: int, *, wall_s: float | None = 600.0, candidates: int | None = 200, tokens: int | None = None
) -> RunSpec:
    budget = Budget(wall_s=wall_s, candidates=candidates, tokens=tokens)
    return RunSpec(task=Task.from_source("t", SOURCE), islands=islands, budget=budget, created_at=1000.0)


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("total", [0, 1, 2, 5, 10, 63, 64, 65, 1000, 12_345])
def test_shares_sum_to_the_budget_and_differ_by_at_most_one(total: int, parts: int) -> None:
    shares = split_evenly(total, parts)
    assert len(shares) == parts
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1
    if total >= parts:
        assert min(shares) >= 1


def test_the_larger_shares_go_to_the_first_islands() -> None:
    assert split_evenly(10, 4) == (3, 3, 2, 2)


@pytest.mark.parametrize(("total", "parts"), [(5, 0), (-1, 2)])
def test_a_split_of_a_negative_budget_or_into_no_parts_is_refused(total: int, parts: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        split_evenly(total, parts)


def test_island_limits_split_tokens_and_candidates_and_share_the_deadline() -> None:
    spec = _spec(3, tokens=10, candidates=7, wall_s=60.0)
    limits = [spec.island_limits(i) for i in spec.island_names()]
    assert [lim.tokens for lim in limits] == [4, 3, 3]
    assert [lim.candidates for lim in limits] == [3, 2, 2]
    assert {lim.deadline for lim in limits} == {1060.0}


def test_a_limit_the_run_does_not_have_has_no_share() -> None:
    limits = _spec(2, tokens=None, candidates=None, wall_s=60.0).island_limits("i1")
    assert (limits.tokens, limits.candidates) == (None, None)
    assert _spec(2, tokens=None, candidates=5, wall_s=None).island_limits("i1").deadline is None


def test_the_deadline_is_the_creation_time_plus_the_wall_budget() -> None:
    spec = _spec(2, wall_s=30.0)
    assert spec.deadline == 1030.0
    assert not spec.past_deadline(1029.9)
    assert spec.past_deadline(1030.0)


def test_an_island_that_is_not_the_runs_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not one of run"):
        _spec(2).island_limits("i2")


def test_the_torch_build_is_read_without_importing_torch() -> None:
    """``kfoundry run --device cuda`` checks that torch is a CUDA build from its version file, so
    that the main process's 5-s ``import torch`` does not hold up the evaluator's start."""
    import subprocess
    import sys

    code = (
        "import sys; from actors.commands.run import torch_cuda_build; "
        "built = torch_cuda_build(); assert 'torch' not in sys.modules; "
        "import torch; assert built is (torch.version.cuda is not None), built"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
