"""Nothing of an evaluator outlives it, however it ends: a watcher process and a sweep at start.

Workers run in sessions of their own (so their groups can be killed), and their large tensors
lie in tmpfs files (``/dev/shm``); a SIGKILLed evaluator would leave both behind (seen on an H200:
90 GB of "shared" memory held by files of killed runs). So each evaluation service starts
``python -m gpu_runner.janitor`` in a session of its own, holding the read end of a pipe whose
write end only the service has. When the pipe closes (the service ended, by ``aclose`` or by any
signal, SIGKILL included: the kernel closes its descriptors), the janitor kills every process
whose environment points into the service's folders and removes those folders, then exits.

At start, :func:`sweep_stale` removes the folders of services whose owner process is gone
(each folder carries an ``owner`` file with the pid and the process's start time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

OWNER = "owner"
"""File in each service folder: ``<pid> <start time in clock ticks>`` of the service's process."""


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[19]  # field 22 of stat: starttime
    except (OSError, IndexError):
        return None


def mark_owner(folder: Path) -> None:
    """Record this process as ``folder``'s owner."""
    pid = os.getpid()
    (folder / OWNER).write_text(f"{pid} {_start_time(pid) or '?'}\n")


def _owner_alive(folder: Path) -> bool:
    try:
        pid_s, start = (folder / OWNER).read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return True  # not ours to judge: no owner file
    now = _start_time(pid)
    return now is not None and (start == "?" or now == start)


def sweep_stale(roots: list[Path], prefix: str = "kf-") -> list[Path]:
    """Remove folders under ``roots`` named ``prefix*`` whose owner process is gone; the removed."""
    removed: list[Path] = []
    for root in roots:
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for folder in entries:
            if not folder.name.startswith(prefix) or not folder.is_dir() or folder.is_symlink():
                continue
            if (folder / OWNER).exists() and not _owner_alive(folder):
                kill_processes_using([str(folder)])
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def kill_processes_using(paths: list[str]) -> int:
    """SIGKILL every process (of those this user may signal) whose environment names one of ``paths``."""
    needles = [p.encode() for p in paths if p]
    me = os.getpid()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if any(n in env for n in needles):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


class Janitor:
    """The service's handle on its watcher process."""

    def __init__(self, folders: list[Path], python: str = sys.executable) -> None:
        read_fd, self._write_fd = os.pipe()
        os.set_inheritable(read_fd, True)
        cmd = [python, "-m", "gpu_runner.janitor", "--fd", str(read_fd), *(str(f) for f in folders)]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "HOME")}
        self.proc = subprocess.Popen(
            cmd, pass_fds=(read_fd,), start_new_session=True, stdin=subprocess.DEVNULL, env=env
        )
        os.close(read_fd)

    def close(self) -> None:
        """The service is done: the janitor sweeps what is left and exits."""
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def _watch(fd: int, folders: list[str]) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
    # The owner is gone (or done): its workers and files go too. Twice, for workers that a
    # dying fork server forked in the meantime.
    for _ in range(2):
        kill_processes_using(folders)
        time.sleep(0.2)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_runner.janitor")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the user's terminal is the service's to handle
    _watch(args.fd, args.folders)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
