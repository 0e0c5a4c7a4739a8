"""The typed frames between the evaluator and its workers: what each side accepts and refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_runner.config import RunnerConfig
from gpu_runner.frames import MeasureOp, Op, Report, decode_op, decode_report, op_frame
from gpu_runner.isolation import Isolation, sandbox_settings
from gpu_runner.protocol import FrameError, read_frame, write_frame


def _through_pipe(header: dict[str, object]) -> dict[str, object]:
    r, w = os.pipe()
    try:
        write_frame(w, header)
        got, _ = read_frame(r)
    finally:
        os.close(r)
        os.close(w)
    return got


def test_a_report_read_from_a_pipe_comes_back_as_its_kind() -> None:
    header = _through_pipe({"kind": "trial", "trial": 2, "tensors": [], "info": {"own_launches": 1}})
    assert decode_report(header) is Report.TRIAL
    assert header["kind"] is Report.TRIAL


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"kind": "trial_done"}, "unknown report kind"),
        ({"op": "go"}, "unknown report kind"),
        ({"kind": "trial", "tensors": [], "info": {}}, "has no 'trial'"),
        ({"kind": "trial", "trial": "0", "tensors": [], "info": {}}, "'trial' is not int (str)"),
        ({"kind": "trial", "trial": True, "tensors": [], "info": {}}, "'trial' is not int (bool)"),
        ({"kind": "memory", "peak_bytes": 1.5}, "'peak_bytes' is not int (float)"),
        ({"kind": "trial", "trial": 0, "tensors": [7], "info": {}}, "'tensors' is not list[dict[str, Any]] (list)"),
        ({"kind": "error", "stage": "forward", "etype": "X"}, "has no 'message'"),
    ],
)
def test_a_worker_frame_of_unknown_kind_or_wrong_shape_is_a_frame_error(header: dict[str, object], match: str) -> None:
    with pytest.raises(FrameError) as caught:
        decode_report(_through_pipe(header))
    assert match in str(caught.value)


def test_a_report_may_carry_measurements_beyond_its_declared_fields() -> None:
    header = {"kind": "timed", "samples": [0.5], "calls": 1, "timer": "cuda_event", "host_us": 41.0}
    assert decode_report(header) is Report.TIMED


def test_the_parent_cannot_build_an_op_with_a_missing_or_undeclared_field() -> None:
    with pytest.raises(FrameError) as missing:
        op_frame(Op.MEASURE)
    with pytest.raises(FrameError) as extra:
        op_frame(Op.GO, {"trial": 1})
    assert "has no 'reference_source'" in str(missing.value)
    assert "undeclared fields ['trial']" in str(extra.value)


def test_an_op_the_parent_built_is_read_back_by_the_worker() -> None:
    frame = _through_pipe(op_frame(Op.MEASURE, MeasureOp(reference_source="x = 1")))
    assert decode_op(frame) is Op.MEASURE
    with pytest.raises(FrameError, match="unknown op"):
        decode_op({"op": "exec"})


def test_compile_and_run_workers_enter_the_same_sandbox_but_only_runs_get_a_device_share(tmp_path: Path) -> None:
    cfg = RunnerConfig()
    iso = Isolation(prefix=(), network="skipped", pids="skipped", uid=None, gid=None, user="skipped")
    compile_box = sandbox_settings(cfg, iso, tmp_path, None, "compile", True)
    run_box = sandbox_settings(cfg, iso, tmp_path, None, "run", False)
    assert run_box.pop("mem_fraction") == cfg.device_memory_fraction
    assert "mem_fraction" not in compile_box
    assert compile_box == run_box
    assert run_box["cwd"] == str(tmp_path)
    assert run_box["data_bytes"] == cfg.host_memory_limit_bytes
