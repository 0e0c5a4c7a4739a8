"""deploy/ deploys: the Kubernetes manifests validate against the Kubernetes schemas, the compose file
against the Compose specification's schema, the Prometheus configuration scrapes services that
exist, every actor kind of the CLI is deployed in both, and every command they run is one the
``kfoundry`` CLI (the image's entrypoint) accepts."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from actors.commands.cli import build_parser
from schemas import ActorKind

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
K8S_VERSION = "1.33"
"""The oldest Kubernetes the manifests target (pod-index labels need 1.28 or newer)."""
IMAGE = "kernel-foundry"
METRICS_PORT = "9464"


def _kustomized() -> list[dict[str, Any]]:
    """The resources the kustomization lists, in order."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Workload name -> pod template, for every workload."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")
    }


def _kfoundry_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload, pod template, container) for every container running the Kernel Foundry image."""
    return [
        (name, template, c)
        for name, template in _pod_specs(docs).items()
        for c in template["spec"]["containers"]
        if c["image"] == IMAGE
    ]


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _compose_commands() -> dict[str, list[str]]:
    """Service -> its kfoundry arguments, compose interpolation applied with the defaults."""
    out = {}
    for name, svc in _compose()["services"].items():
        if svc.get("image") == IMAGE:
            out[name] = [re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", str(a)) for a in svc["command"]]
    return out


def _k8s_args(container: dict[str, Any]) -> list[str]:
    """A container's arguments with ``$(VAR)`` expanded from the run ConfigMap and its env."""
    config = next(d for d in _kustomized() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kfoundry-run")
    values = dict(config["data"]) | {e["name"]: "0" for e in container.get("env", [])}
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]


def _kind_of(args: list[str]) -> str:
    """The actor kind a kfoundry command line starts (``run`` is the controller)."""
    return ActorKind.CONTROLLER.value if args[0] == "run" else args[1]


# -- Kubernetes -------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_in_its_folder() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_every_kubernetes_manifest_validates_against_the_kubernetes_schemas() -> None:
    docs = _kustomized()
    assert len(docs) >= 15
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_rejects_a_broken_manifest() -> None:
    evaluator = next(d for d in _kustomized() if d["kind"] == "Deployment" and d["metadata"]["name"] == "evaluator")
    evaluator["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo of "resources"
    with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
        kubernetes_validate.validate(evaluator, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_manifests_that_validate() -> None:
    proc = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"kfoundry"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_nats_runs_as_a_three_node_jetstream_cluster_on_kubernetes() -> None:
    docs = _kustomized()
    nats = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "nats")
    assert nats["spec"]["replicas"] == 3
    headless = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == nats["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config")
    text = conf["data"]["nats.conf"]
    assert "jetstream" in text
    routes = re.findall(r"nats://(nats-\d)\.(\S+):6222", text)
    assert sorted(r[0] for r in routes) == ["nats-0", "nats-1", "nats-2"]
    assert {r[1] for r in routes} == {headless["metadata"]["name"]}


def test_every_actor_pod_serves_metrics_where_its_scrape_annotations_point() -> None:
    for name, template, container in _kfoundry_containers(_kustomized()):
        args = _k8s_args(container)
        if args[0] == "run":
            continue  # the controller serves no metrics
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        port = annotations["prometheus.io/port"]
        assert args[args.index("--metrics-port") + 1] == port, name
        assert {"name": "metrics", "containerPort": int(port)} in container["ports"], name


def test_gpu_evaluators_request_a_gpu_each() -> None:
    for name, _, container in _kfoundry_containers(_kustomized()):
        args = _k8s_args(container)
        if _kind_of(args) == ActorKind.EVALUATOR:
            assert args[args.index("--device") + 1] == "cuda", name
            assert container["resources"]["requests"]["nvidia.com/gpu"] == 1, name
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1, name


# -- compose ----------------------------------------------------------------------------------------


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_compose_file_validates_against_the_compose_specification() -> None:
    proc = _check_compose(COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_compose_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = _compose()
    broken["services"]["evaluator"]["restart_policy"] = "always"  # not a service key
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    proc = _check_compose(path)
    assert proc.returncode == 1
    assert "restart_policy" in proc.stdout + proc.stderr


def test_compose_runs_a_three_node_jetstream_cluster() -> None:
    services = _compose()["services"]
    nodes = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("nats:")}
    assert len(nodes) == 3
    conf = (DEPLOY / "nats" / "cluster-node.conf").read_text()
    routes = set(re.findall(r"nats-route://(\w+):6222", conf))
    aliases = {a for s in nodes.values() for a in s["networks"]["default"]["aliases"]}
    assert routes == aliases == {s["environment"]["NODE"] for s in nodes.values()}
    assert all("cluster-node.conf" in " ".join(s["command"]) for s in nodes.values())


def test_every_compose_actor_restarts_and_serves_metrics() -> None:
    services = _compose()["services"]
    for name, args in _compose_commands().items():
        if args[0] == "run":
            assert services[name]["restart"] == "no"  # a finished run must not start again
            continue
        assert services[name]["restart"] in ("unless-stopped", "always", "on-failure"), name
        assert args[args.index("--metrics-port") + 1] == METRICS_PORT, name


def test_prometheus_scrapes_every_actor_service_and_only_services_that_exist() -> None:
    services = _compose()["services"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "scrape.yaml").read_text())
    scraped: dict[str, str] = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped |= {name: str(sd["port"]) for name in sd["names"]}
        for static in job.get("static_configs", []):
            scraped |= dict(target.rsplit(":", 1) for target in static["targets"])
    missing = set(scraped) - set(services)
    assert not missing, f"scraped but not in compose: {sorted(missing)}"
    actors = {name: args for name, args in _compose_commands().items() if args[0] == "actor"}
    assert set(actors) <= set(scraped), f"actors not scraped: {sorted(set(actors) - set(scraped))}"
    for name, args in actors.items():
        assert scraped[name] == args[args.index("--metrics-port") + 1], name
    for name, port in scraped.items():
        assert port in [str(e) for e in services[name].get("expose", [])], name


