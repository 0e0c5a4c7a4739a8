"""The judge path (outputs compared in a trusted worker after the candidate's process is gone), on
the CPU: forced for small outputs with ``device_verdict_bytes=0``; the same verdicts as the host path."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import CheckName, CheckOutcome, DeviceChoice, EvalStatus, KernelLanguage
from tests.gpu_runner.conftest import CANDIDATES, REFERENCES, job, reference

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def judged() -> AsyncIterator[EvaluationService]:
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=1.0, device_verdict_bytes=0
    )
    async with EvaluationService(cfg) as service:
        yield service


def _job(service: EvaluationService, candidate: str, candidate_id: str | None = None) -> EvalJob:
    ref = (REFERENCES / "add_relu.py").read_text()
    return EvalJob(
        reference_source=ref,
        candidate_source=(CANDIDATES / candidate).read_text(),
        language=KernelLanguage.TRITON,
        timeout_s=120.0,
        task_id=service.task_id(ref),
        candidate_id=candidate_id or candidate,
    )


async def _evaluate(service: EvaluationService, candidate: str) -> tuple[EvalStatus, str]:
    result = await service.evaluate(_job(service, candidate))
    return result.status, result.summary


async def test_judged_task_accepts_an_honest_candidate_and_names_the_plan(judged: EvaluationService) -> None:
    status, summary = await _evaluate(judged, "honest_add_relu.py")
    assert status is EvalStatus.CORRECT, summary
    assert judged.runs is not None
    plan = judged.runs.plan
    assert plan is not None
    assert plan.device_verdict
    assert judged.judge is not None
    assert judged.judge.compared >= 1  # the verdict came from the judge, not from the parent's numpy


async def test_judged_task_catches_a_partial_output_and_lower_precision(judged: EvaluationService) -> None:
    status, summary = await _evaluate(judged, "partial_output.py")
    assert status is EvalStatus.INCORRECT, summary
    status, summary = await _evaluate(judged, "precision_downcast.py")
    assert status is EvalStatus.INCORRECT, summary
    assert "float64" in summary or "outside" in summary


@pytest.mark.slow  # 23 s: the default suite keeps the device-judged held-out path's other tests
async def test_judged_tasks_are_checked_at_their_held_out_shapes_on_the_host(judged: EvaluationService) -> None:
    # The judge compares the trials where they lie; the held-out shapes (small) are compared by the
    # parent against the referee's truths, as for any task: a kernel right only at the reference's
    # even batch cannot pass because the task's outputs are judged on the device.
    # at 512 x 512 a held-out shape's outputs pass the frame's inline size and come as files, as
    # the trials' do (which the worker keeps for the judge)
    wide = reference("softmax_sized").replace("= 16\n", "= 512\n").replace("= 100\n", "= 512\n")
    assert "batch_size = 512" in wide
    generic = await judged.evaluate(replace(job("softmax_sized", "softmax_any_shape"), reference_source=wide))
    assert judged.runs is not None
    (first,) = judged.runs.variant_truths.values()
    pairs = await judged.evaluate(replace(job("softmax_sized", "softmax_row_pairs"), reference_source=wide))
    # the shapes' truths were computed once for the task (the referee is not asked again per spare)
    (second,) = judged.runs.variant_truths.values()
    assert len(first) == 3
    assert [id(t) for t in second] == [id(t) for t in first]
    assert judged.runs is not None
    assert judged.runs.plan is not None
    assert judged.runs.plan.device_verdict
    assert judged.judge is not None
    assert judged.judge.compared >= 2

    assert generic.status is EvalStatus.CORRECT, generic.summary
    assert generic.correctness is not None
    assert [s.outcome for s in generic.correctness.held_out] == ["correct"] * 3, generic.correctness.held_out
    assert pairs.status is EvalStatus.INCORRECT, pairs.summary
    assert pairs.correctness is not None
    assert pairs.correctness.passed_trials == pairs.correctness.trials  # the judge passed its trials
    assert "wrong at held-out shape batch_size=" in pairs.summary
    assert pairs.fitness is None


def _memfds(pid: int | str = "self") -> int:
    """Shared trial-output buffers (memfds) a process holds open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += "kf-trial-output" in os.readlink(f"/proc/{pid}/fd/{fd}")
    return count


@pytest.fixture
async def shared() -> AsyncIterator[EvaluationService]:
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=1.0, device_verdict_bytes=0,
        shared_outputs=True,
    )  # fmt: skip
    async with EvaluationService(cfg) as service:
        yield service


