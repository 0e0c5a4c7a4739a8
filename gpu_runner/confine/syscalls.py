"""The raw system calls the confinement layers need (ctypes over libc; Python 3.11 has no os.unshare)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_CHILD_SUBREAPER = 36

AT_FDCWD = -100
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4

ARCH = platform.machine()
# Numbers of the calls libc has no wrapper for (x86_64 and aarch64 share these new ones).
NR = {
    "open_tree": 428,
    "move_mount": 429,
    "mount_setattr": 442,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
    "seccomp": 317 if ARCH == "x86_64" else 277,
    "capset": 126 if ARCH == "x86_64" else 91,
}


class ConfineError(OSError):
    """A confinement step the kernel refused (errno and the step's name)."""


_LIBC: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library, with errno kept."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
    return _LIBC


def check(rc: int, what: str) -> int:
    """``rc`` unless it is -1, in which case raise with errno."""
    if rc < 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"{what}: {os.strerror(err)}")
    return rc


def syscall(name: str, *args: object) -> int:
    """Call a system call by name from :data:`NR`."""
    return int(libc().syscall(ctypes.c_long(NR[name]), *args))


def unshare(flags: int) -> None:
    check(libc().unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def prctl(option: int, arg2: int = 0, what: str = "prctl") -> None:
    check(libc().prctl(option, ctypes.c_ulong(arg2), 0, 0, 0), what)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    check(libc().mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount({target})")


def open_tree(path: str) -> int:
    """A detached recursive copy of the mount tree at ``path`` (a file descriptor)."""
    flags = OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC
    return check(syscall("open_tree", AT_FDCWD, path.encode(), ctypes.c_uint(flags)), f"open_tree({path})")


def move_mount(fd: int, target: str) -> None:
    """Attach the detached tree ``fd`` at ``target``."""
    rc = syscall("move_mount", fd, b"", AT_FDCWD, target.encode(), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))
    check(rc, f"move_mount({target})")


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def mount_setattr(path: str, set_: int, clear: int, dirfd: int = AT_FDCWD, empty: bool = False) -> None:
    """Set and clear mount attributes on the tree at ``path`` (recursively)."""
    attr = MountAttr(set_, clear, 0, 0)
    flags = AT_RECURSIVE | (0x1000 if empty else 0)  # AT_EMPTY_PATH
    rc = syscall("mount_setattr", dirfd, path.encode(), ctypes.c_uint(flags), ctypes.byref(attr), ctypes.sizeof(attr))
    check(rc, f"mount_setattr({path or dirfd})")
