"""Pure units of gpu_runner: config validation, the wire, the trusted comparison and statistics."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_runner.compare import (
    ParityError,
    TrialCheck,
    compare_trial,
    defaults_at,
    kept_defaults,
    parity_outputs,
    precision_rule,
    speed_of_light,
    timing_stats,
)
from gpu_runner.config import DEFAULT_PRECISION_FLOORS, DEFAULT_TOLERANCES, EvalJob, RunnerConfig
from gpu_runner.errors import ConfigError
from gpu_runner.protocol import FrameError, encode_frame, read_frame, tensor_from_wire
from gpu_runner.run_stage import profile_kernels
from gpu_runner.stats import NOISE_FACTOR, median_rel_stderr
from schemas import KernelLanguage, TimerKind
from tests.gpu_runner.conftest import reference

TOL, FLOORS = dict(DEFAULT_TOLERANCES), dict(DEFAULT_PRECISION_FLOORS)


@pytest.mark.parametrize(
    ("field", "value"),
    [("trials", 3), ("spares", -1), ("max_concurrent_runs", 0), ("timing_target_rel_err", 0.0), ("python", "/no/py")],
)
def test_config_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        RunnerConfig(**{field: value})  # type: ignore[arg-type]
    assert f"RunnerConfig.{field}" in str(info.value)
    assert info.value.value == value


def test_job_refuses_non_positive_timeout() -> None:
    with pytest.raises(ConfigError, match=r"timeout_s"):
        EvalJob(reference_source="x", candidate_source="y", language=KernelLanguage.TRITON, timeout_s=0)


def test_frames_round_trip_through_a_pipe() -> None:
    r, w = os.pipe()
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    os.write(w, encode_frame({"kind": "trial", "tensors": [{"dtype": "float32", "shape": [2, 3]}]}, [data.tobytes()]))
    header, blobs = read_frame(r)
    os.close(r)
    os.close(w)
    assert header["kind"] == "trial"
    assert np.array_equal(tensor_from_wire(header["tensors"][0], blobs[0]), data)


def test_wire_refuses_unknown_dtypes_and_wrong_sizes() -> None:
    with pytest.raises(FrameError, match="not accepted"):
        tensor_from_wire({"dtype": "object", "shape": [1]}, b"\0" * 8)
    with pytest.raises(FrameError, match="do not hold"):
        tensor_from_wire({"dtype": "float32", "shape": [3]}, b"\0" * 8)


def test_wire_widens_bfloat16_exactly() -> None:
    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(tensor_from_wire({"dtype": "bfloat16", "shape": [3]}, bits.tobytes()), values)


def _trial(cand: np.ndarray, ref: np.ndarray, ref64: np.ndarray) -> TrialCheck:
    residual = (ref64 - ref.astype(np.float64)).astype(np.float32)
    return compare_trial([cand], ["float32"], [ref], ["float32"], [residual], TOL, FLOORS, 10.0)


def test_compare_passes_honest_fp32_and_catches_reduced_precision() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 512)), rng.standard_normal((512, 64))
    exact = a @ b
    eager = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    honest = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32) + np.float32(1e-7)

    # TF32 keeps 10 mantissa bits of each operand.
    def tf32(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    reduced = (tf32(a) @ tf32(b)).astype(np.float32)
    ok = _trial(honest, eager, exact)
    bad = _trial(reduced, eager, exact)
    assert ok.ok is True
    assert bad.ok is False
    assert bad.category == "incorrect.precision"


def test_compare_reports_nan_and_shape_mismatches() -> None:
    ref = np.ones(8, dtype=np.float32)
    nan = ref.copy()
    nan[3] = np.nan
    res = _trial(nan, ref, ref.astype(np.float64))
    assert res.category == "incorrect.nan_inf"
    assert res.first_bad == (3,)
    grid = np.ones((30, 50), dtype=np.float32)
    off = grid.copy()
    off[2, 1] = 2.0
    res = _trial(off, grid, grid.astype(np.float64))
    assert (res.category, res.first_bad) == ("incorrect.boundary", (2, 1))
    short = compare_trial([ref[:4]], ["float32"], [ref], ["float32"], None, TOL, FLOORS, 10.0)
    assert short.category == "incorrect.shape"


def test_chunked_compare_matches_a_whole_array_computation() -> None:
    """Error sums gathered chunk by chunk equal the same figures computed over the whole array."""
    rng = np.random.default_rng(1)
    n = 3 * (1 << 18) + 1234
    exact = rng.standard_normal(n)
    ref = exact.astype(np.float32)
    cand = (exact + rng.standard_normal(n) * 1e-6).astype(np.float32)
    res = _trial(cand, ref, exact)
    c64, r64 = cand.astype(np.float64), ref.astype(np.float64)
    assert res.err64 == pytest.approx(np.linalg.norm(c64 - exact) / np.linalg.norm(exact), rel=1e-9)
    assert res.ref_err64 == pytest.approx(np.linalg.norm(r64 - exact) / np.linalg.norm(exact), rel=1e-6)
    assert res.max_abs == pytest.approx(np.abs(c64 - r64).max())
    far = cand.copy()
    far[-5] += 1.0
    bad = _trial(far, ref, exact)
    assert (bad.ok, bad.first_bad) == (False, (n - 5,))


def _cancelling_sums() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row sums of 4096 terms of size ~100 whose truth is near zero (a GEMM summed over its rows, as
    KernelBench level 2 problem 14 does): float32 in chunks of 128 (the reference) and of 512 (the
    candidate), and the float64 truth. Both float32 results are ~1e-3 off the truth."""
    rng = np.random.default_rng(0)
    terms = (rng.standard_normal((256, 4096)) * 100).astype(np.float32)
    terms[:, -1] -= (terms.astype(np.float64).sum(1) - rng.standard_normal(256) * 1e-3).astype(np.float32)

    def chunked(k: int) -> np.ndarray:
        acc = np.zeros(terms.shape[0], np.float32)
        for i in range(0, terms.shape[1], k):
            acc = (acc + terms[:, i : i + k].sum(1, dtype=np.float32)).astype(np.float32)
        return acc

    return chunked(512), chunked(128), terms.astype(np.float64).sum(1)