@pytest.mark.slow  # ~9 s on a 2-core host; the judged tests above use shared outputs too (on by default)
async def test_shared_outputs_reach_the_judge_without_files_and_are_released(shared: EvaluationService) -> None:
    # The spare hands its trial outputs over as buffers it made before the candidate ran (memfd on
    # the CPU, exported device memory on CUDA); the judge compares them where they lie.
    status, summary = await _evaluate(shared, "honest_add_relu.py")
    assert status is EvalStatus.CORRECT, summary
    assert shared.runs is not None
    assert shared.runs.plan is not None
    assert shared.runs.plan.shared_outputs
    assert "handed over in shared memory" in shared.runs.plan.summary()
    assert shared.judge is not None
    assert shared.judge.compared_shared == shared.judge.compared >= 1
    await shared.runs.wait_idle(1, 120.0)
    spare = shared.runs.idle[0]
    assert spare.reference is not None
    assert spare.reference.info.get("output_slots") == {"shared": len(spare.reference.seeds)}
    # The waiting spare's buffers are held by the parent; the used spare's were closed once judged.
    assert len(spare.worker.shared) == len(spare.reference.seeds) == _memfds()
    status, summary = await _evaluate(shared, "partial_output.py")
    assert status is EvalStatus.INCORRECT, summary
    status, summary = await _evaluate(shared, "precision_downcast.py")
    assert status is EvalStatus.INCORRECT, summary
    assert shared.judge.compared_shared == shared.judge.compared
    await shared.runs.wait_idle(1, 120.0)
    assert _memfds() == len(shared.runs.idle[0].worker.shared)
    judge = shared.judge.referee.worker  # the referee judges: it maps each buffer while it compares
    assert judge is not None
    assert _memfds(judge.pid) == 0


async def test_shared_outputs_are_on_unless_turned_off_and_the_switch_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KF_SHARED_OUTPUTS", raising=False)
    assert RunnerConfig().shared_outputs
    monkeypatch.setenv("KF_SHARED_OUTPUTS", "0")
    assert not RunnerConfig().shared_outputs
    monkeypatch.setenv("KF_SHARED_OUTPUTS", "1")
    assert RunnerConfig().shared_outputs
    monkeypatch.setenv("KF_SHARED_OUTPUTS", "yes")
    with pytest.raises(ValueError, match="KF_SHARED_OUTPUTS"):
        RunnerConfig()


@pytest.mark.slow  # 9-15 s each on a 2-core machine: the default suite stays under 15 minutes
async def test_a_plan_of_one_evaluation_at_a_time_prepares_the_next_reference_after_each() -> None:
    """No spares planned (judged outputs that fill the device): the next evaluation's worker is
    prepared once the last evaluation ended, not on the next candidate's critical path."""
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=0, compile_workers=2, timing_budget_s=1.0, device_verdict_bytes=0
    )
    async with EvaluationService(cfg) as service:
        status, summary = await _evaluate(service, "honest_add_relu.py")
        assert status is EvalStatus.CORRECT, summary
        runs = service.runs
        assert runs is not None
        assert runs.plan is not None
        assert runs.plan.spares == 0
        assert runs.plan.device_verdict
        await runs.wait_idle(1, 120)  # without the preparation ahead: none is starting, so this raises
        assert runs.idle[0].reference is not None
        result = await service.evaluate(_job(service, "honest_add_relu.py", "second"))
        assert result.status is EvalStatus.CORRECT, result.summary
        warm = next(c for c in result.checks if c.name == CheckName.WARM_WORKER)
        assert warm.outcome == CheckOutcome.PASSED, warm.detail


@pytest.mark.slow
async def test_one_reference_at_a_time_still_overlaps_the_compiled_baselines() -> None:
    """A judged plan prepares its spares one at a time, but only their reference part: the next
    spare starts its reference while the last one builds its torch.compile baseline (seconds of
    CPU work on every spare, which queued the next preparation behind it before)."""
    cfg = RunnerConfig(
        device=DeviceChoice.CPU,
        spares=2,
        compile_workers=2,
        timing_budget_s=1.0,
        device_verdict_bytes=0,
        compiled_baseline=True,
    )
    async with EvaluationService(cfg) as service:
        await service.prepare((REFERENCES / "add_relu.py").read_text())
        runs = service.runs
        assert runs is not None
        assert runs.plan is not None
        assert runs.plan.device_verdict
        assert runs.plan.compiled_baseline
        assert runs.plan.spares == 2
        assert runs.prep_sem is not None
        await runs.wait_idle(2, 240)
        built = [s.reference.info.get("compiled_error") or "built" for s in runs.idle if s.reference is not None]
        assert built == ["built", "built"], built
        spans = sorted(runs.preparations)
        assert len(spans) == 2, spans
        for (_, done, _), (began, _, _) in itertools.pairwise(spans):
            assert done <= began  # never two references at once
        assert any(began < ended for (_, _, ended), (began, _, _) in itertools.pairwise(spans)), spans


