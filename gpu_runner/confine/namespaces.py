"""Entering a worker's namespaces at spawn: user, network, IPC, PID and mount.

:func:`enter` runs in a fresh single-threaded process (a fork server's child, or the launcher of a
fresh interpreter) and returns in the worker, which is PID 1 of its own PID namespace with a
private ``/proc``. A user namespace needs its id maps written from outside it, so the chain is:
the calling process (outside) forks a child that unshares every namespace at once, writes the
child's maps, and waits for it, mirroring its exit status; the child forks the worker (the first
process of the new PID namespace) and mirrors it. Every process of the chain dies with its parent
(``PR_SET_PDEATHSIG``) and lives in the caller's process group, so one ``killpg`` ends them all.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from typing import Any

from gpu_runner.confine.syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_PDEATHSIG,
    mount,
    prctl,
    unshare,
)


def _own_ranges(kind: str) -> list[tuple[int, int]]:
    """The id ranges valid in the caller's user namespace (``uid`` or ``gid``): (first, count)."""
    try:
        with open(f"/proc/self/{kind}_map") as fh:
            rows = [line.split() for line in fh if line.strip()]
    except OSError:
        return [(0, 1)]
    return [(int(r[0]), int(r[2])) for r in rows if len(r) == 3]


def maps_for(uid: int, gid: int, keep_uid: int | None = None, keep_gid: int | None = None) -> dict[str, str]:
    """Id maps: an ordinary user's ids become 0 inside (nothing else is mapped); root maps every id
    it has to itself, so files keep their owners inside (a toolchain owned by another uid, e.g.
    Triton's ``ptxas`` in an image built as another user, stays executable as it is outside; only
    mapped owners let root's capabilities apply). ``keep_uid``/``keep_gid``: the sandbox user, mapped
    to itself (it is inside root's ranges)."""
    if uid != 0:
        return {"uid_map": f"0 {uid} 1\n", "gid_map": f"0 {gid} 1\n", "setgroups": "deny"}
    uid_map = "".join(f"{first} {first} {count}\n" for first, count in _own_ranges("uid"))
    gid_map = "".join(f"{first} {first} {count}\n" for first, count in _own_ranges("gid"))
    del keep_uid, keep_gid  # inside root's own ranges already
    return {"uid_map": uid_map, "gid_map": gid_map, "setgroups": "allow"}


def mirror(pid: int) -> None:
    """Wait for ``pid`` and exit as it did (never returns)."""
    _close_fds_from(3)  # the evaluator sees the pipes close when the worker's do
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        os._exit(128 - code)
    os._exit(code)


def _close_fds_from(low: int) -> None:
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(low, 1 << 16)
        return
    for fd in fds:
        if fd >= low:
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_maps(pid: int, maps: dict[str, str]) -> None:
    with open(f"/proc/{pid}/uid_map", "w") as fh:
        fh.write(maps["uid_map"])
    with open(f"/proc/{pid}/setgroups", "w") as fh:
        fh.write(maps["setgroups"])
    with open(f"/proc/{pid}/gid_map", "w") as fh:
        fh.write(maps["gid_map"])


def enter(plan: dict[str, Any]) -> dict[str, str]:
    """Enter the namespaces ``plan`` asks for; returns (in the worker) what was done, by layer."""
    flags = (CLONE_NEWNET if plan.get("net") else 0) | (CLONE_NEWIPC if plan.get("ipc") else 0)
    flags |= (CLONE_NEWPID | CLONE_NEWNS if plan.get("pid") else 0) | (CLONE_NEWNS if plan.get("mount") else 0)
    done: dict[str, str] = {}
    if plan.get("user"):
        go_r, go_w = os.pipe()
        ok_r, ok_w = os.pipe()
        child = os.fork()
        if child:
            os.close(go_w)
            os.close(ok_r)
            ready = os.read(go_r, 1)
            try:
                if ready != b"1":
                    raise OSError("the namespace child failed before its maps were written")
                _write_maps(child, plan["maps"])
                os.write(ok_w, b"1")
            except OSError as exc:
                os.write(2, f"[sandbox] cannot map the user namespace: {exc}\n".encode())
                os.kill(child, signal.SIGKILL)
            mirror(child)
        os.close(go_r)
        os.close(ok_w)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(pdeathsig)")
        try:
            unshare(CLONE_NEWUSER | flags)
        except OSError:
            os.write(go_w, b"0")
            raise
        os.write(go_w, b"1")
        if os.read(ok_r, 1) != b"1":
            os._exit(1)
        os.close(go_w)
        os.close(ok_r)
        done["user_namespace"] = plan["maps"]["uid_map"].strip().replace("\n", "; ")
    elif flags:
        unshare(flags)
    if plan.get("pid"):
        inner = os.fork()
        if inner:
            mirror(inner)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(pdeathsig)")
    if flags & CLONE_NEWNS:
        mount("none", "/", None, MS_REC | MS_PRIVATE)
    if plan.get("pid"):
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        done["pid_namespace"] = "own PID namespace, private /proc"
    if plan.get("net"):
        done["network_namespace"] = "no network devices"
    if plan.get("ipc"):
        done["ipc_namespace"] = "own System V IPC and POSIX queues"
    if flags & CLONE_NEWNS:
        done["mount_namespace"] = "private mount tree"
    return done
