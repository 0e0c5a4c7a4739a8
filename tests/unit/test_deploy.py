"""The NATS configurations under deploy/ are valid for the nats-server we ship."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from actors.runtime.nats_server import find_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NATS = DEPLOY / "nats"


def _env() -> dict[str, str]:
    users = re.findall(r"\{\s*user:\s*(\w+)", (NATS / "roles.conf").read_text())
    passwords = {f"KF_{user.upper()}_PASSWORD": "secret" for user in users}
    return passwords | {"NODE": "n1", "POD_NAME": "nats-0", "HUB": "hub.example", "PATH": "/usr/bin:/bin"}


def _test_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_binary()), "-c", str(path), "-t"], capture_output=True, text=True, env=_env(), timeout=30
    )


@pytest.mark.parametrize("name", ["single.conf", "cluster-node.conf", "leaf.conf"])
def test_nats_config_is_valid(name: str) -> None:
    proc = _test_config(NATS / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is valid" in proc.stdout + proc.stderr


def test_tls_config_with_its_roles_fails_only_for_the_missing_certificates() -> None:
    proc = _test_config(NATS / "auth-tls.conf")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "server.pem" in out, out


def test_tls_config_is_valid_apart_from_its_certificates(tmp_path: Path) -> None:
    # The same file without its tls block: -t then checks everything else, the included roles
    # and every permission subject among them.
    conf = re.sub(r"\ntls \{.*?\n\}\n", "\n", (NATS / "auth-tls.conf").read_text(), flags=re.DOTALL)
    assert "tls {" not in conf
    shutil.copy(NATS / "roles.conf", tmp_path / "roles.conf")
    (tmp_path / "auth.conf").write_text(conf)
    proc = _test_config(tmp_path / "auth.conf")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kubernetes_nats_config_is_valid(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "nats.yaml").read_text()))
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config")
    path = tmp_path / "nats.conf"
    path.write_text(config["data"]["nats.conf"])
    proc = _test_config(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
