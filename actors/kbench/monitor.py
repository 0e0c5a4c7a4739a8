"""Peak memory of a process tree, sampled from outside it (it cannot under-report itself).

Host memory: the sum of the proportional set sizes of the root process and all its descendants
(``psutil``: a page shared by n processes counts 1/n in each), so the CUDA and torch libraries
every actor and worker maps count once; a process whose PSS cannot be read counts its RSS (an
upper bound for it). Summed RSS said 19-35 GiB for every evaluated level-1 dev problem on an H100,
small ones included (L1-2: 23 GiB beside 5.8 GiB of GPU memory).
GPU memory: the driver's per-process accounting (``nvidia-smi --query-compute-apps``) summed over
the tree's processes, and the rise of the used memory of the run's GPUs (all of them, unless
the run was given some: ``kfoundry bench --parallel``) over its level when sampling began
(``nvidia-smi --query-gpu=uuid,memory.used``), which also sees processes the driver reports
under another PID namespace. Either is ``None`` when it cannot be measured.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

from actors.runtime.logs import get_logger

log = get_logger(__name__)
_MIB = 2**20


@dataclass(frozen=True)
class Peaks:
    """The highest values seen."""

    host_bytes: int | None
    gpu_bytes: int | None
    gpu_device_bytes: int | None


def _descendants(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants (empty if ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_host_bytes(pid: int) -> int | None:
    """Summed PSS (RSS where PSS is unreadable) of ``pid`` and its descendants; ``None`` if ``pid`` is gone."""
    procs = _descendants(pid)
    if not procs:
        return None
    total = 0
    for proc in procs:
        try:
            total += int(getattr(proc.memory_full_info(), "pss", 0)) or proc.memory_info().rss
        except psutil.AccessDenied:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def tree_pids(pid: int) -> set[int]:
    """``pid`` and its descendants' pids (empty if ``pid`` is gone)."""
    return {p.pid for p in _descendants(pid)}


def _smi(query: list[str]) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, *query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_used_by_pid() -> dict[int, int] | None:
    """Bytes of GPU memory per process, from the driver; ``None`` without nvidia-smi."""
    rows = _smi(["--query-compute-apps=pid,used_memory"])
    if rows is None:
        return None
    used: dict[int, int] = {}
    for row in rows:
        with contextlib.suppress(ValueError, IndexError):
            used[int(row[0])] = used.get(int(row[0]), 0) + int(float(row[1]) * _MIB)
    return used


def gpu_used_total(uuids: frozenset[str] | None = None) -> int | None:
    """Bytes of memory in use over all GPUs, or over those of ``uuids``; ``None`` without nvidia-smi."""
    rows = _smi(["--query-gpu=uuid,memory.used"])
    if not rows:
        return None
    try:
        return sum(int(float(row[1]) * _MIB) for row in rows if uuids is None or row[0] in uuids)
    except (ValueError, IndexError):
        return None


SHARED = frozenset({"nats-server"})
"""Process names :func:`reap` leaves alone: the embedded NATS server is shared by every kfoundry
command of the machine (a run that starts it leaves it to the others and stops it only when no
client is left), so it is not the run's to kill."""


def reap(procs: list[psutil.Process], wait_s: float) -> list[str]:
    """Wait up to ``wait_s`` for ``procs`` to exit, then SIGKILL those still running but the
    :data:`SHARED` ones; the killed, each as ``"<pid> <command line>"``.

    A process identity is its pid and start time (``psutil`` checks both), so a reused pid is never
    signalled. Processes that left the run's process group (sandbox workers, the evaluator's janitor,
    the template expert's analysis child) end on their own when their parent goes: the wait gives
    them, the janitor above all, time to finish their clean-up."""
    deadline = time.monotonic() + wait_s
    alive = [p for p in _running(procs) if _name(p) not in SHARED]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = _running(alive)
    killed: list[psutil.Process] = []
    said: list[str] = []
    for proc in alive:
        try:
            line = " ".join(proc.cmdline()[:4])
        except psutil.Error:
            line = "?"
        try:
            proc.kill()
        except psutil.Error:
            continue  # it ended by itself in the meantime
        killed.append(proc)
        said.append(f"{proc.pid} {line}")
    deadline = time.monotonic() + 5.0
    while _running(killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    return said


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return ""


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (a zombie has ended: only its parent's wait is missing)."""
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


class TreeMonitor:
    """Samples a process tree's memory in a thread until stopped; ``peaks()`` says the maxima.

    It also remembers every process it has seen in the tree (``members()``), so what outlives the
    root, reparented away from it, can still be found and ended."""

    def __init__(
        self, pid: int, *, gpu: bool, interval_s: float = 1.0, gpu_uuids: frozenset[str] | None = None
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s!r}: must be positive")
        self.pid = pid
        self.gpu = gpu and shutil.which("nvidia-smi") is not None
        self.gpu_uuids = gpu_uuids
        """The GPUs the tree may use (``None``: all): the whole-GPU reading covers only these, so
        runs side by side on other GPUs do not count."""
        self.interval_s = interval_s
        self._host: int | None = None
        self._gpu: int | None = None
        self._device: int | None = None
        self._baseline = gpu_used_total(gpu_uuids) if self.gpu else None
        self._members: dict[tuple[int, float], psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tree-monitor-{pid}", daemon=True)

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # the boundary of the sampling thread: a failed sample is logged, the next one tried
                log.exception("memory sample failed", pid=self.pid)
            if self._stop.wait(self.interval_s):
                return

    def remember(self) -> None:
        """Add the tree's processes as they are now to ``members()``."""
        for proc in _descendants(self.pid):
            with contextlib.suppress(psutil.Error), self._lock:
                self._members.setdefault((proc.pid, proc.create_time()), proc)

    def members(self) -> list[psutil.Process]:
        """Every process seen in the tree so far (some may have exited)."""
        with self._lock:
            return list(self._members.values())

    def sample(self) -> None:
        """Take one sample now."""
        self.remember()
        host = tree_host_bytes(self.pid)
        if host is not None:
            self._host = max(self._host or 0, host)
        if not self.gpu:
            return
        per_pid = gpu_used_by_pid()
        pids = tree_pids(self.pid)
        if per_pid is not None and pids & per_pid.keys():
            self._gpu = max(self._gpu or 0, sum(per_pid[p] for p in pids & per_pid.keys()))
        total = gpu_used_total(self.gpu_uuids)
        if total is not None and self._baseline is not None:
            self._device = max(self._device or 0, total - self._baseline)

    def peaks(self) -> Peaks:
        """The maxima sampled so far."""
        return Peaks(host_bytes=self._host, gpu_bytes=self._gpu, gpu_device_bytes=self._device)
