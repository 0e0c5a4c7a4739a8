"""The cheat suite: hostile and honest candidates, each with the verdict it must get.

Runs on the CPU by default (Triton under the interpreter) and on a GPU with ``-m gpu``. Two
services per device: one with the static gate enforced (the normal case) and one that records
the gate's findings but runs the candidate anyway, so the runtime layers are tested on their own.
A secret sits in the evaluator's environment the whole time; no result may contain it.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from gpu_runner.errors import WorkerStartError
from gpu_runner.service import EvaluationService
from schemas import CheatRule, CheckName, DeviceChoice, EvalResult, EvalStatus
from tests.gpu_runner.conftest import fast_config, job

pytestmark = pytest.mark.asyncio(loop_scope="module")
S, R = EvalStatus, CheatRule
SECRET = secrets.token_hex(16)
SECRET_VARS = ("KF_PRIVATE_VALUE", "OPENAI_API_KEY")


@dataclass(frozen=True)
class Case:
    """A candidate, the statuses it may get, and a rule that must be among its findings."""

    name: str
    statuses: frozenset[EvalStatus]
    rule: CheatRule | None = None
    timeout_s: float = 120.0
    cpu: bool = True
    gpu: bool = True
    unrewarded: bool = False
    """A correct verdict is also acceptable when it shows no speed-up: the trick gained nothing."""
    slow_on_cpu: bool = False
    """Checked on the CPU in the slow run only (a correct verdict is timed in full: ~1.5 s on a 2-core
    host): a case like it stays in the default run."""


def case(name: str, *statuses: EvalStatus, rule: CheatRule | None = None, **kw: object) -> Case:
    return Case(name, frozenset(statuses), rule, **kw)  # type: ignore[arg-type]


GATED = [
    case("torch_op_instead", S.REJECTED, rule=R.TORCH_COMPUTE),
    case("decoy_kernel", S.REJECTED, rule=R.TORCH_COMPUTE),
    case("decoy_evading_gate", S.REJECTED, rule=R.TORCH_COMPUTE),
    case("try_fallback", S.REJECTED, rule=R.TORCH_FALLBACK),
    case("sys_modules_reference", S.REJECTED, rule=R.INTROSPECTION),
    case("gc_reference", S.REJECTED, rule=R.INTROSPECTION),
    case("pointer_cache", S.REJECTED, S.INCORRECT),
    case("input_mutation", S.REJECTED, rule=R.INPUT_MUTATED),
    case("return_input", S.REJECTED, rule=R.OUTPUT_ALIASES_INPUT),
    case("thread_deferred", S.REJECTED, rule=R.THREADS),
    case("tensor_subclass", S.REJECTED, rule=R.TENSOR_SUBCLASS),
    case("patch_timer", S.REJECTED, rule=R.TIMER_TAMPERING),
    case("patch_checker", S.REJECTED, rule=R.MONKEYPATCH),
    case("redefined_inputs", S.REJECTED, rule=R.REDEFINED_INPUTS),
    case("precision_downcast", S.INCORRECT),
    case("guessed_seeds", S.REJECTED, rule=R.RNG_TAMPERING),
    case("replay_first_answer", S.INCORRECT, S.REJECTED),
    case("torch_compile_inside", S.REJECTED, rule=R.TORCH_COMPILE),
    case("exec_hidden", S.REJECTED, rule=R.DYNAMIC_CODE),
    case("stale_memory", S.INCORRECT),
    case("env_secret", S.REJECTED, rule=R.ENVIRONMENT),
    case("infinite_loop", S.TIMEOUT, timeout_s=4.0),  # it spins a core until stopped
    case("segfault", S.REJECTED, rule=R.CTYPES),
    case("memory_bomb", S.RUNTIME_ERROR, rule=R.RESOURCE_LIMIT),
    case("device_memory_bomb", S.RUNTIME_ERROR, rule=R.RESOURCE_LIMIT),
    case("spawn_children", S.REJECTED, rule=R.PROCESSES),
    case("partial_output", S.INCORRECT),
    case("global_precision_flags", S.REJECTED, rule=R.PRECISION_FLAGS),
    case("side_stream", S.REJECTED, rule=R.DEFERRED_WORK),
    case("missing_model", S.REJECTED, rule=R.MISSING_MODEL),
    case("wrong_output_type", S.REJECTED, rule=R.OUTPUT_TYPE),
    case("dynamic_getattr", S.REJECTED, rule=R.DYNAMIC_CODE),
    case("network_exfil", S.REJECTED, rule=R.NETWORK),
    case("honest_add_relu", S.CORRECT),
    case("honest_helper_copy", S.CORRECT, slow_on_cpu=True),  # honest_add_relu stays
]
"""With the static gate enforced (the default)."""

UNGATED = [
    case("torch_op_instead", S.REJECTED, rule=R.NO_KERNEL_LAUNCHED),
    # The reference's model lives in the referee, another process: the walk finds nothing, and the
    # candidate's own kernel (its fallback) computes the answer.
    case("gc_reference", S.CORRECT),
    case("thread_deferred", S.REJECTED, S.INCORRECT),
    case("tensor_subclass", S.REJECTED, rule=R.OUTPUT_TYPE),
    # On a GPU host these two fail in the compile stage, which imports the candidate to build its
    # kernels ahead of time: a Triton launch on CPU tensors raises, the segfault kills that process.
    case("guessed_seeds", S.INCORRECT, S.REJECTED, S.COMPILE_ERROR),
    case("segfault", S.RUNTIME_ERROR, S.COMPILE_ERROR),
    case("env_secret", S.CORRECT),
    # Where seccomp holds, the sandbox refuses the fork (a runtime error); elsewhere the children are
    # seen and the candidate rejected. Either way none survives (checked below).
    case("spawn_children", S.REJECTED, S.RUNTIME_ERROR),
    # Its 50 side-stream launches cost the host more than the kernels: the events around the call
    # then span the launches and it was timed correct at 0.008x eager on an H200. No reward.
    case("side_stream_quiet", S.REJECTED, S.INCORRECT, cpu=False, unrewarded=True),
]
"""With the gate recording but not enforcing: the runtime layers alone must hold."""


@pytest.fixture(scope="module")
def secret_env() -> Iterator[None]:
    """Secrets in the evaluator's own environment for the whole module."""
    saved = {k: os.environ.get(k) for k in SECRET_VARS}
    os.environ.update(dict.fromkeys(SECRET_VARS, SECRET))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


