"""What a process forked by the fork server sees (run by tests/gpu_runner/test_forkserver.py)."""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    action = argv[0]
    if action == "describe":
        facts = {
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "pgid": os.getpgid(0),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "net_ns": os.readlink("/proc/self/ns/net"),
            "pid_ns": os.readlink("/proc/self/ns/pid"),
            "visible_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            # (listdir's own descriptor is closed by the time its entry is checked)
            "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")),
            "nice": os.nice(0),
            "torch_loaded": "torch" in sys.modules,
        }
        os.write(4, json.dumps(facts).encode())
        sys.stdout.write("described\n")
        sys.stdout.flush()
        return 0
    if action == "exit":
        return int(argv[1])
    if action == "segfault":
        import ctypes

        ctypes.string_at(0)  # a real fault (PID 1 of a namespace ignores a signal it sends itself)
        return 0
    if action == "escape":
        # A grandchild in a session of its own (out of the worker's process group), left behind.
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 64)  # so the parent's reads end: only the kill can end this one
                time.sleep(60)
                os._exit(0)
            os._exit(0)
        os.wait()
        os.write(4, b"escaped")
        return 0  # the worker ends; its escapee is re-parented to a subreaper
    return 2