# -- both, against the CLI --------------------------------------------------------------------------


def _cli_kinds() -> set[str]:
    """Every actor kind the CLI starts: ``kfoundry actor``'s choices, and the controller (``run``)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actor = sub.choices["actor"]  # type: ignore[index]
    kinds = next(a for a in actor._actions if a.dest == "kind").choices
    return {str(k) for k in kinds or []} | {ActorKind.CONTROLLER.value}


def test_every_actor_kind_of_the_cli_is_deployed_in_compose_and_kubernetes() -> None:
    kinds = _cli_kinds()
    assert kinds == {k.value for k in ActorKind}
    in_compose = {_kind_of(args) for args in _compose_commands().values()}
    in_k8s = {_kind_of(_k8s_args(c)) for _, _, c in _kfoundry_containers(_kustomized())}
    assert in_compose == kinds, sorted(kinds ^ in_compose)
    assert in_k8s == kinds, sorted(kinds ^ in_k8s)


def test_dockerfile_entrypoint_is_the_kfoundry_cli() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["kfoundry"]
    assert scripts["kfoundry"] == "actors.cli:main"
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(cmd)
    assert exc.value.code == 0  # the default command (--help) exits cleanly


def test_every_deployed_command_is_one_the_cli_accepts() -> None:
    commands = list(_compose_commands().items())
    commands += [(name, _k8s_args(c)) for name, _, c in _kfoundry_containers(_kustomized())]
    assert len(commands) >= 15
    parser = build_parser()
    for name, args in commands:
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{name}: `kfoundry {shlex.join(args)}` is refused by the CLI")
        if args[0] == "run":
            assert (ROOT / parsed.task).is_file(), f"{name}: task {parsed.task} is not in the image"
            assert parsed.no_local_actors, name
        elif args[0] == "actor" and parsed.kind not in ("expert", "curator"):
            assert parsed.run, f"{name}: a {parsed.kind} needs --run"
