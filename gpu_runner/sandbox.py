"""Starting, talking to and killing sandboxed worker processes (parent side).

A worker starts in its own session (so its whole process group can be killed), confined by the
layers the kernel grants (:mod:`gpu_runner.confine`: its own user, network, IPC, PID and mount
namespaces and a Landlock domain from the start; a filesystem view, a narrower Landlock domain
and a seccomp filter before a candidate runs), with a whitelisted environment (no keys or
tokens), its own cwd, HOME and TMPDIR, and two pipes: jobs in, frames out. Its stdout and stderr
go to a log file the parent reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from gpu_runner.errors import WorkerStartError
from gpu_runner.forkserver import SHARE_FD, WORKER_FDS, ForkedProcess, ForkServer, proc_children
from gpu_runner.frames import OpFrame, Report, decode_report
from gpu_runner.isolation import (  # re-exported: the pools and the service import them from here
    PROJECT_ROOT,
    _spawn_spec,
)
from gpu_runner.isolation import Isolation as Isolation
from gpu_runner.isolation import confinement as confinement
from gpu_runner.isolation import isolation_refusal as isolation_refusal
from gpu_runner.isolation import jit_exec as jit_exec
from gpu_runner.isolation import probe_isolation as probe_isolation
from gpu_runner.isolation import unreachable_by_others as unreachable_by_others
from gpu_runner.isolation import without_user as without_user
from gpu_runner.protocol import MAX_SHARED_OUTPUTS, Blob, FrameError, encode_frame, read_bulk, read_frame, widen_pipe
from gpu_runner.triton_cache import copy_tree

logger = structlog.get_logger(__name__)

PASS_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CC",
    "CXX",
    "TRITON_PTXAS_PATH",
)
"""The only variables of the evaluator's environment a worker inherits."""
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def worker_env(extra: dict[str, str], home: Path) -> dict[str, str]:
    """A whitelisted environment: nothing from the evaluator but paths and device selection."""
    env = {k: v for k, v in os.environ.items() if k in PASS_ENV and not SECRET_NAME.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    py_path = [str(PROJECT_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "PYTHONPATH": os.pathsep.join(py_path),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "TRITON_DEFAULT_FP_FUSION": "1",
            "KF_WORKER_TOKEN": secrets.token_hex(8),
        }
    )
    env.update(extra)
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k) or k == "KF_WORKER_TOKEN"}


def make_private_dir(base: Path, name: str, uid: int | None, gid: int | None) -> Path:
    """A fresh directory (with ``tmp/``) owned by the sandbox user."""
    path = base / name
    (path / "tmp").mkdir(parents=True)
    if uid is not None and gid is not None:
        for p in (path, path / "tmp"):
            os.chown(p, uid, gid)
    return path


SHM = Path("/dev/shm")


def bulk_root(base: Path) -> Path:
    """Where the workers of the service at ``base`` leave large tensors: tmpfs when there is one."""
    if SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK):
        return SHM / f"kf-{hashlib.sha256(str(base.resolve()).encode()).hexdigest()[:16]}"
    return base / "bulk"


def make_bulk_dir(base: Path, name: str, uid: int | None, gid: int | None) -> tuple[Path, int]:
    """A fresh bulk directory for one worker and the parent's handle on it (opened before the worker runs)."""
    root = bulk_root(base)
    root.mkdir(mode=0o711, exist_ok=True)
    path = root / name
    path.mkdir(mode=0o700)
    if uid is not None and gid is not None:
        os.chown(path, uid, gid)
    return path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def chown_tree(path: Path, uid: int | None, gid: int | None) -> None:
    """Give a tree to the sandbox user (no-op without one)."""
    if uid is None or gid is None:
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, gid)
        for name in dirs + files:
            with contextlib.suppress(OSError):
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


_WAITERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="kf-reap")
"""Threads that wait for killed workers to go (a CUDA process takes seconds to tear down) and
clean up after them, so a burst of such waits does not hold the event loop's default executor
(which the comparisons use). Not shown to matter: the slow kills seen on the H200 came from
psutil's scan of every process, see :meth:`Worker.terminate`."""


async def _waiting(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_WAITERS, functools.partial(fn, *args))


_READERS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="kf-pipe")
"""Threads that read workers' pipes: blocking reads straight into one buffer per tensor are several
times faster than an event-loop stream for outputs of tens of megabytes."""


