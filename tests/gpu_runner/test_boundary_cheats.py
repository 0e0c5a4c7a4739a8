"""Cheats that pass the static gate and attack the evaluator from inside the candidate's process.

Each reaches what it needs through attributes of torch (the ``gc`` and ``inspect`` modules,
``sys.modules``, ``torch.library``) and goes after something a verdict once depended on: stored
reference outputs, its own timing report, the baseline's module, the flags of its trials, the
harness's clock and flush, its input drawing, its calls at held-out shapes. The evaluator keeps
all of that out of the candidate's process (the referee holds the reference and times the
baselines; the parent judges outputs and checks every timing against its own clock), so each must
end refused, incorrect or flagged, or, where its trick has nothing left to act on, correct without
gaining anything by it. Runs on the CPU (Triton's interpreter) and, with ``-m gpu``, on a GPU,
where the timing cheats get a task large enough for the parent's clock to resolve them.
``bench/trust_bench.py`` prints the same suite as a table.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.service import EvaluationService
from schemas import CheatRule, CheckName, CheckOutcome, DeviceChoice, EvalResult, EvalStatus
from tests.gpu_runner.conftest import fast_config, job

pytestmark = pytest.mark.asyncio(loop_scope="module")
S, R = EvalStatus, CheatRule
NOT_CORRECT = frozenset({S.REJECTED, S.INCORRECT, S.RUNTIME_ERROR, S.COMPILE_ERROR})
SECRET = secrets.token_hex(16)


@dataclass(frozen=True)
class Case:
    """A candidate, its task, the statuses it may get and a rule that must be among its findings;
    ``unrewarded``: correct is acceptable where its trick has nothing to act on, if it shows no
    gain (its speed-up over eager under ``unrewarded``)."""

    name: str
    ref: str
    statuses: frozenset[EvalStatus]
    rule: CheatRule | None = None
    unrewarded: float | None = None
    cpu: bool = True
    gpu: bool = True
    flagged: CheatRule | None = None
    """Also as it must be: correct but flagged for review with this rule (never a run's best)."""
    slow_on_cpu: bool = False
    """Checked on the CPU in the slow run only (2-4 s each on a 2-core host): a case of its kind stays
    in the default run."""


def case(name: str, ref: str, *statuses: EvalStatus, **kw: object) -> Case:
    return Case(name, ref, frozenset(statuses) if statuses else NOT_CORRECT, **kw)  # type: ignore[arg-type]


CASES = [
    # what a verdict depended on, in the candidate's process, before the referee
    case("hostile_gc_ref_outputs", "add_relu", slow_on_cpu=True),  # the overwrite below walks gc too
    case("hostile_overwrite_ref_outputs", "add_relu"),
    case("hostile_slow_eager_hook", "add_relu"),
    case("hostile_import_precompute", "add_relu"),
    # its own timing report and clock
    case("hostile_forge_timed_samples", "add_relu", S.REJECTED, rule=R.TIMER_TAMPERING, gpu=False),
    # on calls of tens of microseconds the clock's slack can hide these; the speed-of-light bound
    # flags them (README, "what stays trusted"; bench/results/trust_h200.md)
    case(
        "hostile_forge_timed_samples",
        "add_relu_big",
        S.REJECTED,
        rule=R.TIMER_TAMPERING,
        cpu=False,
        flagged=R.IMPLAUSIBLE_SPEED,
    ),
    case("hostile_patch_clock", "add_relu", S.REJECTED, rule=R.TIMER_TAMPERING, gpu=False),
    case(
        "hostile_precompute_in_draw",
        "add_relu_big",
        S.REJECTED,
        rule=R.TIMER_TAMPERING,
        cpu=False,
        flagged=R.IMPLAUSIBLE_SPEED,
    ),
    case("hostile_spin_after_batch", "add_relu_big", S.REJECTED, cpu=False),
    case("hostile_thread_while_timed", "add_relu", S.REJECTED, rule=R.THREADS),
    # the trials' flags, the outputs' identity and layout
    case("hostile_inplace_forged_flags", "add_relu", S.REJECTED, rule=R.INPUT_MUTATED),
    case("hostile_persistent_workspace", "add_relu", S.REJECTED, rule=R.OUTPUT_ALIASES_INPUT),
    case("hostile_column_major", "add_relu_2d", S.REJECTED, rule=R.OUTPUT_LAYOUT),
    case("hostile_custom_op_torch", "add_relu", S.REJECTED, rule=R.TORCH_COMPUTE),
    # behaving only while judged
    case("hostile_lowprec_when_timed", "add_relu", S.INCORRECT),
    case("hostile_stale_when_timed", "add_relu", S.INCORRECT, slow_on_cpu=True),
    case("hostile_softmax_no_max", "softmax_rows", S.INCORRECT),
    case("hostile_skip_held_out", "softmax_sized", S.INCORRECT),
    # tricks with nothing left to act on: correct, and no gain
    case("hostile_memo_by_values", "add_relu", S.CORRECT, *NOT_CORRECT, unrewarded=1.1, slow_on_cpu=True),
    case("hostile_frame_walk_checker", "add_relu", S.CORRECT, *NOT_CORRECT, unrewarded=2.0),
    case("hostile_forge_timing_report", "add_relu", S.CORRECT, *NOT_CORRECT, unrewarded=2.0, slow_on_cpu=True),
    # what stays in the candidate's process (README, anti-cheat): torch compute behind a forged
    # launch log; the speed it is timed at is what torch gives, no more (torch against torch:
    # ~1x, though microsecond CPU timings under a busy test run varied up to 1.6x)
    case("hostile_forged_launch_log", "add_relu", S.CORRECT, *NOT_CORRECT, unrewarded=3.0),
    # honest counterparts (on the CPU, the default run keeps the many launches and test_cheats' honest ones)
    case("honest_add_relu_2d", "add_relu_2d", S.CORRECT, slow_on_cpu=True),
    case("honest_softmax_rows", "softmax_rows", S.CORRECT, slow_on_cpu=True),
    case("honest_scratch_workspace", "add_relu", S.CORRECT, slow_on_cpu=True),
    case("honest_many_launches", "add_relu", S.CORRECT),
    case("honest_add_relu_big", "add_relu_big", S.CORRECT, cpu=False),
]


@pytest.fixture(scope="module")
def secret_env() -> Iterator[None]:
    saved = os.environ.get("KF_PRIVATE_VALUE")
    os.environ["KF_PRIVATE_VALUE"] = SECRET
    yield
    if saved is None:
        os.environ.pop("KF_PRIVATE_VALUE", None)
    else:
        os.environ["KF_PRIVATE_VALUE"] = saved


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_service(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = EvaluationService(fast_config(DeviceChoice.CPU, gpu_runner_tmp / "boundary-cpu"))
    await service.start()
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gpu_service(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = EvaluationService(fast_config(DeviceChoice.CUDA, gpu_runner_tmp / "boundary-gpu"))
    await service.start()
    yield service
    await service.aclose()


def check(result: EvalResult, c: Case) -> None:
    assert SECRET not in result.model_dump_json(), f"{c.name}: the evaluator's secret reached the result"
    if c.flagged is not None and result.status is S.CORRECT:
        assert not result.clean, f"{c.name}: correct and clean: {result.summary}"
        assert c.flagged in {f.rule for f in result.findings}, f"{c.name}: {result.summary}"
        return
    assert result.status in c.statuses, f"{c.name}: {result.status.value}: {result.summary}"
    assert SECRET not in result.model_dump_json(), f"{c.name}: the evaluator's secret reached the result"
    if c.rule is not None:
        rules = {f.rule for f in result.findings}
        assert c.rule in rules, f"{c.name}: {c.rule.value} not among {sorted(r.value for r in rules)}"
    cross = next((ch for ch in result.checks if ch.name is CheckName.TIMING_CROSS_CHECK), None)
    if c.rule is R.TIMER_TAMPERING and cross is not None and "excess" in (cross.detail or ""):
        # refused on the parent's clock only after a second timing with longer spins: a slow
        # moment of the host is not called a forgery, a forged report stays one
        assert "timed again" in (cross.detail or ""), cross.detail
    if result.status is S.CORRECT:
        # Whatever passes was timed and judged from outside: its timing agrees with the parent's
        # clock, and timed calls' outputs were judged.
        checks = {ch.name: ch for ch in result.checks}
        assert checks[CheckName.TIMING_CROSS_CHECK].outcome is CheckOutcome.PASSED, result.summary
        judged = checks[CheckName.TIMED_OUTPUTS_RECHECKED]
        assert judged.outcome is CheckOutcome.PASSED, judged.detail
        if c.unrewarded is not None:
            assert result.speedup_vs_eager is not None
            assert result.speedup_vs_eager < c.unrewarded, f"{c.name}: rewarded: {result.summary}"


@pytest.mark.parametrize(
    "c",
    [pytest.param(c, id=f"{c.name}-{c.ref}", marks=pytest.mark.slow if c.slow_on_cpu else ()) for c in CASES if c.cpu],
)
async def test_boundary_cheat_cpu(cpu_service: EvaluationService, c: Case) -> None:
    check(await cpu_service.evaluate(job(c.ref, c.name)), c)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in CASES if c.gpu], ids=lambda c: f"{c.name}-{c.ref}")
async def test_boundary_cheat_gpu(gpu_service: EvaluationService, c: Case) -> None:
    check(await gpu_service.evaluate(job(c.ref, c.name)), c)
