"""Profiling a correct candidate's kernels with Nsight Compute (opt-in: ``--profile-counters``).

``ncu`` launches a fresh interpreter that runs :mod:`gpu_runner.ncu_target` (reference inputs,
the candidate's ``ModelNew``, two warm-up forwards, then one forward between
``cudaProfilerStart``/``Stop``) and writes its metric table as CSV to a log file, which
:func:`actors.diagnosis.counters.parse_ncu_csv` reads.

Why this is safe enough to run on candidate code: the profiled program executes the candidate, so
the whole ``ncu`` process tree is started the way a fresh-interpreter worker is
(``python -m gpu_runner.confine.launch SPEC -- ncu ...``): the worker's namespaces (network, PID,
IPC, mount, user where granted), its filesystem view and Landlock domain, with the worker's
whitelisted environment (no keys or tokens), a private HOME/TMPDIR, its own session and a hard
timeout that kills the process group. Nothing it prints is trusted beyond the numbers parsed
from the CSV, which only steer the diagnosis (never a verdict or a speedup). Without a probed
isolation (``iso=None``) the same command runs unconfined: only for the CLI's best-effort mode,
and the caller says so in the result. Profiling needs access to the GPU's performance counters
(root, or ``NVreg_RestrictProfilingToAdminUsers=0``); when that is refused, ``ncu`` says
``ERR_NVGPUCTRPERM`` and :class:`ProfileFailed` carries it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from actors.diagnosis.counters import METRICS, CountersUnreadable, parse_ncu_csv
from gpu_runner.errors import RunnerError
from gpu_runner.isolation import Isolation, _spawn_spec
from gpu_runner.sandbox import worker_env
from schemas import HardwareCounters


class ProfileFailed(RunnerError):
    """The profiler did not produce counters; the message says why (its output's tail)."""


def ncu_path() -> str | None:
    """The ``ncu`` executable on PATH (or ``$KF_NCU``), if any."""
    return os.environ.get("KF_NCU") or shutil.which("ncu")


def ncu_version(ncu: str) -> str:
    """``ncu 2025.3.1`` (or just ``ncu`` when it does not say)."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "ncu"
    words = [w for line in out.splitlines() if "Version" in line for w in line.split()]
    return f"ncu {words[-1]}" if words else "ncu"


def ncu_command(ncu: str, log_file: Path, reference: Path, candidate: Path, python: str = sys.executable) -> list[str]:
    """The profiler's command line: the metrics of :mod:`actors.diagnosis.counters` over the
    kernels launched between the target's profiler start and stop, as CSV in base units."""
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--profile-from-start",
        "off",
        "--target-processes",
        "all",
        "--metrics",
        ",".join(METRICS),
        "--log-file",
        str(log_file),
        python,
        "-m",
        "gpu_runner.ncu_target",
        str(reference),
        str(candidate),
    ]


def profile_counters(
    reference_source: str,
    candidate_source: str,
    *,
    iso: Isolation | None,
    timeout_s: float = 300.0,
    ncu: str | None = None,
) -> HardwareCounters:
    """Profile one forward of the candidate; raises :class:`ProfileFailed` when no counters came."""
    exe = ncu or ncu_path()
    if exe is None:
        raise ProfileFailed("ncu is not on PATH (set KF_NCU to its path)")
    with tempfile.TemporaryDirectory(prefix="kf-ncu-") as tmp:
        home = Path(tmp)
        (home / "tmp").mkdir()
        reference, candidate, log_file = home / "reference.py", home / "candidate.py", home / "ncu.csv"
        reference.write_text(reference_source)
        candidate.write_text(candidate_source)
        command = ncu_command(exe, log_file, reference, candidate)
        if iso is not None and iso.layers is not None:
            spec = _spawn_spec(iso, home, home, [], "run")
            command = [sys.executable, "-m", "gpu_runner.confine.launch", json.dumps(spec), "--", *command]
        command = [*(iso.prefix if iso is not None else ()), *command]
        proc = subprocess.Popen(
            command,
            cwd=home,
            env=worker_env({}, home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise ProfileFailed(f"ncu did not finish in {timeout_s:g} s") from exc
        text = log_file.read_text() if log_file.exists() else ""
        if proc.returncode != 0 or not text:
            raise ProfileFailed(f"ncu exited {proc.returncode}: {(output or '')[-1500:]}{text[-500:]}")
        try:
            return parse_ncu_csv(text, tool=ncu_version(exe))
        except CountersUnreadable as exc:
            raise ProfileFailed(f"{exc}: {text[-1000:]}") from exc
