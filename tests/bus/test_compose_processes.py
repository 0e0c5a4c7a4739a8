"""deploy/compose.yaml's run, brought up as processes on loopback: its three NATS nodes (the
cluster of tests/bus/test_deploy_configs.py), then every service of the Kernel Foundry image with
its own command and replicas, and a task run through them to its report.

Only what a test machine cannot have is replaced, each replacement checked to be in the file:
the ``${VAR:-default}`` values (``DEVICE=cpu`` here), the hosts ``n1..n3`` (the cluster's loopback
URLs), the ``/data`` volumes (folders of the test) and each actor's metrics port (a free one).
The controller gets a budget (``--candidates 2 --seconds 150``): the file leaves the defaults of a
real run. Docker itself is not needed, and not used."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bus.test_deploy_configs import Running, cluster  # noqa: F401 - the three NATS nodes
from tests.cluster.nodes import free_ports
from tests.e2e.helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
IMAGE = "kernel-foundry"
BUDGET = ["--candidates", "2", "--seconds", "150"]


def _services() -> dict[str, Any]:
    """The services of the Kernel Foundry image (the anchors merged), by name."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {name: svc for name, svc in services.items() if svc.get("image") == IMAGE}


def _argv(command: list[str], env: dict[str, str], data: Path) -> list[str]:
    """A service's command with ``${VAR:-default}`` expanded from ``env``, ``/data/...`` paths
    moved under ``data`` and ``--metrics-port`` given a free port."""
    out: list[str] = []
    for arg in command:
        arg = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), arg)
        if arg.startswith("/data/"):
            arg = str(data / arg.removeprefix("/data/"))
        out.append(arg)
    if "--metrics-port" in out:
        out[out.index("--metrics-port") + 1] = str(free_ports(1)[0])
    return out


@contextlib.contextmanager
def _started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "actors.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.slow  # a three-node cluster, eight actor processes and a run on the CPU: a minute or two
@pytest.mark.timeout(420)
def test_the_compose_files_services_run_a_task_as_processes(cluster: list[Running], tmp_path: Path) -> None:  # noqa: F811
    services = _services()
    assert {"controller", "curator", "expert-template", "evaluator", "diagnoser", "migrator", "island-i0",
            "island-i1"} <= set(services), sorted(services)  # fmt: skip
    run_id = f"compose{uuid.uuid4().hex[:8]}"
    values = {"RUN": run_id, "DEVICE": "cpu"}
    data = tmp_path / "data"
    env = cli_env(tmp_path) | {"HF_HUB_OFFLINE": "1"}
    hosts = str(next(iter(services.values()))["environment"]["NATS_URL"])
    assert hosts == "nats://n1:4222,nats://n2:4222,nats://n3:4222", hosts
    env["NATS_URL"] = ",".join(server.url for server in cluster)

    with contextlib.ExitStack() as stack:
        actors: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        for name, svc in services.items():
            if name == "controller":
                continue
            replicas = int(svc.get("deploy", {}).get("replicas", 1))
            for k in range(replicas):
                log = tmp_path / f"{name}-{k}.log"
                argv = _argv(list(svc["command"]), values, data)
                actors.append((name, stack.enter_context(_started(argv, env, log)), log))
        controller = services["controller"]
        argv = _argv(list(controller["command"]), values, data) + BUDGET
        assert argv[:2] == ["run", "examples/quickstart.py"], argv
        assert "--no-local-actors" in argv
        log = tmp_path / "controller.log"
        with _started(argv, env, log) as run:
            try:
                code = run.wait(timeout=360)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the run did not end in 360 s:\n{log.read_text()[-3000:]}")
        out = log.read_text()
        assert code in (0, 1), out[-3000:]
        # The run's own actors drain and leave when it ends (compose restarts them to wait for the
        # next run); the shared ones (curator, experts) serve on until stopped, as by `compose down`.
        shared = {name for name, svc in services.items() if "--run" not in svc["command"]} - {"controller"}
        assert shared == {"curator", "expert-template"}, shared
        for name, proc, actor_log in actors:
            if name in shared:
                assert proc.poll() is None, f"{name} exited ({proc.returncode}):\n{actor_log.read_text()[-2000:]}"
            else:
                assert proc.wait(timeout=60) == 0, f"{name}:\n{actor_log.read_text()[-2000:]}"
        logs = subprocess.run([sys.executable, "-m", "actors.cli", "logs", run_id, "--json"], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60)  # fmt: skip
        for name, proc, _ in actors:
            if name in shared:
                proc.send_signal(signal.SIGTERM)
        for name, proc, actor_log in actors:
            assert proc.wait(timeout=90) == 0, f"{name}:\n{actor_log.read_text()[-2000:]}"

    report = json.loads((data / "runs" / run_id / "report.json").read_text())
    assert report["run_id"] == run_id
    assert 1 <= report["evaluated"] <= 2, report["evaluated"]
    assert report["best"] is not None, out[-3000:]
    assert (data / "runs" / run_id / "best_model.py").is_file()
    assert os.path.isdir(data / "experience")  # the curator's volume
    # the actors' lines of the run, gathered from the cluster (kfoundry logs)
    assert logs.returncode == 0, logs.stderr
    kinds = {str(json.loads(line)["actor"]).split("-")[0] for line in logs.stdout.splitlines()}
    assert {"island", "evaluator", "diagnoser", "migrator"} <= kinds, kinds
