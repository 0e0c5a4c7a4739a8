"""The candidate's own kernels timed one by one (``Profile.kernel_times``): after its timed calls,
its process runs one more forward with a timer around each of its own launches and sends the
totals per kernel in its ``done`` frame. The parent reads them as evidence for the report (never
for the verdict), names the template's kernels' families, and drops anything malformed, since the
candidate's code runs in that process. End to end on the CPU (Triton's interpreter), then the
parent's reading of the frame on its own."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpu_runner.assemble import candidate_profile
from gpu_runner.frames import KERNEL_NAME_CHARS, KERNEL_TIMES_KEPT, KernelTimer, Report, decode_report
from gpu_runner.kernel_times import kernel_family
from gpu_runner.service import EvaluationService
from gpu_runner.verdict import RunRecord
from schemas import CheckName, CheckOutcome, DeviceChoice, EvalStatus, OpFamily
from tests.gpu_runner.conftest import fast_config, job


@pytest.mark.timeout(180)
async def test_a_correct_candidates_own_kernels_are_timed_one_by_one_without_changing_its_verdict(
    tmp_path: Path,
) -> None:
    async with EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=1)) as service:
        result = await service.evaluate(job("add_relu", "honest_two_kernels"))
    assert result.status is EvalStatus.CORRECT, result.summary
    checks = {k.name: k.outcome for k in result.checks}
    assert checks[CheckName.TIMED_LAUNCHES] is CheckOutcome.PASSED
    profile = result.profile
    assert profile is not None
    assert profile.own_kernel_launches == 3
    assert profile.kernel_timer == KernelTimer.CPU.value
    by_name = {k.name: k for k in profile.kernel_times}
    assert set(by_name) == {"_kf_pw0", "relu_half"}, profile.kernel_times
    assert (by_name["_kf_pw0"].launches, by_name["relu_half"].launches) == (1, 2)
    assert (by_name["_kf_pw0"].family, by_name["relu_half"].family) == (OpFamily.PW, None)
    assert all(k.time_us > 0 for k in profile.kernel_times), profile.kernel_times
    times = [k.time_us for k in profile.kernel_times]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("_kf_conv0", OpFamily.CONV),
        ("_kf_mm12_b", OpFamily.MM),
        ("_kf_row3", OpFamily.ROW),
        ("_kf_pw1", OpFamily.PW),
        ("_kf_pool2_b", OpFamily.POOL),
        ("_kf_scan0", OpFamily.SCAN),
        ("_kf_attn4", OpFamily.ATTN),
        ("_kf_rec0", OpFamily.REC),
        ("_kf_layout0", None),  # a family, but no kind of the template's
        ("_kf_conv", None),
        ("_kf_conv0_any", None),
        ("_kf_mm1_bb", None),
        ("kf_conv0", None),
        ("my_kf_conv0", None),
        ("add_relu_kernel", None),
        ("", None),
    ],
)
def test_a_kernel_has_a_family_only_where_the_templates_name_says_it(name: str, family: OpFamily | None) -> None:
    assert kernel_family(name) is family


def _done(**fields: Any) -> dict[str, Any]:
    return {"kind": "done", "phases": {"timing_s": 0.5}, "jit_fallback": [], "ext_loaded": [], **fields}


def _profile_of(header: dict[str, Any]) -> Any:
    """The profile the parent builds from a ``done`` frame as a candidate's process sent it."""
    assert decode_report(header) is Report.DONE
    return candidate_profile(RunRecord(done=header), [{"own_launches": 2, "own_names": ["a"]}])


GOOD = {"name": "_kf_row0", "launches": 2, "time_us": 12.5}


@pytest.mark.parametrize(
    "fields",
    [
        {"kernel_times": "fast", "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": True, "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [GOOD], "kernel_timer": "stopwatch"},
        {"kernel_times": [GOOD], "kernel_timer": 3},
        {"kernel_times": [GOOD]},
        {"kernel_times": [GOOD, ["_kf_pw0", 1, 1.0]], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [GOOD, {**GOOD, "extra": 1}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [GOOD, GOOD], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "name": ""}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "name": 7}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "name": "k" * (KERNEL_NAME_CHARS + 1)}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "launches": 0}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "launches": 1.5}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "launches": True}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "time_us": math.nan}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "time_us": math.inf}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "time_us": -1.0}], "kernel_timer": KernelTimer.CPU.value},
        {"kernel_times": [{**GOOD, "time_us": "12"}], "kernel_timer": KernelTimer.CPU.value},
    ],
)
def test_malformed_kernel_times_from_the_candidates_process_give_none(fields: dict[str, Any]) -> None:
    profile = _profile_of(_done(**fields))
    assert profile.kernel_times == ()
    assert profile.kernel_timer is None
    assert (profile.own_kernel_launches, profile.kernel_names) == (2, ("a",))  # the rest stands


def test_kernel_times_come_largest_first_and_at_most_the_kept_number() -> None:
    sent = [{"name": f"k{i}", "launches": 1 + i % 3, "time_us": float(i)} for i in range(KERNEL_TIMES_KEPT + 6)]
    sent.append({"name": "_kf_conv0_b", "launches": 4, "time_us": 10_000})
    profile = _profile_of(_done(kernel_times=sent, kernel_timer=KernelTimer.CUDA.value))
    assert profile.kernel_timer == "cuda events per launch"
    assert len(profile.kernel_times) == KERNEL_TIMES_KEPT
    first = profile.kernel_times[0]
    assert (first.name, first.family, first.launches, first.time_us) == ("_kf_conv0_b", OpFamily.CONV, 4, 10_000.0)
    times = [k.time_us for k in profile.kernel_times]
    assert times == sorted(times, reverse=True)
    assert times[-1] == float(KERNEL_TIMES_KEPT + 6 - (KERNEL_TIMES_KEPT - 1))


def test_a_done_frame_without_kernel_times_gives_none() -> None:
    profile = _profile_of(_done())
    assert (profile.kernel_times, profile.kernel_timer) == ((), None)