@pytest.mark.slow
async def test_no_verdict_waits_for_the_compiled_baseline_built_beside_the_referee() -> None:
    """The torch.compile baseline is built once per task in a process of its own (never a
    candidate's, nor the referee's, whose task is ready without it): a verdict reached while it is
    still being built is timed beside eager and says why torch.compile is missing; once it is
    ready every candidate's timing has it beside, measured, not derived. The compile process is
    held stopped (SIGSTOP) for the first candidate, so that one cannot wait for it."""
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=1.0, compiled_baseline=True
    )  # fmt: skip
    async with EvaluationService(cfg) as service:
        await service.prepare((REFERENCES / "add_relu.py").read_text())
        runs = service.runs
        assert runs is not None
        assert runs.compile_aside()
        assert runs.compiling is not None
        assert not runs.referee.compiled  # the referee's own task did not compile
        async with asyncio.timeout(60):
            while runs.compiled_referee.worker is None:  # noqa: ASYNC110 - the pool sets no event for it
                await asyncio.sleep(0.01)
        compiler = runs.compiled_referee.worker
        assert runs.referee.worker is not None
        assert compiler.pid != runs.referee.worker.pid
        os.kill(compiler.pid, signal.SIGSTOP)
        try:
            early = await service.evaluate(_job(service, "honest_add_relu.py", "early"))
        finally:
            os.kill(compiler.pid, signal.SIGCONT)
        async with asyncio.timeout(240):
            await runs.compiling
        assert runs.compiled_for(runs.referee.task) is runs.compiled_referee, runs.compile_failed
        later = [await service.evaluate(_job(service, "honest_add_relu.py", f"c{i}")) for i in range(2)]
    assert early.status is EvalStatus.CORRECT, early.summary
    assert early.baselines is not None
    assert early.baselines.eager is not None
    assert early.baselines.compiled is None
    assert early.speedup_vs_compiled is None
    assert (early.baselines.compiled_error or "").startswith("not ready yet: torch.compile of the reference")
    assert all(r.status is EvalStatus.CORRECT for r in later), [r.summary for r in later]
    for r in later:
        assert r.baselines is not None
        assert r.baselines.compiled is not None, r.summary
        assert r.speedup_vs_compiled is not None
        assert not r.compiled_derived
        assert "(derived)" not in r.summary


@pytest.mark.slow  # 9-15 s each on a 2-core machine: the default suite stays under 15 minutes
@pytest.mark.parametrize("judged_on_device", [True, False])
async def test_timed_calls_shipped_after_their_batch_are_judged(judged_on_device: bool) -> None:
    """Outputs too large to come back with every timed batch stay in the candidate's process; after
    some batches, chosen when they are over, the parent asks for one call's outputs and judges them
    against the referee's truth of that call's draw (on the device by the judge, or on the host).
    A candidate computing honestly only in its trials is caught there."""
    cfg = RunnerConfig(
        device=DeviceChoice.CPU,
        spares=1,
        compile_workers=2,
        timing_budget_s=1.0,
        timing_ship_all_bytes=0,  # every output counts as large here
        device_verdict_bytes=0 if judged_on_device else 1 << 40,
        shared_outputs=True,
    )
    async with EvaluationService(cfg) as service:
        honest = await service.evaluate(_job(service, "honest_add_relu.py"))
        stale = await service.evaluate(_job(service, "hostile_stale_when_timed.py"))
        assert service.runs is not None
        assert service.runs.plan is not None
        assert service.runs.plan.timed_slots >= 1
    assert honest.status is EvalStatus.CORRECT, honest.summary
    judged = next(c for c in honest.checks if c.name == CheckName.TIMED_OUTPUTS_RECHECKED)
    assert judged.outcome is CheckOutcome.PASSED, judged.detail
    assert judged.detail is not None
    assert judged.detail.startswith("0 wrong of ")
    assert not judged.detail.startswith("0 wrong of 0 ")
    assert stale.status is EvalStatus.INCORRECT, stale.summary
    assert "timed call wrong" in stale.summary


@pytest.mark.slow  # ~6 s on a 2-core host; every evaluation of the default run uses truth workers
async def test_truth_workers_serve_many_jobs_of_their_task_and_stop_with_it() -> None:
    """A truth worker never runs a candidate, so it is kept between jobs of its task (a start, its
    CUDA context and the model cost ~0.3-1 s, twice per candidate, on an H200 host): the spares'
    truths and the timed calls' of two candidates come from the same workers, and none is left
    once the service closes."""
    cfg = RunnerConfig(device=DeviceChoice.CPU, spares=1, compile_workers=2, timing_budget_s=0.3)
    service = EvaluationService(cfg)
    await service.start()
    try:
        status, summary = await _evaluate(service, "honest_add_relu.py")
        assert status is EvalStatus.CORRECT, summary
        runs = service.runs
        assert runs is not None
        assert runs.plan is not None
        assert runs.plan.truth_workers >= 1, runs.plan.summary()
        await runs.wait_idle(1, 120)
        first = {id(w): w.worker.pid for w in runs.idle_truth if w.worker is not None}
        assert first, "no truth worker kept after the first candidate"
        status, summary = await _evaluate(service, "honest_add_relu.py")
        assert status is EvalStatus.CORRECT, summary
        await runs.wait_idle(1, 120)
        again = {id(w): w.worker.pid for w in runs.idle_truth if w.worker is not None}
        assert set(first.items()) & set(again.items()), (first, again)
        assert len(runs.idle_truth) <= runs.plan.truth_workers
        kept = list(runs.idle_truth)
    finally:
        await service.aclose()
    assert all(not w.alive for w in kept)