def test_elements_outside_the_tolerance_are_judged_against_the_truth_and_the_references_own_error() -> None:
    cand, eager, exact = _cancelling_sums()
    assert np.abs(cand - eager).max() > 1e-3  # outside atol=rtol=1e-4 around the reference
    assert _trial(cand, eager, exact).ok  # but as close to the truth as eager PyTorch is
    without_truth = compare_trial([cand], ["float32"], [eager], ["float32"], None, TOL, FLOORS, 10.0)
    assert not without_truth.ok  # no float64 truth: the tolerance around the reference decides
    worst = np.abs(eager.astype(np.float64) - exact).max()
    bad = cand.copy()
    bad[7] += np.float32((NOISE_FACTOR + 2) * worst)  # one element further off than the allowance
    res = _trial(bad, eager, exact)
    assert (res.ok, res.category) == (False, "incorrect.other")


def test_the_judges_scan_and_the_hosts_allow_the_same_noise() -> None:
    import torch

    from gpu_runner.compare import _scan
    from gpu_runner.sandboxed.judging import _scan_chunk

    cand, eager, exact = _cancelling_sums()
    residual = (exact - eager.astype(np.float64)).astype(np.float32)
    ours = _scan(cand, eager, residual, 1e-4, 1e-4)
    names = ("nan_bad", "outside", "max_abs", "max_rel", "sq_err", "sq_ref_err", "sq_exact")
    theirs: dict[str, Any] = dict.fromkeys(names, 0)
    theirs |= {"nan_first": None, "outside_first": None, "truth_excess": float("-inf"), "ref_err_max": 0.0}
    t = torch.from_numpy
    _scan_chunk(theirs, 0, t(cand), t(eager), t(residual), 1e-4, 1e-4)
    assert ours.outside == theirs["outside"] > 0
    assert theirs["truth_excess"] == pytest.approx(ours.truth_excess, rel=1e-9)
    assert theirs["ref_err_max"] == pytest.approx(ours.ref_err_max, rel=1e-9)
    assert ours.truth_excess <= NOISE_FACTOR * ours.ref_err_max


