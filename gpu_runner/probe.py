"""What the machine and the task are: the GPU (without a CUDA context here), the worker's software
versions, and whether a reference is a KernelBench task at all."""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
from typing import Any

from gpu_runner.errors import InvalidReference
from schemas.task import missing_reference_names, parse_module


def detect_cuda(gpu: str | None = None) -> dict[str, Any] | None:
    """The compute capability and name of ``gpu`` (an index or ``GPU-`` UUID, as in
    ``RunnerConfig.gpu``), or of the first GPU, via ``nvidia-smi`` (no CUDA context here)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    select = ["-i", gpu] if gpu is not None else []
    try:
        out = subprocess.run(
            [exe, *select, "--query-gpu=compute_cap,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    if not line:
        return None
    cap, _, name = line.partition(",")
    major, _, minor = cap.strip().partition(".")
    return {"backend": "cuda", "arch": int(major) * 10 + int(minor or 0), "warp": 32, "name": name.strip()}


def validate_reference(source: str) -> None:
    """Refuse a reference that is not a KernelBench task (raises :class:`InvalidReference`)."""
    try:
        tree = parse_module(source)
    except SyntaxError as exc:
        raise InvalidReference(f"syntax error on line {exc.lineno}: {exc.msg}") from None
    missing = missing_reference_names(tree)
    if missing:
        raise InvalidReference(f"the reference does not define {', '.join(missing)}")


def versions(python: str) -> dict[str, str]:
    """Versions of torch, Triton and Python as the workers' interpreter sees them ("unknown" if it cannot say)."""
    code = (
        "import importlib.metadata as m, platform; "
        "print(m.version('torch'), m.version('triton'), platform.python_version())"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        words = out.stdout.split()
    except (OSError, subprocess.SubprocessError):
        words = []
    if len(words) != 3:
        words = ["unknown"] * 3
    return dict(zip(("torch", "triton", "python"), words, strict=True))


def cpu_name() -> str:
    """The host CPU's model name."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def describe_device(device: str, target: dict[str, Any] | None, software: dict[str, str]) -> dict[str, Any]:
    """Fields of :class:`schemas.DeviceInfo` known without a worker (for verdicts reached before any ran);
    a worker's own report, measured in its process, replaces it once one is ready."""
    name, capability = cpu_name(), None
    if device == "cuda" and target is not None:
        arch = int(target["arch"])
        name, capability = str(target["name"]), f"{arch // 10}.{arch % 10}"
    return {
        "kind": device,
        "name": name,
        "capability": capability,
        "torch": software["torch"],
        "triton": software["triton"] if software["triton"] != "unknown" else None,
        "cuda": None,
        "python": software["python"],
        "host": socket.gethostname(),
        "triton_interpreter": device == "cpu",
    }
