"""The confinement layers themselves, each tried in a forked child: seccomp, Landlock, namespaces."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_runner.confine import landlock, seccomp
from gpu_runner.confine.namespaces import enter, maps_for
from gpu_runner.confine.policy import PROJECT_ROOT
from gpu_runner.confine.probe import _in_child

pytestmark = pytest.mark.timeout(60)
LIBC = ctypes.CDLL(None, use_errno=True)
AS_USER = Path(__file__).parent / "as_user.sh"


def _exit_of(fn: Callable[[], object]) -> int:
    """The exit status (negative: the signal) of a forked child running ``fn``."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child's exit status is the answer
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


needs_seccomp = pytest.mark.skipif(seccomp.supported() is not None, reason=str(seccomp.supported()))
needs_landlock = pytest.mark.skipif(landlock.abi() < 1, reason="Landlock is not enabled in this kernel")


@needs_seccomp
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: LIBC.syscall(41, socket.AF_INET, socket.SOCK_STREAM, 0), -signal.SIGSYS),
        (lambda: LIBC.syscall(101, 16, os.getppid(), 0, 0), -signal.SIGSYS),  # ptrace(ATTACH, parent)
        (lambda: LIBC.syscall(310, os.getppid(), 0, 0, 0, 0, 0), -signal.SIGSYS),  # process_vm_readv
        (lambda: LIBC.syscall(272, 0x10000000), -signal.SIGSYS),  # unshare(CLONE_NEWUSER)
        (lambda: LIBC.syscall(250, 0, 0), -signal.SIGSYS),  # keyctl
    ],
    ids=["tcp_socket", "ptrace", "process_vm_readv", "unshare", "keyctl"],
)
def test_run_profile_kills_hostile_system_calls(call: Callable[[], int], expected: int) -> None:
    def attempt() -> None:
        seccomp.install(seccomp.Profile.RUN)
        call()

    assert _exit_of(attempt) == expected


@needs_seccomp
def test_run_profile_refuses_processes_and_unix_sockets_but_allows_threads() -> None:
    def attempt() -> None:
        seccomp.install(seccomp.Profile.RUN)
        seen = []
        t = threading.Thread(target=lambda: seen.append(1))
        t.start()
        t.join()
        assert seen == [1]
        for fn, err in (
            (os.fork, errno.EPERM),
            (lambda: socket.socket(socket.AF_UNIX), errno.EACCES),
            (lambda: os.execv("/bin/true", ["true"]), errno.EPERM),
        ):
            try:
                fn()
            except OSError as exc:
                if exc.errno != err:
                    os._exit(5)
            else:
                os._exit(4)

    assert _exit_of(attempt) == 0


@needs_seccomp
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here")
def test_run_exec_profile_lets_a_triton_launcher_build_run_the_c_compiler(tmp_path: Path) -> None:
    # A candidate whose forward the compile stage cannot run ahead of time (it opens a CUDA
    # stream, say) has its kernels' host launchers built by Triton in the run worker: gcc, which
    # starts cc1 with vfork. Refused vfork, every such candidate was a runtime error on the GPU
    # (`cannot execute ... cc1: vfork: Operation not permitted`, side_stream_quiet on 4x H200).
    (tmp_path / "launcher.c").write_text("int add_one(int x) { return x + 1; }\n")
    out = tmp_path / "launcher.so"

    def attempt() -> None:
        seccomp.install(seccomp.Profile.RUN_EXEC)
        cmd = ["gcc", str(tmp_path / "launcher.c"), "-O3", "-shared", "-fPIC", "-o", str(out)]
        if subprocess.run(cmd, check=False, capture_output=True).returncode != 0:
            os._exit(4)
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # still a run profile: the network kills

    assert _exit_of(attempt) == -signal.SIGSYS
    assert out.stat().st_size > 0


@needs_seccomp
def test_compile_profile_runs_compilers_but_kills_network_sockets() -> None:
    def attempt() -> None:
        seccomp.install(seccomp.Profile.COMPILE)
        assert subprocess.run(["/bin/true"], check=False).returncode == 0
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)

    assert _exit_of(attempt) == -signal.SIGSYS