def test_the_fp32_ceiling_is_the_fastest_fp32_accurate_scheme_the_check_accepts() -> None:
    from gpu_runner.sandboxed.common import table_peaks

    # An H100 at 1024x8192x8192: three TF32 passes (accepted as fp32-accurate) ran it at 1.54x over
    # eager, 117% of the CUDA-core bound; against the tf32x3 bound it is a plausible 42%.
    h100 = table_peaks("NVIDIA H100 80GB HBM3")
    assert h100["tflops_fp32"] == pytest.approx(494.0 / 3)
    info = {
        "flops": 2 * 1024 * 8192 * 8192,
        "bytes_moved": 4 * (1024 * 8192 + 8192 * 8192 + 1024),
        "out_dtype": "float32",
    }
    sol = speed_of_light(info, h100, None, None, 2.0)
    assert sol is not None
    assert sol.limiter == "compute"
    assert sol.fraction == pytest.approx(0.416, abs=0.01)
    # where precision parity admits the reference's own TF32, one TF32 pass is the ceiling
    tf32 = speed_of_light(info, h100, None, None, 2.0, tf32=True)
    assert tf32 is not None
    assert tf32.peak_tflops == pytest.approx(494.0)
    assert tf32.fraction == pytest.approx(0.416 / 3, abs=0.01)
    assert table_peaks("NVIDIA L40S")["tflops_fp32"] == 91.6  # its CUDA cores beat a third of its TF32
    assert table_peaks("NVIDIA H200")["tflops_16"] == 989.0
    assert table_peaks("Some GPU")["tflops_fp32"] is None


def test_timing_stats_and_speed_of_light() -> None:
    stats = timing_stats([1.0, 2.0, 3.0, 4.0], TimerKind.CUDA_EVENT, wall=[5.0, 6.0, 7.0])
    assert stats is not None
    assert stats.median_ms == 2.5
    assert stats.wall_ms == 6.0
    assert stats.reps == 4
    assert stats.median_rel_stderr is None  # too few samples to bound the median
    many = timing_stats([1.0, 1.01] * 20, TimerKind.CUDA_EVENT)
    assert many is not None
    assert many.median_rel_stderr is not None
    assert 0 < many.median_rel_stderr < 0.01
    sol = speed_of_light({"flops": 0, "bytes_moved": 4_300_000, "out_dtype": "float32"},
                         {"gbps": 4300.0, "tflops_fp32": 60.0}, None, None, 0.002)  # fmt: skip
    assert sol is not None
    assert sol.limiter == "memory"
    assert sol.bound_ms == pytest.approx(0.001)
    assert sol.fraction == pytest.approx(0.5)


def test_median_precision_ignores_outliers_that_the_mean_does_not() -> None:
    rng = np.random.default_rng(7)
    normal = rng.normal(100.0, 10.0, size=(400, 400))
    # Close to the theory for a normal sample (1.2533 sigma / sqrt(n)), a little conservative.
    est = np.mean([median_rel_stderr(list(row)) * np.median(row) for row in normal])
    assert 1.2533 * 10 / 20 <= est <= 1.15 * 1.2533 * 10 / 20
    assert median_rel_stderr([1.0] * 7) == float("inf")
    assert median_rel_stderr([0.0] * 30) == float("inf")
    tailed = list(rng.normal(100.0, 1.0, size=300))
    tailed[::25] = [1000.0] * len(tailed[::25])  # 4% of calls ten times slower
    mean_rel = np.std(tailed, ddof=1) / np.sqrt(len(tailed)) / np.mean(tailed)
    assert mean_rel > 0.05
    assert median_rel_stderr(tailed) < 0.002


def test_default_cache_dir_follows_kfoundry_home(kf_home: Path) -> None:
    assert RunnerConfig().resolved_cache_dir() == kf_home / "cache"


