"""deploy/ as the programs that read it see it: the NATS configurations are valid for the nats-server
we ship (tests/bus/test_deploy_configs.py starts them), the systemd actor unit runs a command the
``kfoundry`` CLI accepts for every instance name it documents, and the compose file and Kubernetes
manifests give the evaluator what its sandbox needs and every long-running container a probe."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from actors.commands.cli import build_parser
from actors.runtime.nats_server import find_binary
from schemas import ActorKind
from tests.cluster.nodes import free_ports

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NATS = DEPLOY / "nats"


def _env() -> dict[str, str]:
    users = re.findall(r"\{\s*user:\s*(\w+)", (NATS / "roles.conf").read_text())
    passwords = {f"KF_{user.upper()}_PASSWORD": "secret" for user in users}
    return passwords | {
        "NODE": "n1",
        "POD_NAME": "nats-0",
        "HUB_URL": "nats-leaf://hub.example:7422",
        "PATH": "/usr/bin:/bin",
    }


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


# -- systemd: kfoundry-actor@KIND[-NAME].service ----------------------------------------------------

SYSTEMD = DEPLOY / "systemd"
ACTOR_UNIT = SYSTEMD / "kfoundry-actor@.service"
WRAPPER = SYSTEMD / "kfoundry-actor"
INSTALLED_WRAPPER = "/opt/kfoundry/bin/kfoundry-actor"
"""Where the unit's header installs deploy/systemd/kfoundry-actor."""
SHARED_ENV = {"NATS_URL": "nats://hub:4222", "KF_RUN": "exp1", "KF_ACTOR_ARGS": "--log-level debug"}
EVALUATOR_0_ENV = {"KF_ACTOR_ARGS": "--device cuda --metrics-port 9464"}
"""/etc/kfoundry/evaluator-0.env of the test: the unit's per-instance file."""
INSTANCES: dict[str, dict[str, object]] = {
    "island-i0": {"kind": "island", "island": "i0", "run": "exp1"},
    "expert-gpt": {"kind": "expert", "name": "gpt"},
    "expert": {"kind": "expert", "name": "template"},
    "evaluator-0": {"kind": "evaluator", "gpu": 0, "run": "exp1", "device": "cuda", "metrics_port": 9464},
    "evaluator": {"kind": "evaluator", "gpu": None, "run": "exp1"},
    "diagnoser": {"kind": "diagnoser", "run": "exp1"},
    "diagnoser-2": {"kind": "diagnoser", "run": "exp1"},
    "migrator": {"kind": "migrator", "run": "exp1"},
    "curator": {"kind": "curator", "run": None},
}
"""Every instance name the unit documents, and what its command must parse to."""


def _unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections: (key, value) in file order (systemd allows a key more than once)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def _specifiers(value: str, instance: str) -> str:
    """``%i`` and ``%%`` expanded as systemd does for ``kfoundry-actor@INSTANCE.service``."""

    def expand(m: re.Match[str]) -> str:
        if m.group(1) not in ("i", "%"):
            pytest.fail(f"%{m.group(1)} in {value!r}: a specifier this test does not expand")
        return instance if m.group(1) == "i" else "%"

    return re.sub(r"%(.)", expand, value)


def _documented_instances() -> set[str]:
    header = [line for line in ACTOR_UNIT.read_text().splitlines() if line.startswith("#")]
    return set(re.findall(r"kfoundry-actor@([a-z][\w-]*)\.service", "\n".join(header)))