def receive_shared(sock: socket.socket) -> list[tuple[dict[str, Any], int]]:
    """The parent's side: the entries and descriptors a prepared spare sent (none if it sent none).

    Non-blocking: the spare sent them before its ``prepared`` frame. Entries that do not parse
    close every descriptor and raise ``ValueError``."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_SHARED_OUTPUTS, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return []
    try:
        entries = json.loads(data) if data else []
        if not isinstance(entries, list) or len(entries) != len(fds):
            raise ValueError(f"{len(fds)} descriptors for {len(entries) if isinstance(entries, list) else '?'} entries")
        for e in entries:
            if not (isinstance(e, dict) and int(e["size"]) > 0 and isinstance(e["shape"], list)):
                raise ValueError(f"bad shared-output entry {e!r}")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"the spare's shared outputs do not parse: {exc}") from None
    return list(zip(entries, fds, strict=True))


@dataclass(frozen=True)
class SharedOutput:
    """One trial output's shared buffer as a spare announced it before any candidate ran."""

    fd: int
    size: int
    """Bytes of the buffer (as its maker rounded them)."""
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Worker:
    """One sandboxed worker process and its pipes (frames in over ``rfd``, jobs out over ``writer``)."""

    mode: str
    proc: asyncio.subprocess.Process | ForkedProcess
    rfd: int
    writer: asyncio.WriteTransport
    dir: Path
    log_path: Path
    token: str
    bulk: Path | None = None
    bulk_fd: int = -1
    ready: dict[str, Any] = field(default_factory=dict)
    dead: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    reading: Future[tuple[dict[str, Any], list[Blob]]] | None = None
    forks: ForkServer | None = None
    """The fork server this worker was forked from (None: a fresh interpreter)."""
    keep_bulk: bool = False
    """Leave frames' bulk files unread (the judge compares them once the worker is gone)."""
    bulk_reads: list[Future[list[Blob]]] = field(default_factory=list)
    """Bulk files being read in the background (see :meth:`recv_deferring_bulk`)."""
    share: socket.socket | None = None
    """The parent's end of a run worker's share socket: descriptors of shared trial outputs come
    over it from a spare (:mod:`gpu_runner.sandboxed.shared_slots`) and go over it to the judge."""
    shared: dict[tuple[int, int], SharedOutput] = field(default_factory=dict)
    """(trial, index) -> the shared output buffer this spare made, held open until :meth:`reap`."""

    def close_shared(self, keys: Iterable[tuple[int, int]] | None = None) -> None:
        """Close the descriptors of shared outputs (``keys``, or all): their memory is freed once
        no process maps them."""
        for key in list(self.shared) if keys is None else list(keys):
            out = self.shared.pop(key, None)
            if out is not None:
                with contextlib.suppress(OSError):
                    os.close(out.fd)

    @property
    def pid(self) -> int:
        """The worker's process id (and process group: it leads its own session)."""
        return self.proc.pid

    async def send(self, header: OpFrame) -> None:
        """Send one op (built by :func:`gpu_runner.frames.op_frame`)."""
        self.writer.write(encode_frame(header))

    async def recv(self, max_blob: int, defer_bulk: bool = False) -> tuple[dict[str, Any], list[Blob]]:
        """The next frame; ``asyncio.IncompleteReadError`` when the worker is gone.

        With ``defer_bulk`` the frame's bulk references stay unread in its header (see
        :meth:`recv_deferring_bulk`). A cancelled ``recv`` leaves its read running until the
        worker is terminated; the worker is never read from again after that.
        """
        if self.reading is not None and not self.reading.done():
            raise FrameError("a read of this worker is still in flight")
        if self.dead:
            raise asyncio.IncompleteReadError(b"", None)
        bulk_fd = self.bulk_fd if self.bulk_fd >= 0 else None
        self.reading = _READERS.submit(read_frame, self.rfd, max_blob, self.stop, bulk_fd, defer_bulk)
        try:
            header, blobs = await asyncio.wrap_future(self.reading)
        except EOFError:
            raise asyncio.IncompleteReadError(b"", None) from None
        decode_report(header)
        return header, blobs

    async def recv_deferring_bulk(self, max_blob: int) -> tuple[dict[str, Any], Future[list[Blob]] | None]:
        """The next frame, its bulk files (if any) read in the background: the future of their blobs.

        The parent then takes the worker's next frame at once instead of after copying tens of
        megabytes (on the H200 that copying held the GPU window open 0.6-1.3 s per candidate).
        The files stay in the parent-held directory until read; :meth:`reap` waits for the reads
        before removing it.
        """
        header, inline = await self.recv(max_blob, defer_bulk=True)
        if "bulk" not in header or self.keep_bulk:
            if inline:  # small tensors came in the frame itself
                done: Future[list[Blob]] = Future()
                done.set_result(list(inline))
                return header, done
            return header, None
        return header, self.read_bulk_later(header.pop("bulk"), max_blob)

    def read_bulk_later(self, refs: object, max_blob: int) -> Future[list[Blob]]:
        """Read a frame's bulk files in the background (``reap`` waits for the read)."""
        later = _READERS.submit(read_bulk, self.bulk_fd, refs, max_blob)
        self.bulk_reads = [f for f in self.bulk_reads if not f.done()]  # reap waits only for unfinished reads
        self.bulk_reads.append(later)
        return later

    def log_text(self, keep: int = 1 << 16) -> str:
        """Head and tail of the worker's log (a candidate may have printed gigabytes)."""
        try:
            with open(self.log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(0)
                if size <= 2 * keep:
                    return fh.read().decode(errors="replace")
                head = fh.read(keep)
                fh.seek(size - keep)
                tail = fh.read(keep)
        except OSError:
            return ""
        cut = f"\n... [{size - 2 * keep} bytes of log cut] ...\n"
        return head.decode(errors="replace") + cut + tail.decode(errors="replace")

    def innermost(self) -> list[int]:
        """The processes of the worker's tree that have no children: the one running its ops (those
        above it are the confinement's parents, waiting; a signal without a handler would kill them)."""
        tree = [self.proc.pid, *_descendants(self.proc.pid)]
        return [pid for pid in tree if proc_children(pid) == []]

    def terminate(self) -> list[int]:
        """SIGKILL the worker's group and every descendant now (blocking, quick); returns their pids to reap.

        After this returns nothing of the candidate runs any more; the kernel may still be
        tearing the processes down, which :meth:`reap` waits for. Only the worker's own tree is
        read from ``/proc`` (a scan of every process, psutil's way, stalled for seconds on the
        H200 host while other killed CUDA processes were being torn down).
        """
        if self.dead:
            return []
        self.dead = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        tree = _descendants(self.proc.pid)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.stop.set()
        self.writer.close()
        return tree

    async def reap(self, tree: list[int], sweep: bool) -> None:
        """Wait until the killed processes are gone (and sweep escapees when there is no PID namespace)."""
        try:
            await self.proc.wait()
            if self.reading is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(self.reading)  # ends within a poll interval of ``stop``
            for pending in self.bulk_reads:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(pending)
        finally:  # a cancelled reap (the pool closing while a spare is being disposed) leaks nothing
            self.release()
        if self.bulk is not None:
            await _waiting(shutil.rmtree, self.bulk, True)
        await asyncio.sleep(0)  # let the write transport's close callback run before the loop may end
        if tree:
            await _waiting(wait_gone, tree, 10.0)
        if sweep:
            await _waiting(sweep_token, self.token)

    def release(self) -> None:
        """Close every descriptor the parent holds for this worker (once its readers are done with
        them: a read still in flight ends within a poll interval of ``stop``, and its descriptor
        is closed then, so its number cannot be reused under it)."""
        fds = [fd for fd in (self.rfd, self.bulk_fd) if fd >= 0]
        self.rfd = self.bulk_fd = -1
        self.close_shared()
        if self.share is not None:
            self.share.close()
            self.share = None
        busy = [f for f in (self.reading, *self.bulk_reads) if f is not None and not f.done()]
        if not busy:
            _close_all(fds)
            return
        left = [len(busy)]
        lock = threading.Lock()

        def one_done(_: object) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                _close_all(fds)

        for future in busy:
            future.add_done_callback(one_done)

    async def kill(self, sweep: bool) -> None:
        """Kill the worker's process group and wait until it is gone."""
        tree = self.terminate()
        await self.reap(tree, sweep)


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def census(pid: int) -> tuple[int, int]:
    """(threads, processes) of ``pid`` and every process below it, read from ``/proc`` by the parent
    (a candidate cannot rewrite what the kernel reports of its process)."""
    pids = [pid, *_descendants(pid)]
    threads = 0
    for p in pids:
        with contextlib.suppress(OSError):
            threads += len(os.listdir(f"/proc/{p}/task"))
    return threads, len(pids)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its tree's ``/proc`` children files (psutil where absent)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = proc_children(todo.pop())
        if kids is None:
            try:
                return [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                return []
        found.extend(kids)
        todo.extend(kids)
    return found


def wait_gone(pids: list[int], timeout_s: float) -> None:
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    psutil.wait_procs(procs, timeout_s)


def sweep_token(token: str) -> int:
    """Kill every process whose environment carries ``token`` (escapees of a process group)."""
    killed = 0
    needle = f"KF_WORKER_TOKEN={token}"
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if f"KF_WORKER_TOKEN={env.get('KF_WORKER_TOKEN')}" == needle:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed += 1
    return killed


async def spawn_worker(
    mode: str,
    device: str,
    iso: Isolation,
    python: str,
    base: Path,
    name: str,
    extra_env: dict[str, str],
    seed: dict[str, Path] | None = None,
    forks: ForkServer | None = None,
) -> Worker:
    """Start a worker; it is not ready until its ``ready`` frame arrives (see :func:`await_ready`).

    ``seed`` maps sub-directories of the worker's private directory to trees copied in first
    (e.g. a Triton cache holding the driver build of an earlier, candidate-free worker). With
    ``forks`` (a running fork server) the worker is forked from it, with the same isolation;
    otherwise, or where the server is down, it starts as a fresh interpreter under ``iso.prefix``.
    """
    home = make_private_dir(base, name, iso.uid, iso.gid)
    for sub, tree in (seed or {}).items():
        if tree.exists():
            await asyncio.to_thread(copy_tree, tree, home / sub)
    bulk, bulk_fd = make_bulk_dir(base, name, iso.uid, iso.gid)
    env = worker_env({**extra_env, "KF_BULK_DIR": str(bulk)}, home)
    log_path = home.parent / f"{name}.log"
    # Caches the evaluator shares between its own workers (the inductor cache) stay writable until
    # the candidate's sandbox hides them; nothing else of the evaluator's is.
    # The judge (a worker that never runs a candidate) also reads the folder of output files.
    shared = [v for k, v in extra_env.items() if k in ("TORCHINDUCTOR_CACHE_DIR", "KF_JUDGE_DIR")]
    for folder in shared:  # it must exist to be kept in the worker's view
        os.makedirs(folder, exist_ok=True)
    spec = _spawn_spec(iso, home, bulk, shared, mode)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    widen_pipe(out_w)
    # A run worker's share socket: shared trial outputs' descriptors (a spare's, before any candidate)
    share, share_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if mode == "run" else (None, None)
    child_fds = (in_r, out_w) if share_child is None else (in_r, out_w, share_child.fileno())
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    proc: asyncio.subprocess.Process | ForkedProcess | None = None
    try:
        if forks is not None and await forks.wait_ready():
            argv = ["--mode", mode, "--device", device, "--in-fd", str(WORKER_FDS[0]), "--out-fd", str(WORKER_FDS[1])]
            if share_child is not None:
                argv += ["--share-fd", str(SHARE_FD)]
            try:
                proc = await forks.spawn(argv, env, home, (in_r, out_w, log_fd, *child_fds[2:]), spec)
            except OSError as exc:
                logger.warning("fork_server_unusable", mode=mode, error=str(exc))
        if proc is None:
            launch = [python, "-m", "gpu_runner.confine.launch", json.dumps(spec), "--"]
            cmd = [
                *iso.prefix,
                *launch,
                python,
                "-X",
                "faulthandler",  # a crash of the run process leaves its Python stack in the log
                "-m",
                "gpu_runner.sandboxed.worker",
                "--mode",
                mode,
                "--device",
                device,
                "--in-fd",
                str(in_r),
                "--out-fd",
                str(out_w),
                *(["--share-fd", str(share_child.fileno())] if share_child is not None else []),
            ]
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                cwd=home,
                env=env,
                start_new_session=True,
                pass_fds=child_fds,
            )
    except BaseException as exc:
        for fd in (in_r, in_w, out_r, out_w, bulk_fd):
            os.close(fd)
        for sock in (share, share_child):
            if sock is not None:
                sock.close()
        shutil.rmtree(bulk, ignore_errors=True)
        if isinstance(exc, OSError):
            raise WorkerStartError(mode, str(exc)) from exc
        raise
    finally:
        os.close(log_fd)
    os.close(in_r)
    os.close(out_w)
    if share_child is not None:
        share_child.close()
    loop = asyncio.get_running_loop()
    write_file = os.fdopen(in_w, "wb", 0)
    try:
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, write_file)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(out_r)
        os.close(bulk_fd)
        write_file.close()
        if share is not None:
            share.close()
        raise
    worker = Worker(mode, proc, out_r, transport, home, log_path, env["KF_WORKER_TOKEN"], bulk, bulk_fd, share=share)
    worker.forks = forks if isinstance(proc, ForkedProcess) else None
    return worker


async def await_ready(worker: Worker, timeout_s: float) -> dict[str, Any]:
    """Wait for the worker's ``ready`` frame; kill it and raise :class:`WorkerStartError` otherwise."""
    try:
        async with asyncio.timeout(timeout_s):
            header, _ = await worker.recv(1 << 20)
    except (TimeoutError, asyncio.IncompleteReadError, FrameError) as exc:
        why = f"no ready signal ({type(exc).__name__})"
    else:
        why = "" if header["kind"] is Report.READY else f"expected ready, got {header['kind']!r}"
    if worker.forks is not None:
        worker.forks.worker_started(not why, why)
    if why:
        await worker.kill(sweep=False)
        raise WorkerStartError(worker.mode, why, worker.log_text()[-3000:])
    worker.ready = header
    return header