def test_bulk_files_are_read_once_and_refused_when_forged(tmp_path: Path) -> None:
    """Large tensors travel as files; a link, a wrong size or a path outside the folder is refused."""
    from gpu_runner.protocol import read_bulk, write_bulk

    data = np.arange(1000, dtype=np.float32)
    refs = write_bulk(str(tmp_path), 1, [data.data])
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (blob,) = read_bulk(dir_fd, refs, 1 << 20)
        assert np.array_equal(np.frombuffer(blob, dtype=np.float32), data)
        assert not list(tmp_path.iterdir())  # unlinked once read
        secret = tmp_path.parent / "secret.bin"
        secret.write_bytes(b"\0" * 4000)
        (tmp_path / "b2_0").symlink_to(secret)
        with pytest.raises(FrameError, match="b2_0"):
            read_bulk(dir_fd, [{"file": "b2_0", "nbytes": 4000}], 1 << 20)
        (tmp_path / "b3_0").write_bytes(b"\0" * 10)
        with pytest.raises(FrameError, match="not a regular file of 4000 bytes"):
            read_bulk(dir_fd, [{"file": "b3_0", "nbytes": 4000}], 1 << 20)
        for bad in ("../secret.bin", "", "."):
            with pytest.raises(FrameError, match="bad bulk file name"):
                read_bulk(dir_fd, [{"file": bad, "nbytes": 4000}], 1 << 20)
        with pytest.raises(FrameError, match="cap"):
            read_bulk(dir_fd, [{"file": "b4_0", "nbytes": 1 << 30}], 1 << 20)
    finally:
        os.close(dir_fd)


def test_output_slots_carry_a_trials_outputs_as_bulk_files(tmp_path: Path) -> None:
    """Trial outputs copied into pre-made files arrive at the parent exactly as packed ones do."""
    import torch

    from gpu_runner.protocol import read_bulk
    from gpu_runner.sandboxed.common import OutputSlots, pack

    refs = [
        [torch.zeros(3, 5), torch.zeros(7, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int64), torch.zeros(0)]
    ] * 2
    slots = OutputSlots(str(tmp_path), refs, torch.device("cpu"), prefix="ref")
    outs = [torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.tensor([4, -9]), torch.zeros(0)]
    filled = slots.fill(1, outs)
    assert filled is not None
    metas, bulk = filled
    assert metas == pack(outs)[0]
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        blobs = read_bulk(dir_fd, bulk, 1 << 20)
        for meta, blob, out in zip(metas, blobs, outs, strict=True):
            assert np.array_equal(
                tensor_from_wire(meta, blob), out.float().numpy() if out.is_floating_point() else out.numpy()
            )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ref0_0", "ref0_1", "ref0_2", "ref0_3"]  # 1 was read
    finally:
        os.close(dir_fd)
    # Outputs that differ from the reference's in shape or dtype, or in number, go the usual way.
    assert slots.fill(0, [torch.zeros(5, 3), *outs[1:]]) is None
    assert slots.fill(0, [outs[0].double(), *outs[1:]]) is None
    assert slots.fill(0, [*outs, torch.zeros(1)]) is None
    slots.release()  # the files stay for the parent; the mappings go
    assert not slots.slots
    assert len(list(tmp_path.iterdir())) == 4


def test_kernel_profile_only_where_launch_hooks_cannot_see() -> None:
    triton_only = "import triton\n@triton.jit\ndef k(x): pass\n"
    assert profile_kernels("cuda", triton_only, {}, True)[0] is False
    assert profile_kernels("cuda", triton_only, {}, False)[0] is True  # gate off: nothing ruled out
    assert profile_kernels("cuda", triton_only, {"ext": "/x/ext.so"}, True)[0] is True
    assert profile_kernels("cuda", "from torch.utils.cpp_extension import load_inline", {}, True)[0] is True
    assert profile_kernels("cpu", "load_inline", {"ext": "/x/ext.so"}, False)[0] is False


