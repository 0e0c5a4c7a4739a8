"""One evaluator per GPU: a machine-wide claim on a GPU, held with ``flock`` while it evaluates.

Two evaluators timing candidates on one GPU at once would disturb each other's timings, so an
evaluator claims its GPU (by UUID, so every numbering of the GPUs agrees) before it starts: an
exclusive ``flock`` on ``<lock dir>/<uuid>.lock``, where the lock dir is ``$KFOUNDRY_GPU_LOCK_DIR``
or ``/dev/shm/kfoundry-gpu-locks`` (the temporary directory where there is no ``/dev/shm``). The
kernel drops the lock when the process ends, however it ends, so a killed evaluator never leaves
a GPU claimed. A second claim on a held GPU fails at once with a one-line error naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from actors.runtime.errors import ConfigError
from actors.runtime.gpus import Gpu


class GpuTaken(ConfigError):
    """Another evaluator holds the GPU."""


def default_lock_dir() -> Path:
    """``$KFOUNDRY_GPU_LOCK_DIR``, else ``/dev/shm/kfoundry-gpu-locks`` (or under the temporary directory)."""
    chosen = os.environ.get("KFOUNDRY_GPU_LOCK_DIR")
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / "kfoundry-gpu-locks"


class GpuClaim:
    """An exclusive claim on one GPU (see the module docstring); ``release`` or process exit ends it."""

    def __init__(self, gpu: Gpu, fd: int, path: Path) -> None:
        self.gpu = gpu
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the GPU back (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> GpuClaim:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another evaluator"
    if not isinstance(info, dict):
        return "another evaluator"
    who = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
    return f"{who}, run {info['run']}" if info.get("run") else who


def claim_gpu(gpu: Gpu, *, run_id: str = "", lock_dir: Path | None = None) -> GpuClaim:
    """Claim ``gpu`` for this process, or raise :class:`GpuTaken` naming who holds it."""
    folder = lock_dir if lock_dir is not None else default_lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # shared by every user of the machine, like /tmp
        os.chmod(folder, 0o1777)
    path = folder / f"{gpu.uuid}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise GpuTaken(
            f"{gpu.label()} is already used by {_holder(path)}: two evaluators on one GPU disturb each other's "
            "timings; pick another GPU (--gpu/--gpus) or stop that evaluator"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    record = {"pid": os.getpid(), "host": socket.gethostname(), "run": run_id, "gpu": gpu.index, "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return GpuClaim(gpu, fd, path)