def _fake_kfoundry(tmp_path: Path) -> tuple[Path, Path]:
    """A ``kfoundry`` that records its arguments (NUL-separated); returns its folder and the record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv"
    fake = bin_dir / "kfoundry"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    fake.chmod(0o755)
    return bin_dir, record


def _run_unit(instance: str, tmp_path: Path, env_files: dict[str, dict[str, str]]) -> tuple[int, str, list[str]]:
    """What ``kfoundry-actor@INSTANCE.service`` runs: its ExecStart with %i expanded, the wrapper of
    deploy/ in place of the installed one, its environment files read in order (a ``-`` file may be
    missing), a fake ``kfoundry`` first on its PATH. Returns (status, stderr, kfoundry's argv)."""
    service = _unit(ACTOR_UNIT)["Service"]
    env: dict[str, str] = {}
    for key, value in service:
        if key == "Environment":
            name, _, val = _specifiers(value, instance).partition("=")
            env[name] = val
        elif key == "EnvironmentFile":
            path = _specifiers(value, instance)
            optional = path.startswith("-")
            contents = env_files.get(path.removeprefix("-"))
            assert contents is not None or optional, f"{path} is required but the test has none"
            env |= contents or {}
    assert env["PATH"].split(":")[0] == "/opt/kfoundry/venv/bin"  # the venv's kfoundry
    bin_dir, record = _fake_kfoundry(tmp_path)
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    (exec_start,) = [v for k, v in service if k == "ExecStart"]
    argv = shlex.split(_specifiers(exec_start, instance))
    assert argv[0] == INSTALLED_WRAPPER
    proc = subprocess.run([str(WRAPPER), *argv[1:]], env=env, capture_output=True, text=True, timeout=30)
    called = record.read_bytes().decode().split("\0")[:-1] if record.exists() else []
    return proc.returncode, proc.stderr, called


def _env_files(instance: str) -> dict[str, dict[str, str]]:
    files = {"/etc/kfoundry/actor.env": SHARED_ENV}
    if instance == "evaluator-0":
        files["/etc/kfoundry/evaluator-0.env"] = EVALUATOR_0_ENV
    return files


def test_actor_unit_documents_every_instance_pattern_this_test_checks() -> None:
    assert _documented_instances() == set(INSTANCES)
    kinds = {str(v["kind"]) for v in INSTANCES.values()}
    assert kinds == {k.value for k in ActorKind} - {ActorKind.CONTROLLER.value}
    files = [v for k, v in _unit(ACTOR_UNIT)["Service"] if k == "EnvironmentFile"]
    assert files == ["/etc/kfoundry/actor.env", "-/etc/kfoundry/%i.env"]  # shared, then per instance
    assert f"install -m 755 deploy/systemd/kfoundry-actor {INSTALLED_WRAPPER}" in ACTOR_UNIT.read_text()


@pytest.mark.parametrize("instance", sorted(INSTANCES))
def test_actor_unit_instance_runs_a_command_the_cli_accepts(instance: str, tmp_path: Path) -> None:
    status, stderr, argv = _run_unit(instance, tmp_path, _env_files(instance))
    assert status == 0, stderr
    assert argv[:2] == ["actor", INSTANCES[instance]["kind"]]
    try:
        parsed = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"kfoundry-actor@{instance}: `kfoundry {shlex.join(argv)}` is refused by the CLI")
    for field, want in INSTANCES[instance].items():
        assert getattr(parsed, field) == want, (field, argv)
    # KF_ACTOR_ARGS: the per-instance file's replaces the shared one.
    assert parsed.log_level == ("info" if instance == "evaluator-0" else "debug"), argv


@pytest.mark.parametrize(
    ("instance", "env", "said"),
    [
        ("island", SHARED_ENV, "island-i0"),  # an island without its id
        ("evaluator-gpu0", SHARED_ENV, "GPU index"),
        ("controller", SHARED_ENV, "no actor kind 'controller'"),  # `kfoundry run`, not an actor unit
        ("island-i0", {"NATS_URL": "nats://hub:4222"}, "KF_RUN"),
    ],
)
def test_actor_unit_refuses_an_instance_it_cannot_start(
    instance: str, env: dict[str, str], said: str, tmp_path: Path
) -> None:
    status, stderr, argv = _run_unit(instance, tmp_path, {"/etc/kfoundry/actor.env": env})
    assert status == 2
    assert said in stderr
    assert argv == []  # kfoundry was not started


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_actor_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # The installed wrapper's path in place of the one in deploy/ (verify checks it is executable).
    text = ACTOR_UNIT.read_text().replace(f"ExecStart={INSTALLED_WRAPPER}", f"ExecStart={WRAPPER}")
    assert f"ExecStart={WRAPPER} %i" in text
    (tmp_path / ACTOR_UNIT.name).write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "./kfoundry-actor@island-i0.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- compose and Kubernetes: the evaluator's sandbox, and probes --------------------------------------

IMAGE = "kernel-foundry"
NO_SHELL = {"natsio/prometheus-nats-exporter"}
"""Images built FROM scratch: no command can run in them, so compose cannot probe them."""


def _compose_services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"])


