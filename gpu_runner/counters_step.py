"""The opt-in profiling step after a verdict: profiler counters for a correct candidate that is
short of speed-of-light, attached to its ``Profile`` with a check saying what happened."""

from __future__ import annotations

import asyncio

import structlog

from gpu_runner.isolation import Isolation
from gpu_runner.ncu import ProfileFailed, ncu_path, profile_counters
from schemas import Check, CheckOutcome, DeviceKind, EvalResult, EvalStatus, Profile

log = structlog.get_logger(__name__)

AT_SOL_FRACTION = 0.8
"""A candidate at this fraction of its speed-of-light bound is not profiled (nothing to learn)."""


def wants_counters(result: EvalResult) -> str | None:
    """Why ``result`` is not profiled, or ``None`` when it should be."""
    if result.status is not EvalStatus.CORRECT:
        return f"the candidate is {result.status.value}"
    if result.device is None or result.device.kind is not DeviceKind.CUDA:
        return "profiler counters need a CUDA GPU"
    if result.sol is not None and result.sol.fraction is not None and result.sol.fraction >= AT_SOL_FRACTION:
        return f"already at {result.sol.fraction:.0%} of speed-of-light"
    if ncu_path() is None:
        return "ncu is not on PATH"
    return None


async def with_counters(result: EvalResult, reference: str, candidate: str, iso: Isolation | None) -> EvalResult:
    """``result`` with ``profile.counters`` filled in (or a check saying why not). Runs after the
    timing, so the profiler's replays never share the GPU with a measurement."""
    skip = wants_counters(result)
    if skip is not None:
        check = Check(name="profile_counters", outcome=CheckOutcome.SKIPPED, detail=skip)
        return result.model_copy(update={"checks": (*result.checks, check)})
    try:
        counters = await asyncio.to_thread(profile_counters, reference, candidate, iso=iso)
    except ProfileFailed as exc:
        log.warning("profile_counters_failed", error=str(exc)[:500])
        check = Check(name="profile_counters", outcome=CheckOutcome.FAILED, detail=str(exc)[:1000])
        return result.model_copy(update={"checks": (*result.checks, check)})
    confined = "in the worker's confinement" if iso is not None and iso.layers is not None else "unconfined"
    check = Check(name="profile_counters", outcome=CheckOutcome.PASSED, detail=f"{counters.tool}, {confined}")
    profile = (result.profile or Profile()).model_copy(update={"counters": counters})
    return result.model_copy(update={"profile": profile, "checks": (*result.checks, check)})
