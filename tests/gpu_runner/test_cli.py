"""``python -m gpu_runner`` as a user runs it: one JSON object, exit codes, a timeout that holds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_runner.cli import main
from tests.gpu_runner.conftest import CANDIDATES, REFERENCES


def run_cli(*args: str, timeout: float = 110.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_runner", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_cli_json_prints_exactly_one_result_object() -> None:
    done = run_cli(str(REFERENCES / "add_relu.py"), str(CANDIDATES / "honest_add_relu.py"), "--device", "cpu",
                   "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["type"] == "eval_result"
    assert result["status"] == "correct"
    assert result["device"]["kind"] == "cpu"
    assert result["device"]["triton_interpreter"] is True
    assert result["timing"]["timer"] == "perf_counter"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_precision_flag_sets_the_standard_and_the_result_records_it() -> None:
    """``--precision exact`` holds a candidate to the IEEE float32 reference although the reference
    asks for TF32; by default (precision parity) the same candidate is correct."""
    ref, cand = str(REFERENCES / "matmul_tf32_flag.py"), str(CANDIDATES / "rounded_tf32_matmul.py")
    for flag, status, precision in (("reference", "correct", "reference"), ("exact", "incorrect", "exact")):
        done = run_cli(ref, cand, "--device", "cpu", "--json", "--precision", flag, timeout=200)
        result = json.loads(done.stdout)
        assert result["status"] == status, result["summary"]
        assert result["correctness"]["precision"] == precision


@pytest.mark.slow  # ~9 s: waits out a candidate's time limit
def test_cli_timeout_is_the_candidates_own_time() -> None:
    """An infinite loop is stopped about ``--timeout`` seconds into its own run, whatever the
    evaluator's start-up cost before it."""
    started = time.perf_counter()
    done = run_cli(str(REFERENCES / "add_relu.py"), str(CANDIDATES / "infinite_loop.py"), "--device", "cpu",
                   "--timeout", "4", "--json")  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "timeout"
    assert 3.5 < result["stages"]["total_s"] < 4 + 3
    assert elapsed < 4 + 60  # the evaluator's start-up on 2 busy cores, bounded


@pytest.mark.slow  # ~8 s on a 2-core host; the default run keeps the --json run of the same candidate above
def test_cli_start_up_does_not_count_against_an_honest_candidate() -> None:
    """A timeout shorter than the evaluator's cold start still leaves the candidate its own time."""
    started = time.perf_counter()
    done = run_cli(str(REFERENCES / "add_relu.py"), str(CANDIDATES / "honest_add_relu.py"), "--device", "cpu",
                   "--timeout", "6", "--json")  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "correct", result["summary"]
    assert elapsed > 6  # the cold start alone took longer than the timeout


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it with the slow tests
def test_cli_timeout_holds_after_the_trials() -> None:
    """A candidate that passes its trials and hangs once timed: the window after the upgrade to the
    exclusive lease is bounded too."""
    started = time.perf_counter()
    done = run_cli(str(REFERENCES / "add_relu.py"), str(CANDIDATES / "hang_in_timing.py"), "--device", "cpu",
                   "--timeout", "8", "--json")  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "timeout"
    assert result["correctness"]["passed_trials"] == 5  # it hung in the timing, not in the trials
    assert result["stages"]["total_s"] < 8 + 3
    assert elapsed < 8 + 60


def test_cli_readable_summary_names_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(REFERENCES / "add_relu.py"), str(CANDIDATES / "torch_op_instead.py"), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("REJECTED:")
    assert "KF012-torch-compute" in out


def test_cli_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(tmp_path / "nope.py"), str(CANDIDATES / "honest_add_relu.py")])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_directory_as_a_task_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(tmp_path), str(CANDIDATES / "honest_add_relu.py")])
    assert code == 2
    assert f"{tmp_path} is a directory, not a task file" in capsys.readouterr().err


def test_cli_invalid_reference_is_a_bad_task_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ref.py"
    bad.write_text("import torch\nclass Model: pass\n")
    code = main([str(bad), str(CANDIDATES / "honest_add_relu.py"), "--device", "cpu"])
    assert code == 2  # the task's fault, as `kfoundry run` reports it (README, exit statuses)
    err = capsys.readouterr().err
    assert "the task does not work" in err, err
    assert "get_inputs" in err, err


def test_cli_task_declaring_dynamic_dims_wrongly_is_a_bad_task_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (REFERENCES / "softmax_sized.py").read_text() + "\nDYNAMIC_DIMS = {0: (8, 2)}\n"
    bad = tmp_path / "ref.py"
    bad.write_text(source)
    code = main([str(bad), str(CANDIDATES / "softmax_any_shape.py"), "--device", "cpu"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "kfoundry eval: error: the task does not work: DYNAMIC_DIMS[0] must have 1 <= low <= high, got (8, 2)"
    ], err


def test_cli_cuda_without_a_gpu_is_a_bad_option_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    code = main([str(REFERENCES / "add_relu.py"), str(CANDIDATES / "honest_add_relu.py"), "--device", "cuda"])
    assert code == 2  # as `kfoundry run --device cuda` says it (README, exit statuses)
    assert "not available" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_cli_task_too_large_for_this_machine_is_status_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = tmp_path / "huge.py"
    huge.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n\n\ndef get_inputs():\n    return [torch.randn(1 << 20, 1 << 20)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    code = main([str(huge), str(CANDIDATES / "honest_add_relu.py"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 3, err  # as `kfoundry run` refuses it (README, exit statuses)
    assert "for one evaluation; this host has" in err, err
