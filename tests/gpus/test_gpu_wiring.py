"""From ``--gpus``/``--gpu`` to pinned workers: which evaluators a run starts, with what share of
the machine, how their workers are pinned, and the one-line refusals of the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.launch import build_actor
from actors.commands.run import run_gpus
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_runners import GpuRunner, stamp_gpu
from actors.runtime.errors import ConfigError
from actors.runtime.gpu_claim import claim_gpu
from actors.runtime.gpus import Gpu, list_gpus
from actors.runtime.options import ActorOptions
from gpu_runner.config import RunnerConfig, usable_cores
from gpu_runner.errors import ConfigError as RunnerConfigError
from gpu_runner.pool import RunPool
from gpu_runner.sandbox import Isolation
from schemas import ActorKind, DeviceChoice, DeviceInfo, DeviceKind, EvalResult, EvalStatus
from tests.gpus.conftest import FakeSmi, four_h200

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _run_args(*options: str) -> object:
    return build_parser().parse_args(["run", str(QUICKSTART), *options])


def test_a_cpu_run_keeps_its_unpinned_evaluators(fake_smi: FakeSmi) -> None:
    fake_smi(four_h200())
    assert run_gpus(_run_args("--device", "cpu"), DeviceChoice.CPU) == []  # type: ignore[arg-type]
    assert run_gpus(_run_args("--device", "cpu", "--evaluators", "3"), DeviceChoice.CPU) == []  # type: ignore[arg-type]


def test_a_gpu_run_takes_every_visible_gpu_by_default(fake_smi: FakeSmi) -> None:
    fake_smi(four_h200())
    assert [g.index for g in run_gpus(_run_args(), DeviceChoice.CUDA)] == [0, 1, 2, 3]  # type: ignore[arg-type]
    assert [g.index for g in run_gpus(_run_args("--gpus", "2,0"), DeviceChoice.CUDA)] == [2, 0]  # type: ignore[arg-type]
    noop = _run_args("--runner", "noop")
    assert run_gpus(noop, DeviceChoice.CUDA) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "device", "message"),
    [
        (("--gpus", "1", "--device", "cpu"), DeviceChoice.CPU, "--gpus 1 and --device cpu"),
        (("--evaluators", "2"), DeviceChoice.CUDA, "one evaluator per GPU; choose them with --gpus"),
        (("--gpus", "0,4"), DeviceChoice.CUDA, "there is no GPU 4; 4 GPU(s) visible here"),
        (("--gpus", "1,1"), DeviceChoice.CUDA, "GPU 1 is listed twice"),
    ],
)
def test_bad_gpu_options_of_a_run_are_one_line_errors(
    fake_smi: FakeSmi, options: tuple[str, ...], device: DeviceChoice, message: str
) -> None:
    fake_smi(four_h200())
    with pytest.raises(ConfigError) as err:
        run_gpus(_run_args(*options), device)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_gpus_where_nvidia_smi_finds_none_is_an_error(fake_smi: FakeSmi) -> None:
    fake_smi([])
    with pytest.raises(ConfigError) as err:
        run_gpus(_run_args("--gpus", "all"), DeviceChoice.CUDA)  # type: ignore[arg-type]
    assert "no GPU is visible here" in str(err.value)


def test_a_claimed_evaluator_gets_its_share_of_the_machine_and_a_pinned_pool(fake_smi: FakeSmi, tmp_path: Path) -> None:
    fake_smi(four_h200())
    gpu = list_gpus()[2]
    args = build_parser().parse_args(["actor", "evaluator", "--run", "r1", "--isolation", "best-effort"])
    with claim_gpu(gpu, run_id="r1") as claim:
        actor = build_actor(
            ActorKind.EVALUATOR,
            ActorOptions.from_args(args),
            url="nats://x:1",
            run_id="r1",
            gpu_claim=claim,
            gpus_here=4,
        )
        assert isinstance(actor, EvaluatorActor)
        runner = actor.runner
        assert isinstance(runner, GpuRunner)
        cfg = runner.service.cfg
        assert cfg.device is DeviceChoice.CUDA
        assert cfg.gpu == gpu.uuid
        assert cfg.compile_workers == max(1, usable_cores() // 4)
        assert cfg.host_memory_share == pytest.approx(0.25)
        assert actor.extra_stats()["gpu"] == 2
        iso = Isolation(prefix=(), network="off", pids="off", uid=None, gid=None, user="")
        pool = RunPool(cfg, iso, "cuda", tmp_path, {"A": "1"})
        assert pool.env == {"A": "1", "CUDA_VISIBLE_DEVICES": gpu.uuid}  # every run worker and the judge


def test_an_unpinned_evaluator_is_built_as_before() -> None:
    args = build_parser().parse_args(["actor", "evaluator", "--run", "r1", "--device", "cpu"])
    actor = build_actor(ActorKind.EVALUATOR, ActorOptions.from_args(args), url="nats://x:1", run_id="r1")
    assert isinstance(actor, EvaluatorActor)
    assert isinstance(actor.runner, GpuRunner)
    assert actor.runner.service.cfg.gpu is None
    assert actor.runner.service.cfg.worker_device_env() == {}
    assert actor.extra_stats()["gpu"] is None


def test_the_runner_config_pins_one_gpu_only() -> None:
    assert RunnerConfig(device=DeviceChoice.CUDA, gpu="GPU-1").worker_device_env() == {"CUDA_VISIBLE_DEVICES": "GPU-1"}
    assert RunnerConfig(device=DeviceChoice.CPU, gpu="GPU-1").worker_device_env() == {}
    for bad in ("0,1", "", " 1"):
        with pytest.raises(RunnerConfigError) as err:
            RunnerConfig(gpu=bad)
        assert "RunnerConfig.gpu" in str(err.value)
    with pytest.raises(RunnerConfigError):
        RunnerConfig(host_memory_share=0.0)
    assert dataclasses.replace(RunnerConfig(), host_memory_share=0.5).host_memory_share == 0.5


def test_a_pinned_runners_results_name_their_gpu() -> None:
    gpu = Gpu(index=3, uuid="GPU-3", name="NVIDIA H200", memory_bytes=1)
    device = DeviceInfo(kind=DeviceKind.CUDA, name="NVIDIA H200", torch="2", python="3", host="h")
    result = EvalResult(
        run_id="r", candidate_id="c", task_id="t", status=EvalStatus.CORRECT, summary="ok", device=device
    )
    assert stamp_gpu(result, gpu).device is not None
    assert stamp_gpu(result, gpu).device.gpu_index == 3  # type: ignore[union-attr]
    assert stamp_gpu(result, None) is result
    no_device = result.model_copy(update={"device": None})
    assert stamp_gpu(no_device, gpu).device is None


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.slow  # ~3 s on a 2-core host; the default run keeps a run refusing a held GPU
@pytest.mark.timeout(120)
def test_a_hand_started_evaluator_refuses_a_gpu_another_evaluator_holds(fake_smi: FakeSmi) -> None:
    fake_smi(four_h200())
    env = dict(os.environ)
    with claim_gpu(list_gpus()[1], run_id="first-run"):
        taken = _cli("actor", "evaluator", "--gpu", "1", "--run", "r2", "--nats", "nats://127.0.0.1:1", env=env)
        missing = _cli("actor", "evaluator", "--gpu", "7", "--run", "r2", "--nats", "nats://127.0.0.1:1", env=env)
        on_cpu = _cli("actor", "evaluator", "--gpu", "0", "--device", "cpu", "--run", "r2", env=env)
    assert taken.returncode == 2, taken.stderr[-2000:]
    lines = taken.stderr.strip().splitlines()
    assert lines[-1].startswith("kfoundry: GPU 1 (NVIDIA H200, GPU-00000001")
    assert f"is already used by pid {os.getpid()}" in lines[-1]
    assert "run first-run" in lines[-1]
    assert missing.returncode == 2
    assert "kfoundry: --gpu 7: there is no GPU 7; 4 GPU(s) visible here" in missing.stderr
    assert on_cpu.returncode == 2
    assert "--gpu 0 and --device cpu" in on_cpu.stderr


@pytest.mark.timeout(120)
def test_a_run_refuses_a_gpu_another_evaluator_holds_before_it_starts_anything(
    fake_smi: FakeSmi, tmp_path: Path
) -> None:
    fake_smi(four_h200())
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"))
    env.pop("NATS_URL", None)
    with claim_gpu(list_gpus()[1], run_id="first-run"):
        run_dir = str(tmp_path / "r")
        taken = _cli("run", str(QUICKSTART), "--device", "cuda", "--gpus", "0,1", "--run-dir", run_dir, env=env)
    twice = _cli("run", str(QUICKSTART), "--gpus", "0,0", env=env)
    assert taken.returncode == 2, taken.stderr[-2000:]
    assert taken.stderr.strip().splitlines()[-1].startswith("kfoundry: GPU 1 (NVIDIA H200, GPU-00000001")
    assert not (tmp_path / "r").exists()  # nothing started, no run directory
    assert not (tmp_path / "home" / "nats").exists()  # no server started either
    assert twice.returncode == 2
    assert twice.stderr.strip() == "kfoundry: --gpus 0,0: GPU 0 is listed twice (one evaluator per GPU)"
    # GPU 0 claimed by the refused run was given back with it.
    claim_gpu(list_gpus()[0]).release()


def test_a_hand_started_evaluator_without_gpu_claims_the_first_visible_one(fake_smi: FakeSmi) -> None:
    from actors.commands.actor import hand_started_gpu

    fake_smi(four_h200())
    parse = build_parser().parse_args
    claim, here = hand_started_gpu(ActorKind.EVALUATOR, parse(["actor", "evaluator", "--run", "r"]))
    assert claim is not None
    try:
        assert (claim.gpu.index, here) == (0, 4)
        with pytest.raises(ConfigError) as err:
            hand_started_gpu(ActorKind.EVALUATOR, parse(["actor", "evaluator", "--run", "r", "--gpu", "0"]))
        assert "GPU 0 (NVIDIA H200" in str(err.value)
    finally:
        claim.release()
    on_cpu = parse(["actor", "evaluator", "--run", "r", "--device", "cpu"])
    assert hand_started_gpu(ActorKind.EVALUATOR, on_cpu) == (None, 1)
    with pytest.raises(ConfigError) as err:
        hand_started_gpu(ActorKind.ISLAND, parse(["actor", "island", "--run", "r", "--gpu", "1"]))
    assert "only evaluator actors use a GPU" in str(err.value)