def _workloads() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs = [d for name in kustomization["resources"] for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text())]
    return [d for d in docs if d and d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def _is_evaluator(args: list[str]) -> bool:
    return args[:2] == ["actor", ActorKind.EVALUATOR.value]


def test_evaluator_container_may_make_its_sandbox_in_compose() -> None:
    services = _compose_services()
    evaluators = {n: s for n, s in services.items() if s.get("image") == IMAGE and _is_evaluator(s["command"])}
    assert evaluators
    for name, svc in evaluators.items():
        assert "SYS_ADMIN" in svc.get("cap_add", []), name
        assert "apparmor=unconfined" in svc.get("security_opt", []), name
        assert "--isolation" not in svc["command"], name  # strict, the evaluator's default
    others = [n for n, s in services.items() if n not in evaluators and (s.get("cap_add") or s.get("security_opt"))]
    assert not others, f"only evaluators need these privileges: {others}"


def test_evaluator_container_may_make_its_sandbox_on_kubernetes() -> None:
    containers = [c for w in _workloads() for c in w["spec"]["template"]["spec"]["containers"]]
    evaluators = [c for c in containers if c["image"] == IMAGE and _is_evaluator(c["args"])]
    assert evaluators
    for c in evaluators:
        context = c["securityContext"]
        assert "SYS_ADMIN" in context["capabilities"]["add"]
        assert context["appArmorProfile"] == {"type": "Unconfined"}
        assert context["seccompProfile"]["type"] in ("RuntimeDefault", "Unconfined")
        assert "--isolation" not in c["args"]
    others = [c["name"] for c in containers if c not in evaluators and "securityContext" in c]
    assert not others, f"only evaluators need a securityContext: {others}"


def _probe_port(probe: dict[str, Any], container: dict[str, Any]) -> int:
    """The container port a probe asks (by name or number); fails for a port it does not declare."""
    (how,) = (probe[k] for k in ("httpGet", "tcpSocket", "exec", "grpc") if k in probe)
    if "command" in how:
        return -1
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    port = how["port"]
    assert port in ports or port in ports.values(), f"{container['name']}: probe port {port} is not declared"
    return int(ports.get(port, port))


def test_every_long_running_kubernetes_container_has_readiness_and_liveness_probes() -> None:
    checked = 0
    for workload in _workloads():
        if workload["kind"] == "Job":
            continue  # the controller: runs to its end
        for c in workload["spec"]["template"]["spec"]["containers"]:
            name = f"{workload['metadata']['name']}/{c['name']}"
            assert "readinessProbe" in c, name
            assert "livenessProbe" in c, name
            for probe in (c["readinessProbe"], c["livenessProbe"]):
                port = _probe_port(probe, c)
                if c["image"] == IMAGE:  # actors: the /metrics their --metrics-port serves
                    assert probe["httpGet"]["path"] == "/metrics", name
                    assert str(port) == c["args"][c["args"].index("--metrics-port") + 1], name
                elif c["image"].startswith("nats:"):
                    assert probe["httpGet"]["path"].startswith("/healthz"), name
            checked += 1
    assert checked >= 8


def test_every_long_running_compose_service_has_a_healthcheck() -> None:
    checked = 0
    for name, svc in _compose_services().items():
        check = svc.get("healthcheck", {})
        if svc.get("restart") == "no":
            continue  # the controller: runs to its end
        if str(svc.get("image", "")).split(":")[0] in NO_SHELL:
            assert not check, name
            continue
        assert check.get("test"), name
        assert not check.get("disable"), name
        if svc.get("image") == IMAGE:
            url = next(a for a in check["test"] if "/metrics" in a)
            port = re.search(r"127\.0\.0\.1:(\d+)/metrics", url).group(1)  # type: ignore[union-attr]
            assert port == svc["command"][svc["command"].index("--metrics-port") + 1], name
        checked += 1
    assert checked >= 10


def test_actor_healthcheck_passes_while_metrics_are_served_and_fails_without_them() -> None:
    actor = next(s for s in _compose_services().values() if s.get("image") == IMAGE and s.get("restart") != "no")
    test = actor["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    (port,) = free_ports(1)
    argv = [sys.executable, *[a.replace("127.0.0.1:9464", f"127.0.0.1:{port}") for a in test[2:]]]
    refused = subprocess.run(argv, capture_output=True, timeout=30)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=CollectorRegistry())
    try:
        served = subprocess.run(argv, capture_output=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert refused.returncode != 0
    assert served.returncode == 0, served.stderr
