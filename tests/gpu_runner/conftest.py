"""Shared helpers of gpu_runner's tests: the candidate and reference files, and fast configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_runner.config import GIB, EvalJob, RunnerConfig
from schemas import DeviceChoice, KernelLanguage

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
REFERENCES = HERE / "references"


def reference(name: str) -> str:
    """Source of a reference task."""
    return (REFERENCES / f"{name}.py").read_text()


def candidate(name: str) -> str:
    """Source of a candidate."""
    return (CANDIDATES / f"{name}.py").read_text()


def fast_config(device: DeviceChoice, tmp: Path, **overrides: Any) -> RunnerConfig:
    """A config with short timing phases (tests check behaviour, not speed)."""
    base: dict[str, Any] = {
        "device": device,
        "spares": 2,
        "compile_workers": 2,
        "cache_dir": tmp / "cache",
        "work_dir": tmp / "work",
        "timing_budget_s": 0.3 if device is DeviceChoice.CPU else 2.0,
        "timing_min_reps": 3 if device is DeviceChoice.CPU else 30,
        "warmup_min_calls": 1 if device is DeviceChoice.CPU else 3,
        "host_memory_limit_bytes": (2 if device is DeviceChoice.CPU else 16) * GIB,
    }
    base.update(overrides)
    return RunnerConfig(**base)


def job(ref: str, cand: str, timeout_s: float = 120.0, **kw: Any) -> EvalJob:
    """A job for the named reference and candidate."""
    source = candidate(cand)
    language = KernelLanguage.CUDA if "load_inline" in source else KernelLanguage.TRITON
    return EvalJob(
        reference_source=reference(ref),
        candidate_source=source,
        language=language,
        timeout_s=timeout_s,
        candidate_id=cand,
        **kw,
    )


@pytest.fixture(scope="session")
def gpu_runner_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary directory shared by the gpu_runner test session."""
    return tmp_path_factory.mktemp("gpu_runner")
