"""The NATS configurations under deploy/ are valid for the nats-server we ship."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from actors.nats_server import find_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"
ENV = {"NODE": "n1", "HUB": "hub.example", "KF_OPERATOR_PASSWORD": "a", "KF_EVALUATOR_PASSWORD": "b"}


def _test_config(name: str) -> subprocess.CompletedProcess[str]:
    env = ENV | {"KF_EXPERT_PASSWORD": "c", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(find_binary()), "-c", str(DEPLOY / name), "-t"], capture_output=True, text=True, env=env, timeout=30
    )


@pytest.mark.parametrize("name", ["single.conf", "cluster-node.conf", "leaf.conf"])
def test_nats_config_is_valid(name: str) -> None:
    proc = _test_config(name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is valid" in proc.stdout + proc.stderr


def test_tls_config_fails_only_for_the_missing_certificates() -> None:
    proc = _test_config("auth-tls.conf")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "server.pem" in out, out
