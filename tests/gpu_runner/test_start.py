"""The evaluator's start: its fork servers start beside the isolation probe, and a start that fails
(strict isolation refused) leaves nothing of it running."""

from __future__ import annotations

import asyncio
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from gpu_runner.config import IsolationMode
from gpu_runner.errors import IsolationUnavailable
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job, reference

pytestmark = pytest.mark.timeout(120)


def _fork_servers() -> list[psutil.Process]:
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "gpu_runner.forkserver" in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.Error:
            continue
    return out


async def test_a_start_refused_by_strict_isolation_leaves_no_fork_server_or_folder(tmp_path: Path) -> None:
    # An interpreter whose isolation probe finds no layer (it answers for the probe; everything
    # else, the fork servers included, is the real interpreter).
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$*" in *gpu_runner.confine.probe*) echo \'{"userns": "refused by this test"}\'; exit 0;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    cfg = fast_config(DeviceChoice.CPU, tmp_path, python=str(python), isolation=IsolationMode.STRICT, work_dir=None)
    service = EvaluationService(cfg)
    started = time.monotonic()
    with pytest.raises(IsolationUnavailable, match="isolation is strict"):
        await service.start()
    assert service.base is not None
    assert not service.base.exists(), "the service's folder outlived its failed start"
    # the close waited for them (or killed them); none is left even for a moment after
    assert not _fork_servers(), "a fork server outlived the failed start"
    assert time.monotonic() - started < 30
    await service.aclose()  # a second close is harmless


async def test_the_started_evaluator_gives_its_start_up_phases(tmp_path: Path) -> None:
    cfg = fast_config(DeviceChoice.CPU, tmp_path, spares=0)
    async with EvaluationService(cfg) as service:
        assert service.runs is not None
        assert service.runs.forks is not None
        assert await service.runs.forks.wait_ready()
        phases = service.start_phases
    assert {"detect_s", "folders_s", "probe_s", "pools_s", "process_s"} <= set(phases)
    assert all(v >= 0 for v in phases.values())
    assert phases["process_s"] >= phases["probe_s"]  # the process began before its service's probe


@pytest.mark.slow  # 9-15 s each on a 2-core machine: the default suite stays under 15 minutes
async def test_an_evaluation_asking_for_the_plan_during_the_tasks_preparation_waits_for_it(tmp_path: Path) -> None:
    """The evaluator takes candidates while it prepares the task: a candidate that reaches the run
    stage meanwhile waits for that preparation's plan instead of measuring the task again (here
    while the preparation first disposes of another task's spare)."""
    cfg = fast_config(DeviceChoice.CPU, tmp_path, spares=1)
    async with EvaluationService(cfg) as service:
        runs = service.runs
        assert runs is not None
        await service.prepare(reference("linear_relu"))
        await service.wait_spares(1, timeout_s=60)
        measured: list[str] = []
        measure = runs._measure

        async def counted(worker, source):  # type: ignore[no-untyped-def]
            measured.append(source)
            return await measure(worker, source)

        runs._measure = counted  # type: ignore[method-assign]
        ref = reference("add_relu")
        _, plan = await asyncio.gather(service.prepare(ref), runs.plan_for(ref))
        assert plan is not None
        assert len(measured) == 1


@pytest.mark.slow  # ~15 s on a 2-core machine
async def test_candidates_waiting_for_the_tasks_preparation_run_in_rank_order(tmp_path: Path) -> None:
    """At a run's start every candidate waits for the task's preparation; then the first starting
    points (lowest ranks) take the spares and the GPU first, whichever compiled first, and a
    candidate without a rank goes last."""
    cfg = fast_config(DeviceChoice.CPU, tmp_path, spares=1)
    async with EvaluationService(cfg) as service:
        ref = reference("add_relu")
        preparing = asyncio.create_task(service.prepare(ref))  # as the evaluator actor does
        finished: list[str] = []

        async def evaluate(name: str, rank: int | None) -> EvalStatus:
            result = await service.evaluate(replace(job("add_relu", "honest_add_relu"), candidate_id=name, rank=rank))
            finished.append(name)
            return result.status

        ranks = {"sixth": 6, "unranked": None, "second": 2, "first": 0}  # in the order they arrive
        statuses = await asyncio.gather(*(evaluate(name, rank) for name, rank in ranks.items()))
        await preparing
    assert statuses == [EvalStatus.CORRECT] * 4
    assert finished == ["first", "second", "sixth", "unranked"]


@pytest.mark.slow  # a few seconds of fork-server imports on a 2-core machine
async def test_a_prestarted_runner_starts_once_and_closing_it_early_leaves_nothing(tmp_path: Path) -> None:
    """``kfoundry run`` starts its local evaluator's runner before the rest of the run: the actor's
    own start then waits for that one, and a run that ends before the actor runs closes it, fork
    servers included, even while it is still starting."""
    from actors.kinds.evaluator_runners import GpuRunner

    runner = GpuRunner(device=DeviceChoice.CPU, spares=1)
    runner.prestart()
    await asyncio.sleep(0.5)  # its fork servers are importing
    assert _fork_servers()
    await runner.aclose()
    assert not [p for p in _fork_servers() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    runner = GpuRunner(device=DeviceChoice.CPU, spares=1)
    runner.prestart()
    starting = runner._starting
    await runner.start()
    assert runner._starting is starting  # the same start, not a second one
    assert runner.service.start_phases
    await runner.aclose()
    assert not [p for p in _fork_servers() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