def test_out_of_memory_within_the_plan_is_the_evaluators_fault_not_the_candidates() -> None:
    from gpu_runner.verdict import error_status
    from schemas import EvalStatus

    gib = 1 << 30
    oom = {"stage": "timing", "etype": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 6.00 GiB"}
    within = {**oom, "device_reserved": 40 * gib, "device_requested": 6 * gib}
    status, summary, _ = error_status(within, planned_bytes=50 * gib)
    assert status is EvalStatus.EVALUATOR_ERROR
    assert "within the memory plan" in summary
    beyond = {**oom, "device_reserved": 48 * gib, "device_requested": 6 * gib}
    status, summary, finding = error_status(beyond, planned_bytes=50 * gib)
    assert status is EvalStatus.RUNTIME_ERROR
    assert "54.0 GiB needed of 50.0 GiB planned" in summary
    assert finding is not None
    # without a plan (the CPU, or a process that reported nothing) the candidate's process is blamed
    assert error_status(within)[0] is EvalStatus.RUNTIME_ERROR
    assert error_status(oom, planned_bytes=50 * gib)[0] is EvalStatus.RUNTIME_ERROR
    # at the import too (other processes took the memory while the candidate's module loaded)
    at_import = {**within, "stage": "import"}
    assert error_status(at_import, planned_bytes=50 * gib)[0] is EvalStatus.EVALUATOR_ERROR
    assert error_status({**beyond, "stage": "import"}, planned_bytes=50 * gib)[0] is EvalStatus.COMPILE_ERROR
    assert error_status({"stage": "import", "etype": "SyntaxError", "message": "x"})[0] is EvalStatus.COMPILE_ERROR


def test_reference_outputs_are_made_without_tf32_and_the_defaults_come_back() -> None:
    """cuDNN convolutions default to TF32; the outputs a candidate is compared with must not be."""
    import torch

    from gpu_runner.sandboxed.reference import exact_fp32

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (cudnn.allow_tf32, matmul.allow_tf32)
    try:
        cudnn.allow_tf32, matmul.allow_tf32 = True, True  # what a user's process may have
        with exact_fp32():
            assert (cudnn.allow_tf32, matmul.allow_tf32) == (False, False)
        assert (cudnn.allow_tf32, matmul.allow_tf32) == (True, True)
        with pytest.raises(ValueError, match="boom"), exact_fp32():
            raise ValueError("boom")
        assert (cudnn.allow_tf32, matmul.allow_tf32) == (True, True)
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = before


def test_the_compile_stage_builds_a_large_candidate_with_empty_parameters_and_no_initialisation() -> None:
    import torch

    from gpu_runner.sandboxed.compiling import _build_candidate

    seen: list[str] = []

    class Big(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            seen.append(torch.empty(0).device.type)  # where its parameters are created
            self.linear = torch.nn.Linear(n, 2 * n)

    empty = _build_candidate(Big, [64], empty_params=True)
    initialised = _build_candidate(Big, [64], empty_params=False)
    assert seen == ["meta", "cpu"]
    for model in (empty, initialised):
        assert model.linear.weight.device.type == "cpu"
        assert model.linear.weight.shape == (128, 64)


def test_inputs_drawn_on_the_device_fall_back_to_the_cpu_the_same_way_each_time() -> None:
    """Inputs of 1 MiB and more are drawn on the GPU; a ``get_inputs`` that needs the CPU is drawn
    there, under the same seed, by whichever process draws them (here ``meta`` stands for the GPU)."""
    import torch

    from gpu_runner.memplan import INPUTS_ON_DEVICE_BYTES, ON_DEVICE_BYTES
    from gpu_runner.sandboxed.reference import make_inputs

    assert INPUTS_ON_DEVICE_BYTES <= 64 << 20 < ON_DEVICE_BYTES  # a 4096x4096 float32 input is drawn on the GPU
    drawn: list[torch.Tensor] = []

    def needs_cpu() -> list[torch.Tensor]:
        x = torch.randn(8)
        drawn.append(x)
        return [torch.from_numpy(x.numpy()) * 2]  # .numpy() works on CPU tensors only

    def plain() -> list[torch.Tensor]:
        x = torch.randn(8)
        drawn.append(x)
        return [x]

    meta = torch.device("meta")
    (out,) = make_inputs({"get_inputs": needs_cpu}, 7, meta, on_device=True)
    assert [x.device.type for x in drawn] == ["meta", "cpu"]
    assert out.device.type == "meta"
    make_inputs({"get_inputs": needs_cpu}, 7, torch.device("cpu"))
    assert torch.equal(drawn[1], drawn[2])  # the fallback drew what the CPU path draws: same seed, same values
    drawn.clear()
    (out,) = make_inputs({"get_inputs": plain}, 7, meta, on_device=True)
    assert [x.device.type for x in drawn] == ["meta"]
    assert out.device.type == "meta"


def test_inputs_that_find_the_device_full_are_not_drawn_on_the_cpu_instead() -> None:
    """The CPU's generator draws other numbers than the GPU's: a spare that drew on the CPU because
    the GPU was full had other inputs than the judge (KernelBench L1-57 on an 80 GB H100, judged
    ``get_inputs() is not reproducible``). Out of memory is raised (here ``meta`` stands for the
    GPU and the draw itself raises what a full GPU's allocator raises)."""
    from gpu_runner.sandboxed.reference import make_inputs

    drawn: list[str] = []

    def big() -> list[torch.Tensor]:
        x = torch.randn(8)
        drawn.append(x.device.type)
        if x.device.type != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [x]

    with pytest.raises(torch.OutOfMemoryError):
        make_inputs({"get_inputs": big}, 7, torch.device("meta"), on_device=True)
    assert drawn == ["meta"]


class _FailsOnce(torch.nn.Module):
    """A model whose first call raises (as a compilation that lost a race for its cache would)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("first call fails")
        return x * 2.0 + 1.0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports, as in the worker
def test_the_compiled_baseline_is_tried_again_after_a_failure() -> None:
    from gpu_runner.sandboxed.common import Channel
    from gpu_runner.sandboxed.reference import build_compiled

    x = torch.arange(8, dtype=torch.float32)
    read_fd, write_fd = os.pipe()
    try:  # on the CPU it sends nothing
        compiled, error = build_compiled(_FailsOnce(), [x], torch.device("cpu"), Channel(read_fd, write_fd))
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert error is None
    assert compiled is not None
    torch.testing.assert_close(compiled(x), x * 2.0 + 1.0)


def test_range_trials_take_the_defaults_error_measured_at_their_scale() -> None:
    typical = [{"rel_l2": 4e-4, "max_rms": 0.002}, None]
    at_large = [{"rel_l2": 6e-4, "max_rms": 0.024}, None]
    info: dict[str, Any] = {
        "default_errors": typical,
        "range_scales": [1e6, 1e-6],
        "range_default_errors": [at_large, None],
    }
    assert defaults_at(info, 1.0) == typical
    assert defaults_at(info, 1e6) == at_large
    assert defaults_at(info, 1e-6) == typical  # not measured there: the typical draws' stands
    assert defaults_at(info, 1e2) == typical
    partial = {**info, "range_default_errors": [[None, None], None]}
    assert defaults_at(partial, 1e6) == typical  # per output, the typical draws' where none was taken
    assert defaults_at({"default_errors": None, "range_scales": [1e6]}, 1e6) is None
    cfg = RunnerConfig()
    large = precision_rule(cfg, info, None, 1e6)
    assert large.parity[0] is not None
    assert large.parity[0].max_rms == 0.024
    assert precision_rule(cfg, info, "exact", 1e6).parity == ()


def test_a_trial_is_held_to_the_reference_s_error_on_its_own_inputs() -> None:
    """Where the task grants precision parity, a trial's bar is the reference's error at PyTorch's
    defaults measured on that trial's inputs, not the calibration draw's; outputs without parity,
    the exact mode and malformed measures keep what they had."""
    info: dict[str, Any] = {"default_errors": [{"rel_l2": 6e-4, "max_rms": 0.008}, None]}
    cfg = RunnerConfig()
    measured = [{"rel_l2": 3.9e-3, "max_rms": 0.34}, {"rel_l2": 1.0, "max_rms": 9.0}]
    rule = precision_rule(cfg, info, None, 1.0, measured)
    assert rule.parity[0] is not None
    assert rule.parity[0].max_rms == 0.34
    assert rule.parity[0].rel_l2 == 3.9e-3
    assert rule.parity[1] is None  # no parity for it: a measure does not grant one
    assert precision_rule(cfg, info, "exact", 1.0, measured).parity == ()
    bad = [{"rel_l2": float("nan"), "max_rms": 0.34}, None]
    assert precision_rule(cfg, info, None, 1.0, bad).parity[0] == precision_rule(cfg, info).parity[0]
    assert precision_rule(cfg, info, None, 1.0, None) == precision_rule(cfg, info)
    assert parity_outputs(info) == [True, False]
    assert parity_outputs({"default_errors": [None, None], "range_default_errors": [[None, {"rel_l2": 1}]]}) == [
        False,
        True,
    ]
    assert parity_outputs({"default_errors": None}) == []


def test_a_measure_of_the_defaults_that_fell_back_to_ieee_is_kept_out() -> None:
    """On an H100 the restarted referee of a 2 GiB transposed convolution measured its defaults at
    2.2e-07 (cuDNN short of workspace memory took an IEEE algorithm) where its first start had
    2.7e-04 (TF32, as the user's model runs): such a measure, a trial's or a restart's, gives way
    to the earlier one; draws that differ as draws do (a few times) are taken as they come."""
    tf32 = {"rel_l2": 2.7e-4, "max_rms": 0.004, "exact_rel_l2": 2.2e-7}
    ieee = {"rel_l2": 2.2e-7, "max_rms": 1e-5, "exact_rel_l2": 2.2e-7}
    other_draw = {"rel_l2": 9e-5, "max_rms": 0.02, "exact_rel_l2": 2.1e-7}
    info: dict[str, Any] = {"default_errors": [tf32, None]}
    cfg = RunnerConfig()
    task_rule = precision_rule(cfg, info)
    assert precision_rule(cfg, info, None, 1.0, [ieee, None]).parity == task_rule.parity
    assert precision_rule(cfg, info, None, 1.0, [other_draw, None]).parity[0] == ParityError(9e-5, 0.02)

    merged, kept = kept_defaults(info, {"default_errors": [ieee, None], "compiled": True})
    assert merged["default_errors"] == [tf32, None]
    assert kept == [0]
    assert merged["compiled"] is True  # the rest of the new header stands
    merged, kept = kept_defaults(info, {"default_errors": None})  # bit for bit IEEE: nothing granted
    assert merged["default_errors"] == [tf32, None]
    assert kept == [0]
    merged, kept = kept_defaults(info, {"default_errors": [other_draw, None]})
    assert merged["default_errors"] == [other_draw, None]
    assert kept == []
    ranged = {**info, "range_scales": [1e6, 1e-6], "range_default_errors": [[tf32, None], None]}
    again = {"default_errors": [tf32, None], "range_scales": [1e6, 1e-6], "range_default_errors": [[ieee, None], None]}
    merged, kept = kept_defaults(ranged, again)
    assert merged["range_default_errors"] == [[tf32, None], None]
    assert kept == [0]
    moved = {**again, "range_scales": [1e5, 1e-6]}  # other scales: nothing to compare with
    assert kept_defaults(ranged, moved)[0]["range_default_errors"] == [[ieee, None], None]


def test_a_restarted_referee_keeps_its_first_start_s_measure_of_the_defaults() -> None:
    """The parent's referee handle remembers each task's first measure and applies
    :func:`kept_defaults` to every later start of that task (not to another task's)."""
    from gpu_runner.lease import GpuGate
    from gpu_runner.referee import Referee

    async def never() -> Any:
        raise AssertionError("no process is started here")

    referee = Referee(never, GpuGate(), nice=0, timeout_s=1.0)
    tf32 = {"rel_l2": 2.7e-4, "max_rms": 0.004}
    ieee = {"rel_l2": 2.2e-7, "max_rms": 1e-5}
    assert referee._defaults_kept("a", {"default_errors": [tf32]})["default_errors"] == [tf32]
    assert referee._defaults_kept("a", {"default_errors": [ieee]})["default_errors"] == [tf32]
    assert referee._defaults_kept("b", {"default_errors": [ieee]})["default_errors"] == [ieee]


def test_a_calibration_that_fell_back_is_raised_to_a_trial_s_measure() -> None:
    """A trial's measure 100x above the task's calibration raises it (at the trial's scale; a
    typical draws' raise releases the range scales' measures that fell back beside it); a measure
    of other draws or below the calibration changes nothing; another task's is ignored."""
    from gpu_runner.compare import raise_defaults, release_fallbacks
    from gpu_runner.lease import GpuGate
    from gpu_runner.referee import Referee

    tf32 = {"rel_l2": 3.5e-4, "max_rms": 0.004}
    ieee = {"rel_l2": 4.3e-7, "max_rms": 1e-5}
    other_draw = {"rel_l2": 9e-7, "max_rms": 2e-5}
    calibration: list[Any] = [ieee, None]
    assert raise_defaults(calibration, [other_draw, tf32]) == []  # IEEE draws differ; no calibration for output 1
    assert raise_defaults(calibration, [tf32, tf32]) == [0]
    assert calibration == [tf32, None]
    assert raise_defaults(calibration, [ieee, None]) == []  # a fallback never lowers it
    assert calibration == [tf32, None]
    assert raise_defaults(calibration, None) == []
    assert raise_defaults(None, [tf32, tf32]) == []
    ranged: list[Any] = [ieee, tf32]
    assert release_fallbacks(ranged, [tf32, tf32]) == [0]
    assert ranged == [None, tf32]

    async def never() -> Any:
        raise AssertionError("no process is started here")

    referee = Referee(never, GpuGate(), nice=0, timeout_s=1.0)
    header = {"default_errors": [ieee], "range_scales": [1e6], "range_default_errors": [[ieee]]}
    referee.info, referee.task = referee._defaults_kept("a", header), "a"
    spare_info = dict(referee.info)  # a spare's copy, as the pool makes it
    assert referee.raise_defaults("b", [tf32]) == []
    assert referee.raise_defaults("a", [tf32], 1e6) == [0]  # the range scale's own
    assert referee.info["range_default_errors"] == [[tf32]]
    assert referee.info["default_errors"] == [ieee]
    assert precision_rule(RunnerConfig(), spare_info, None, 1e6).parity == (ParityError(3.5e-4, 0.004),)
    referee.info["range_default_errors"] = [[ieee]]
    assert referee.raise_defaults("a", [tf32]) == [0]
    assert spare_info["default_errors"] == [tf32]  # the spares see it at once
    assert referee.info["range_default_errors"] == [[None]]  # the range scale's fallback gives way
    assert precision_rule(RunnerConfig(), spare_info, None, 1.0, [ieee]).parity == (ParityError(3.5e-4, 0.004),)
    # a restart that falls back keeps the raised measure
    assert referee._defaults_kept("a", {"default_errors": [ieee]})["default_errors"] == [tf32]


def test_the_referee_measures_each_trial_s_defaults_on_its_inputs() -> None:
    """``truth`` runs the reference at PyTorch's defaults on the trial's own inputs too (here the
    CPU stand-in for cuDNN's TF32): the measure is that run's error against float64, and it
    changes with the draw (the calibration draw's is one sample of it)."""
    from gpu_runner.sandboxed.reference import build_model, error_at_defaults, load_module, make_inputs, truth

    ns = load_module(reference("conv_bn_tf32_flag"), "ref.py", "kf_test_ref")
    model = build_model(ns["Model"], list(ns["get_init_inputs"]()), 7, torch.device("cpu"), False)
    model64 = copy.deepcopy(model).to(torch.float64)
    seen = []
    for seed in (1, 2, 3):
        inputs = make_inputs(ns, seed, torch.device("cpu"), scale=1e6)
        outs, residuals, fp64_error, measured = truth(model, model64, inputs, [True])
        assert fp64_error is None
        assert measured is not None
        assert measured[0] is not None
        with torch.no_grad():
            defaults = model(*[x.clone() for x in inputs])
            expected = error_at_defaults(model64(*[x.double() for x in inputs]), defaults)
        assert measured[0] == pytest.approx(expected)
        assert measured[0]["rel_l2"] > 10 * float(residuals[0].norm() / outs[0].norm())  # TF32, not IEEE
        seen.append(measured[0]["max_rms"])
        assert truth(model, model64, inputs, [False])[3] is None  # no parity: no second forward
        assert truth(model, model64, inputs)[3] is None
    assert len(set(seen)) == 3
