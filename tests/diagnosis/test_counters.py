"""Profiler counters: Nsight Compute's CSV read into ``HardwareCounters`` (recorded tables written
by hand in the documented ``ncu --csv --print-units base`` format), what bounds a kernel by its
counters, how the rule diagnoser routes a profiled slow candidate, and the profiling step's
plumbing around a stand-in ``ncu`` executable (the real one runs in ``test_ncu_gpu``)."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from actors.diagnosis.counters import METRICS, Bound, CountersUnreadable, bound_of, describe, parse_ncu_csv
from actors.diagnosis.rules import RuleDiagnoser
from actors.experts.template import default_params, mutate
from actors.llm.prompts import build_messages
from gpu_runner.counters_step import with_counters
from gpu_runner.ncu import ProfileFailed, ncu_command, profile_counters
from schemas import CheckOutcome, DeviceKind, ExpertConfig, ExpertKind, GenerateRequest, HardwareCounters, Profile, Task
from schemas import DiagnosisCategory as C
from tests.evolution import factories as f
from tests.experts.llm_server import REFERENCE_SOURCE
from tests.experts.template_interp import plan_of
from tests.experts.test_template_gemm_variants import LONG_K

DATA = Path(__file__).parent / "data"


def _read(name: str) -> HardwareCounters:
    return parse_ncu_csv((DATA / name).read_text())


def test_counters_are_weighted_by_each_launchs_duration() -> None:
    c = _read("ncu_latency_bound.csv")
    assert c.kernels == 2
    assert c.duration_ms == pytest.approx(2.0)  # 1,800,000 ns + 200,000 ns, thousands separators read
    assert c.dram_throughput_pct == pytest.approx(0.9 * 21.5 + 0.1 * 48.0)
    assert c.sm_throughput_pct == pytest.approx(0.9 * 34.25 + 0.1 * 12.0)
    assert c.achieved_occupancy_pct == pytest.approx(0.9 * 12.4 + 0.1 * 30.0)
    assert [s.reason for s in c.stalls][:2] == ["long_scoreboard", "barrier"]
    total = 0.9 * (9.5 + 2.25 + 1.5 + 0.25 + 0.5) + 0.1 * (4.0 + 1.0)
    assert c.stalls[0].share == pytest.approx((0.9 * 9.5 + 0.1 * 4.0) / total)
    assert sum(s.share for s in c.stalls) <= 1.0


def test_the_counters_tell_memory_compute_and_latency_bound_apart() -> None:
    assert bound_of(_read("ncu_memory_bound.csv")) is Bound.MEMORY
    assert bound_of(_read("ncu_compute_bound.csv")) is Bound.COMPUTE
    assert bound_of(_read("ncu_latency_bound.csv")) is Bound.LATENCY
    assert bound_of(HardwareCounters(tool="ncu", kernels=1)) is None
    lines = describe(_read("ncu_memory_bound.csv"))
    assert "DRAM throughput 90%" in lines[0]
    assert lines[1].startswith("top warp stalls: long_scoreboard")


def test_output_without_a_metric_table_is_unreadable() -> None:
    with pytest.raises(CountersUnreadable, match="no metric table") as info:
        parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM\n")
    assert "Metric Name" in str(info.value)
    header = (DATA / "ncu_compute_bound.csv").read_text().splitlines()[0]
    with pytest.raises(CountersUnreadable, match="no rows"):
        parse_ncu_csv(header + "\n")


@pytest.mark.parametrize(
    ("table", "expected", "role"),
    [
        ("ncu_latency_bound.csv", C.SLOW_LATENCY_BOUND, "tiling"),
        ("ncu_memory_bound.csv", C.SLOW_MEMORY_BOUND, "memory"),
        ("ncu_compute_bound.csv", C.SLOW_COMPUTE_BOUND, "tiling"),
    ],
)
def test_a_profiled_slow_candidate_is_routed_by_its_counters_not_the_bound_model(
    table: str, expected: C, role: str
) -> None:
    cand = f.candidate()
    # The speed-of-light model alone calls this memory-bound at 40% of the bound.
    plain = f.correct(cand, median_ms=0.25, bound_ms=0.1, limiter="memory")
    assert RuleDiagnoser().diagnose(plain).category is C.SLOW_MEMORY_BOUND
    profile = Profile(kernel_launches=1, own_kernel_launches=1, counters=_read(table))
    d = RuleDiagnoser().diagnose(plain.model_copy(update={"profile": profile}))
    assert d.category is expected
    assert d.suggested_expert == role
    assert any("DRAM throughput" in e for e in d.evidence)
    assert d.hints


def test_latency_bound_mutations_change_the_work_in_flight() -> None:
    plan = plan_of(LONG_K.format(m=64, n=64, k=4096))
    rng = np.random.default_rng(3)
    params = default_params(plan)
    in_flight = {"mm_split_k", "mm_persistent", "mm_tma", "mm_stages", "mm_warps"}
    for _ in range(40):
        child = mutate(plan, params, rng, diagnosis=C.SLOW_LATENCY_BOUND)
        changed = {k for k, v in child.as_dict().items() if v != params.as_dict()[k]}
        assert changed, "no change"
        assert changed & in_flight, changed


def test_the_ncu_command_profiles_only_the_marked_forward_as_csv(tmp_path: Path) -> None:
    cmd = ncu_command("ncu", tmp_path / "log.csv", tmp_path / "r.py", tmp_path / "c.py", python="python3")
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert "--csv" in cmd
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(METRICS)
    assert cmd[-5:] == ["python3", "-m", "gpu_runner.ncu_target", str(tmp_path / "r.py"), str(tmp_path / "c.py")]
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "log.csv")


def _stand_in(tmp_path: Path, body: str) -> str:
    """An executable standing in for ``ncu``: it sees the same arguments and writes its log file."""
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


_WRITES_TABLE = """import sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
assert args[args.index("-m") + 1] == "gpu_runner.ncu_target"
open(log, "w").write(open({table!r}).read())
"""


def test_profile_counters_reads_the_log_file_the_profiler_writes(tmp_path: Path) -> None:
    exe = _stand_in(tmp_path, _WRITES_TABLE.format(table=str(DATA / "ncu_memory_bound.csv")))
    counters = profile_counters("reference", "candidate", iso=None, timeout_s=60, ncu=exe)
    assert counters.kernels == 2
    assert bound_of(counters) is Bound.MEMORY


def test_a_profiler_refused_the_counters_is_a_profile_failure_naming_the_reason(tmp_path: Path) -> None:
    exe = _stand_in(tmp_path, 'import sys\nprint("==ERROR== ERR_NVGPUCTRPERM - no permission")\nsys.exit(1)\n')
    with pytest.raises(ProfileFailed, match="ERR_NVGPUCTRPERM") as info:
        profile_counters("reference", "candidate", iso=None, timeout_s=60, ncu=exe)
    assert "exited 1" in str(info.value)


def test_only_correct_gpu_candidates_short_of_speed_of_light_are_profiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cand = f.candidate()
    on_cpu = f.correct(cand, median_ms=0.25, bound_ms=0.1, kind=DeviceKind.CPU)
    out = asyncio.run(with_counters(on_cpu, "r", "c", None))
    assert out.checks[-1].outcome is CheckOutcome.SKIPPED
    assert "CUDA" in (out.checks[-1].detail or "")
    at_sol = f.correct(cand, median_ms=0.11, bound_ms=0.1)
    assert "speed-of-light" in (asyncio.run(with_counters(at_sol, "r", "c", None)).checks[-1].detail or "")
    exe = _stand_in(tmp_path, _WRITES_TABLE.format(table=str(DATA / "ncu_latency_bound.csv")))
    monkeypatch.setenv("KF_NCU", exe)
    slow = f.correct(cand, median_ms=0.25, bound_ms=0.1)
    out = asyncio.run(with_counters(slow, "r", "c", None))
    assert out.checks[-1].outcome is CheckOutcome.PASSED, out.checks[-1]
    assert "unconfined" in (out.checks[-1].detail or "")
    assert out.profile is not None
    assert out.profile.counters is not None
    assert out.profile.kernel_launches == 1  # the rest of the profile is kept


def test_llm_prompts_name_the_gpu_its_limits_and_the_parents_counters() -> None:
    cand = f.candidate()
    result = f.correct(cand, median_ms=0.25, bound_ms=0.1)
    device = result.device.model_copy(update={"name": "NVIDIA H100 80GB HBM3"}) if result.device else None
    profile = Profile(kernel_launches=1, counters=_read("ncu_latency_bound.csv"))
    result = result.model_copy(update={"device": device, "profile": profile})
    req = GenerateRequest(
        run_id="r", island="i", task=Task.from_source("t", REFERENCE_SOURCE), parent=cand, parent_result=result
    )
    config = ExpertConfig(name="llm", kind=ExpertKind.LLM, base_url="http://127.0.0.1:9/v1", model="m", role="tiling")
    user = build_messages(req, config)[1]["content"]
    assert "## Target device\nH100: 132 SMs, 3350 GB/s DRAM, 227 KB shared memory per block" in user
    assert "top warp stalls: long_scoreboard" in user
    assert "achieved occupancy 14%" in user