async def _service(device: DeviceChoice, tmp: Path, enforce: bool, spares: int) -> EvaluationService:
    service = EvaluationService(fast_config(device, tmp, enforce_gate=enforce, spares=spares))
    await service.start()
    await service.prepare(job("add_relu", "honest_add_relu").reference_source)
    return service


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_gated(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = await _service(DeviceChoice.CPU, gpu_runner_tmp / "cpu-gated", True, 2)
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_ungated(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = await _service(DeviceChoice.CPU, gpu_runner_tmp / "cpu-ungated", False, 1)
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gpu_gated(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = await _service(DeviceChoice.CUDA, gpu_runner_tmp / "gpu-gated", True, 2)
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gpu_ungated(secret_env: None, gpu_runner_tmp: Path) -> AsyncIterator[EvaluationService]:
    service = await _service(DeviceChoice.CUDA, gpu_runner_tmp / "gpu-ungated", False, 1)
    yield service
    await service.aclose()


def marker_processes() -> list[str]:
    """Processes the spawn_children candidate started, if any survived."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "kf-marker" in cmdline and "pytest" not in cmdline:
            found.append(f"{proc.pid}: {cmdline}")
    return found


def check_verdict(result: EvalResult, c: Case) -> None:
    if c.unrewarded and result.status is S.CORRECT:
        assert result.speedup_vs_eager is not None
        assert result.speedup_vs_eager < 1.0, f"{c.name}: rewarded: {result.summary}"
    else:
        assert result.status in c.statuses, f"{c.name}: {result.status.value}: {result.summary}"
    if c.rule is not None:
        rules = {f.rule for f in result.findings}
        assert c.rule in rules, f"{c.name}: {c.rule.value} not among {sorted(r.value for r in rules)}"
    unknown = [ch.name for ch in result.checks if CheckName.parse(ch.name) is None]
    assert unknown == [], f"{c.name}: checks the diagnosis cannot name: {unknown}"
    dumped = result.model_dump_json()
    assert SECRET not in dumped, f"{c.name}: the evaluator's secret reached the result"
    assert result.device is None or result.device.kind.value in ("cpu", "cuda")
    if result.status is S.CORRECT:
        assert result.clean == (not result.review)
        assert result.correctness is not None
        assert result.correctness.passed_trials == result.correctness.trials >= 5
        assert result.timing is not None
        assert result.baselines is not None
        assert result.baselines.eager is not None
    if c.name == "spawn_children":
        assert marker_processes() == []
    if c.name == "infinite_loop":
        assert result.stages.total_s is not None
        assert result.stages.total_s < c.timeout_s + 5


@pytest.mark.parametrize(
    "c", [pytest.param(c, id=c.name, marks=pytest.mark.slow if c.slow_on_cpu else ()) for c in GATED if c.cpu]
)
async def test_cheat_verdict_cpu(cpu_gated: EvaluationService, c: Case) -> None:
    result = await cpu_gated.evaluate(job("add_relu", c.name, timeout_s=c.timeout_s))
    check_verdict(result, c)
    assert result.device is not None  # a verdict of the gate alone says where it would have run too
    assert result.device.kind.value == "cpu"


@pytest.mark.parametrize("c", [c for c in UNGATED if c.cpu], ids=lambda c: c.name)
async def test_runtime_layers_hold_without_gate_cpu(cpu_ungated: EvaluationService, c: Case) -> None:
    check_verdict(await cpu_ungated.evaluate(job("add_relu", c.name, timeout_s=c.timeout_s)), c)


@pytest.mark.slow  # 9-15 s each on a 2-core machine: the default suite stays under 15 minutes
async def test_a_timeout_while_timed_gives_the_exclusive_gpu_lease_back(cpu_gated: EvaluationService) -> None:
    """A candidate that hangs once it holds the GPU alone: the lease it upgraded to is released as
    exclusive, so the next candidate still gets the GPU."""
    hung = await cpu_gated.evaluate(job("add_relu", "hang_in_timing", timeout_s=8.0))
    assert hung.status is S.TIMEOUT
    assert hung.correctness is not None
    assert hung.correctness.passed_trials == hung.correctness.trials  # it hung in the timing
    gate = cpu_gated.gpu
    assert (gate.exclusive_holders, gate.candidate_holders) == (0, 0)
    honest = await cpu_gated.evaluate(job("add_relu", "honest_add_relu", timeout_s=60.0))
    assert honest.status is S.CORRECT, honest.summary


async def test_honest_matmul_with_parameters_passes_cpu(cpu_gated: EvaluationService) -> None:
    result = await cpu_gated.evaluate(job("linear_relu", "honest_linear_relu"))
    check_verdict(result, case("honest_linear_relu", S.CORRECT))
    assert result.correctness is not None
    assert result.correctness.err_vs_fp64 is not None


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in GATED if c.gpu], ids=lambda c: c.name)
async def test_cheat_verdict_gpu(gpu_gated: EvaluationService, c: Case) -> None:
    result = await gpu_gated.evaluate(job("add_relu", c.name, timeout_s=c.timeout_s))
    check_verdict(result, c)
    assert result.device is not None
    assert result.device.kind.value == "cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in UNGATED if c.gpu], ids=lambda c: c.name)
async def test_runtime_layers_hold_without_gate_gpu(gpu_ungated: EvaluationService, c: Case) -> None:
    check_verdict(await gpu_ungated.evaluate(job("add_relu", c.name, timeout_s=c.timeout_s)), c)


@pytest.mark.gpu
async def test_tf32_dot_is_caught_on_gpu(gpu_gated: EvaluationService) -> None:
    honest = await gpu_gated.evaluate(job("linear_relu", "honest_linear_relu"))
    check_verdict(honest, case("honest_linear_relu", S.CORRECT))
    tf32 = await gpu_gated.evaluate(job("linear_relu", "tf32_dot"))
    check_verdict(tf32, case("tf32_dot", S.INCORRECT))
    assert tf32.correctness is not None
    assert honest.correctness is not None
    assert tf32.correctness.err_vs_fp64 is not None
    assert honest.correctness.err_vs_fp64 is not None
    assert tf32.correctness.err_vs_fp64 > 10 * honest.correctness.err_vs_fp64


def processes_under(root: Path) -> list[str]:
    """Processes whose working directory lies under ``root``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = proc.cwd()
        except (psutil.Error, OSError):
            continue
        if cwd.startswith(str(root)):
            found.append(f"{proc.pid}: {cwd}")
    return found


async def test_closing_the_service_leaves_no_process_behind(tmp_path: Path) -> None:
    service = EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=2))
    await service.start()
    result = await service.evaluate(job("add_relu", "spawn_children"))
    assert result.status is S.REJECTED
    await service.wait_spares(timeout_s=100)
    assert processes_under(tmp_path / "work")
    await service.aclose()
    assert processes_under(tmp_path / "work") == []
    assert marker_processes() == []


async def test_spares_that_keep_failing_stop_and_say_why(tmp_path: Path) -> None:
    """A worker that cannot start (here: an interpreter that exits at once) is retried a few
    times, then the pool stops starting spares and waiting for one fails with the reason."""
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'this interpreter is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    service = EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=2, python=str(broken)))
    await service.start()
    try:
        started = time.perf_counter()
        with pytest.raises(WorkerStartError, match="failed in a row"):
            await service.wait_spares(timeout_s=60)
        assert time.perf_counter() - started < 30
        assert service.runs is not None
        assert service.runs.starting == 0
    finally:
        await service.aclose()


async def test_compile_workers_run_at_the_run_workers_niceness(cpu_gated: EvaluationService) -> None:
    assert cpu_gated.compiler is not None
    assert cpu_gated.runs is not None
    run_prefix, compile_prefix = cpu_gated.runs.iso.prefix, cpu_gated.compiler.iso.prefix
    assert run_prefix[1:3] == ("-n", str(cpu_gated.cfg.worker_nice))
    assert compile_prefix == run_prefix
