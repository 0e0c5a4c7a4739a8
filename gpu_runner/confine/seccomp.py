"""A seccomp BPF filter built in Python: what a run or compile worker may not ask of the kernel.

Profiles (:class:`Profile`): ``run`` (a run worker about to run a candidate: no sockets but the
Unix ones, which fail; no new processes, no ``execve``), ``run_exec`` (the same, but a Triton
just-in-time compile may start ``ptxas``, and the C compiler that builds its launcher, which
starts ``cc1``, ``as`` and ``ld`` with ``vfork``), ``compile`` (compilers may run; no network sockets).
Every profile refuses debugging other processes, namespace and mount changes, the keyring, BPF,
``io_uring`` (whose operations bypass the filter), handles to files by number, kernel modules.
Calls only hostile code makes kill the process (the verdict: a runtime error naming SIGSYS); those
honest code may try and survive (``fork``, ``execve``, Unix sockets) fail with ``EPERM``/``EACCES``.
Installed with ``SECCOMP_FILTER_FLAG_TSYNC``, so every thread of the worker is covered. x86_64 only.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import struct

from gpu_runner.confine.syscalls import ARCH, CLONE_THREAD, PR_SET_NO_NEW_PRIVS, check, prctl, syscall

AUDIT_ARCH_X86_64 = 0xC000003E
RET_KILL_PROCESS, RET_ALLOW = 0x80000000, 0x7FFF0000
RET_ERRNO = 0x00050000
LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16
SET_MODE_FILTER, FLAG_TSYNC = 1, 1
AF_UNIX = 1
NS_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

# x86_64 numbers.
KILLED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "iopl": 172, "ioperm": 173,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "syslog": 103, "userfaultfd": 323,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "sethostname": 170, "setdomainname": 171,
}  # fmt: skip
"""Calls no honest kernel, compiler or framework makes in a worker: the process dies."""
NO_EXEC = {"execve": 59, "execveat": 322, "fork": 57, "vfork": 58}
SOCKET, SOCKETPAIR, CLONE, CLONE3 = 41, 53, 56, 435
PERF_EVENT_OPEN = 298


class Profile(enum.StrEnum):
    """What a worker may still do once filtered."""

    RUN = "run"
    RUN_EXEC = "run_exec"
    COMPILE = "compile"


def supported() -> str | None:
    """Why the filter cannot be built here (None: it can)."""
    if ARCH != "x86_64":
        return f"the filter's system-call table covers x86_64 only (this is {ARCH})"
    return None


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _errno(err: int) -> int:
    return RET_ERRNO | (err & 0xFFFF)


def build(profile: Profile) -> bytes:
    """The BPF program (``struct sock_filter`` array) of ``profile``."""
    prog: list[bytes] = [_ins(LD_W_ABS, OFF_ARCH), _ins(JEQ_K, AUDIT_ARCH_X86_64, 1, 0), _ins(RET_K, RET_KILL_PROCESS)]
    prog.append(_ins(LD_W_ABS, OFF_NR))
    prog += [_ins(JGE_K, 0x40000000, 0, 1), _ins(RET_K, RET_KILL_PROCESS)]  # the x32 ABI
    for nr in KILLED.values():
        prog += [_ins(JEQ_K, nr, 0, 1), _ins(RET_K, RET_KILL_PROCESS)]
    prog += [_ins(JEQ_K, PERF_EVENT_OPEN, 0, 1), _ins(RET_K, _errno(errno.EACCES))]
    prog += [_ins(JEQ_K, CLONE3, 0, 1), _ins(RET_K, _errno(errno.ENOSYS))]  # libc falls back to clone
    if profile is Profile.RUN:  # run_exec allows new processes (clone, fork, vfork) and execve
        for nr in NO_EXEC.values():
            prog += [_ins(JEQ_K, nr, 0, 1), _ins(RET_K, _errno(errno.EPERM))]
    # socket(domain, ...): Unix sockets fail (run) or pass (compile); every other family kills.
    prog += [_ins(JEQ_K, SOCKET, 0, 4), _ins(LD_W_ABS, OFF_ARG0), _ins(JEQ_K, AF_UNIX, 1, 0)]
    prog += [_ins(RET_K, RET_KILL_PROCESS)]
    prog += [_ins(RET_K, RET_ALLOW if profile is Profile.COMPILE else _errno(errno.EACCES))]
    if profile is not Profile.COMPILE:
        prog += [_ins(JEQ_K, SOCKETPAIR, 0, 1), _ins(RET_K, _errno(errno.EACCES))]
    # clone(flags, ...): namespaces kill; a new process (not a thread) fails in run profiles.
    tail = [_ins(LD_W_ABS, OFF_ARG0), _ins(JSET_K, NS_FLAGS, 0, 1), _ins(RET_K, RET_KILL_PROCESS)]
    if profile is Profile.RUN:
        tail += [_ins(JSET_K, CLONE_THREAD, 1, 0), _ins(RET_K, _errno(errno.EPERM))]
    tail.append(_ins(RET_K, RET_ALLOW))
    prog += [_ins(JEQ_K, CLONE, 0, len(tail)), *tail]
    prog.append(_ins(RET_K, RET_ALLOW))
    return b"".join(prog)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(profile: Profile) -> dict[str, str]:
    """Filter every thread of this process with ``profile`` (irreversible)."""
    why = supported()
    if why is not None:
        raise OSError(why)
    code = build(profile)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(no_new_privs)")
    rc = check(syscall("seccomp", SET_MODE_FILTER, FLAG_TSYNC, ctypes.byref(prog)), "seccomp")
    if rc != 0:
        raise OSError(f"seccomp: thread {rc} could not be synchronised")
    return {"seccomp": f"{profile.value} profile, {len(code) // 8} instructions, all threads"}