@needs_landlock
def test_landlock_leaves_only_granted_paths(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("key")
    own = tmp_path / "own"
    own.mkdir()

    def attempt() -> None:
        landlock.restrict(landlock.Grants(read=("/usr", "/proc"), write=(str(own),)))
        (own / "out.txt").write_text("mine")
        for fn in (secret.read_text, lambda: (tmp_path / "new.txt").write_text("x")):
            try:
                fn()
            except PermissionError:
                continue
            os._exit(4)

    assert _exit_of(attempt) == 0
    assert (own / "out.txt").read_text() == "mine"
    assert not (tmp_path / "new.txt").exists()


def test_namespaces_hide_every_outside_process_and_the_network() -> None:
    plan = {
        "user": True,
        "maps": maps_for(os.getuid(), os.getgid()),
        "net": True,
        "ipc": True,
        "pid": True,
        "mount": True,
    }

    def attempt() -> None:
        enter(plan)
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        assert pids == ["1"], pids
        with open("/proc/net/dev") as fh:
            assert [line.split(":")[0].strip() for line in fh if ":" in line] == ["lo"]
        try:
            socket.create_connection(("127.0.0.1", 22), timeout=1)
        except OSError:
            return
        raise AssertionError("connected out of the network namespace")

    result = _in_child(attempt)
    if "Operation not permitted" in result and os.getuid() != 0:
        pytest.skip(f"user namespaces are not permitted here: {result}")
    assert result == "ok"


@pytest.mark.skipif(os.getuid() != 0, reason="creating an unprivileged user needs root")
def test_every_layer_holds_for_an_unprivileged_user() -> None:
    """The probe, run as an ordinary user (``nobody``), finds every layer."""
    done = subprocess.run(
        ["sh", str(AS_USER), sys.executable, "-m", "gpu_runner.confine.probe"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KF_TEST_EXPOSE": ":".join(sorted({sys.prefix, sys.base_prefix, str(PROJECT_ROOT)}))},
    )
    assert done.returncode == 0, done.stderr
    import json

    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["uid"] != 0
    assert found["userns"] == "ok"
    assert found["landlock"] == "ok" or landlock.abi() < 1
    assert found["seccomp"] == "ok" or seccomp.supported() is not None


@pytest.mark.slow  # ~10 s: workers started fresh, not forked
@pytest.mark.timeout(300)
async def test_workers_started_without_a_fork_server_enter_the_same_layers(tmp_path: Path) -> None:
    """The launcher of fresh interpreters confines them as the fork server does its children."""
    from gpu_runner.service import EvaluationService
    from schemas import CheckOutcome, DeviceChoice, EvalStatus
    from tests.gpu_runner.conftest import fast_config, job, reference

    service = EvaluationService(fast_config(DeviceChoice.CPU, tmp_path, spares=1, fork_server=False))
    await service.start()
    try:
        await service.prepare(reference("add_relu"))
        result = await service.evaluate(job("add_relu", "honest_add_relu"))
    finally:
        await service.aclose()
    assert result.status is EvalStatus.CORRECT, result.summary
    limits = next(c for c in result.checks if c.name == "sandbox_limits")
    assert limits.outcome is CheckOutcome.PASSED
    held = limits.detail or ""
    if seccomp.supported() is None:
        assert "seccomp=run profile" in held
    if landlock.abi() >= 1:
        assert "landlock_candidate=ABI" in held
    assert "pid_namespace=own PID namespace" in held


def _name_threads() -> None:
    """What the NVIDIA driver does at ``cuInit``: name its threads through ``/proc/self/task``,
    including a thread started later; other writable ``/proc`` files stay refused."""
    errors: list[BaseException] = []

    def name(tid: int) -> None:
        try:
            with open(f"/proc/self/task/{tid}/comm", "w") as fh:
                fh.write("kf-named")
        except OSError as exc:
            errors.append(exc)

    name(threading.get_native_id())
    later = threading.Thread(target=lambda: name(threading.get_native_id()))
    later.start()
    later.join()
    if errors:
        raise errors[0]
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as fh:
        assert fh.read().strip() == "kf-named"
    for path in ("/proc/self/comm", "/proc/self/oom_score_adj"):
        try:
            with open(path, "w") as fh:
                fh.write("500\n" if path.endswith("adj") else "outside")
        except OSError:
            continue
        raise AssertionError(f"{path} was writable")


@needs_landlock
def test_landlock_lets_a_worker_name_its_threads_and_nothing_else_in_proc() -> None:
    grants = landlock.Grants(read=("/usr", "/proc"), write_files=("/proc/self/task",))

    def named(g: landlock.Grants) -> Callable[[], None]:
        def run() -> None:
            landlock.restrict(g)
            _name_threads()

        return run

    assert _in_child(named(grants)) == "ok"
    refused = _in_child(named(landlock.Grants(read=("/usr", "/proc"))))
    assert refused.startswith("PermissionError"), refused


def test_read_only_view_lets_a_worker_name_its_threads_and_nothing_else_in_proc(tmp_path: Path) -> None:
    from gpu_runner.confine import fsview

    plan = {"user": True, "maps": maps_for(os.getuid(), os.getgid()), "pid": True, "mount": True}

    def attempt(write_files: tuple[str, ...]) -> Callable[[], None]:
        def run() -> None:
            enter(plan)
            fsview.apply(fsview.View(hide=("/tmp",), expose=(), writable=(str(tmp_path),), write_files=write_files))
            _name_threads()

        return run

    result = _in_child(attempt(("/proc/self/task",)))
    if "Operation not permitted" in result and os.getuid() != 0:
        pytest.skip(f"user namespaces are not permitted here: {result}")
    assert result == "ok"
    refused = _in_child(attempt(()))
    assert refused.startswith("OSError"), refused
    assert "Read-only file system" in refused, refused


@pytest.mark.skipif(os.getuid() != 0, reason="files owned by another user need root to make")
def test_root_user_namespace_keeps_file_owners_so_owner_only_tools_still_run(tmp_path: Path) -> None:
    """A toolchain binary owned by another uid with only its owner's execute bit (how ptxas can be
    installed in an image) runs for root outside; inside root's user namespace it must too."""
    os.chmod(tmp_path, 0o755)
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    os.chown(tool, 4321, 4321)
    os.chmod(tool, 0o744)
    plan = {"user": True, "maps": maps_for(0, 0), "pid": True, "mount": True}

    def attempt() -> None:
        enter(plan)
        done = subprocess.run([str(tool)], capture_output=True, text=True, timeout=10, check=False)
        assert done.stdout == "ran\n", done

    assert _in_child(attempt) == "ok"
    narrow = {**plan, "maps": {"uid_map": "0 0 1\n", "gid_map": "0 0 1\n", "setgroups": "allow"}}
    refused = _in_child(lambda: (enter(narrow), subprocess.run([str(tool)], check=True, timeout=10)))
    assert refused.startswith("PermissionError"), refused
