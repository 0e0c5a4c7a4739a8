"""Dropping privileges: every capability of the calling thread, its bounding and ambient sets."""

from __future__ import annotations

import contextlib
import ctypes

from gpu_runner.confine.syscalls import PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP, check, prctl, syscall

_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_all() -> None:
    """No capability left in any set (the bounding set first: dropping it needs CAP_SETPCAP)."""
    for cap in range(64):
        with contextlib.suppress(OSError):
            prctl(PR_CAPBSET_DROP, cap)
    with contextlib.suppress(OSError):
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _Header(_VERSION_3, 0)
    data = (_Data * 2)()
    check(syscall("capset", ctypes.byref(header), ctypes.byref(data)), "capset")


def effective() -> int:
    """The calling process's effective capability mask (from /proc)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0
