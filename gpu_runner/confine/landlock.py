"""Landlock: a whitelist of paths (read, execute, write, device ioctls), TCP off, signals scoped.

Applied by a worker to itself (and every thread it starts later: a Landlock domain covers only
the calling thread and its future children, which is why the worker's domain is made at spawn,
while it has one thread). Each access right the kernel's ABI knows is handled; everything not
named is refused, whoever the process runs as.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass

from gpu_runner.confine.syscalls import PR_SET_NO_NEW_PRIVS, check, prctl, syscall

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (
    16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
)  # fmt: skip
REFER, TRUNCATE, IOCTL_DEV = 8192, 16384, 32768
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
RULE_PATH_BENEATH = 1
CREATE_RULESET_VERSION = 1


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    rc = syscall("landlock_create_ruleset", None, 0, ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(rc, 0)


def handled_fs(version: int) -> int:
    """Every filesystem right the ABI ``version`` can restrict."""
    rights = (1 << 13) - 1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


@dataclass(frozen=True)
class Grants:
    """Paths and what may be done beneath them."""

    read: tuple[str, ...] = ()
    """Read files and list folders."""
    execute: tuple[str, ...] = ()
    """Read and execute (toolchains); a subset of what may be read is expected."""
    list_only: tuple[str, ...] = ()
    """Only list folders (e.g. a ``sys.path`` entry whose files stay closed)."""
    write: tuple[str, ...] = ()
    """Everything (private folders)."""
    devices: tuple[str, ...] = ()
    """Read, write and ioctl (GPU device files)."""
    write_files: tuple[str, ...] = ()
    """Write to existing files only (no create or remove): the worker's own
    ``/proc/self/task``, where the NVIDIA driver names its threads at ``cuInit`` (refused, CUDA
    fails with error 304). Resolved by the process that enters the domain, and held open for its
    life: Landlock rules bind to inodes, and a procfs inode is made anew if its dentry is dropped."""


_PINNED: list[int] = []
"""Descriptors of procfs folders named in rules, kept open so their dentries (and inodes) stay."""


def restrict(grants: Grants) -> dict[str, str]:
    """Enter a Landlock domain allowing only ``grants``; what was enforced, by name."""
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available")
    fs = handled_fs(version)
    attr = _Ruleset(fs, NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 else 0, 0)
    if version >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    size = 8 if version < 4 else 16 if version < 6 else 24
    ruleset = check(syscall("landlock_create_ruleset", ctypes.byref(attr), size, 0), "landlock_create_ruleset")
    read = READ_FILE | READ_DIR
    rules = [
        *((p, read) for p in grants.read),
        *((p, read | EXECUTE) for p in grants.execute),
        *((p, READ_DIR) for p in grants.list_only),
        *((p, fs) for p in grants.write),
        *((p, read | WRITE_FILE | IOCTL_DEV | TRUNCATE) for p in grants.devices),
        *((p, WRITE_FILE | TRUNCATE) for p in grants.write_files),
    ]
    added = 0
    try:
        for path, rights in rules:
            pin = path in grants.write_files and path.startswith("/proc/")
            try:  # a pinned folder stays open across the launcher's exec into the worker
                fd = os.open(path, os.O_PATH | (0 if pin else os.O_CLOEXEC))
            except OSError:
                continue  # absent here: nothing to allow
            try:
                allowed = rights & fs
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    allowed &= FILE_RIGHTS
                rule = _PathBeneath(allowed, fd)
                check(syscall("landlock_add_rule", ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0), f"rule {path}")
                added += 1
            finally:
                if pin:
                    _PINNED.append(fd)
                else:
                    os.close(fd)
        prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(no_new_privs)")
        check(syscall("landlock_restrict_self", ruleset, 0), "landlock_restrict_self")
    finally:
        with contextlib.suppress(OSError):
            os.close(ruleset)
    what = f"ABI {version}, {added} path rules"
    if version >= 4:
        what += ", TCP bind/connect refused"
    if version >= 6:
        what += ", signals and abstract sockets scoped"
    if grants.write_files:
        what += f", thread names writable ({', '.join(grants.write_files)})"
    return {"landlock": what}
