"""A run on a 3-node JetStream cluster survives the loss of one server: actors spread over the
three servers (and, where the OS allows, over three network namespaces standing for machines),
the server leading the run's stream killed with SIGKILL mid-run; the run goes on while it is down,
it is restarted, the run ends, and its stream holds exactly one result and one feedback per
candidate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import Cluster, Node

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "quickstart.py"
CANDIDATES = 40


class Machines:
    """Where each group of processes runs: this host, or one network namespace per machine."""

    def __init__(self, tmp: Path, cluster: Cluster, namespaces: list[str] | None = None) -> None:
        self.tmp = tmp
        self.cluster = cluster
        self.namespaces = namespaces
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", KFOUNDRY_HOME=str(tmp / "home"), HF_HUB_OFFLINE="1")
        self.env.pop("NATS_URL", None)

    def prefix(self, machine: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[machine]] if self.namespaces else []

    def spawn(self, machine: int, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``kfoundry ARGS`` on ``machine``, logging to ``<name>.log``."""
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            proc = subprocess.Popen(
                [*self.prefix(machine), sys.executable, "-m", "actors.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def check(self, machine: int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``python -m tests.cluster.stream_check ARGS`` on ``machine``."""
        return subprocess.run(
            [*self.prefix(machine), sys.executable, "-m", "tests.cluster.stream_check", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )

    def audit(self, machine: int, run_id: str) -> dict[str, object]:
        proc = self.check(machine, "audit", self.cluster.nodes[machine].url, run_id)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return dict(json.loads(proc.stdout))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _failover_run(tmp: Path, machines: Machines) -> None:
    cluster = machines.cluster
    urls = [n.url for n in cluster.nodes]
    run_id = "fo" + uuid.uuid4().hex[:8]
    # Machine 0: the controller, the curator and the expert; machine 1: evaluators; machine 2:
    # the diagnoser, the migrator and the islands. Each group knows only its own server's URL.
    controller = machines.spawn(
        0, "controller", "run", str(TASK), "--nats", urls[0], "--no-local-actors", "--run-id", run_id,
        "--device", "cpu", "--candidates", str(CANDIDATES), "--islands", "2", "--inflight", "2",
        "--seconds", "300", "--eval-timeout", "20", "--run-dir", str(tmp / "run"), "--quiet",
    )  # fmt: skip
    ready = machines.check(0, "wait-run", urls[0], run_id, "120", timeout=150)
    assert ready.returncode == 0, (tmp / "controller.log").read_text()[-3000:]
    machines.spawn(0, "curator", "actor", "curator", "--nats", urls[0], "--embedder", "hashing",
                   "--library-dir", str(tmp / "library"))  # fmt: skip
    machines.spawn(0, "expert", "actor", "expert", "--name", "template", "--nats", urls[0])
    for i in range(2):
        machines.spawn(1, f"evaluator{i}", "actor", "evaluator", "--run", run_id, "--nats", urls[1],
                       "--runner", "noop", "--noop-delay", "1.0", "--ack-wait", "5")  # fmt: skip
    machines.spawn(2, "diagnoser", "actor", "diagnoser", "--run", run_id, "--nats", urls[2])
    machines.spawn(2, "migrator", "actor", "migrator", "--run", run_id, "--nats", urls[2])
    for island in ("i0", "i1"):
        machines.spawn(2, island, "actor", "island", "--run", run_id, "--island", island, "--nats", urls[2])

    # Mid-run: once a few results are in, SIGKILL the server that leads the run's stream.
    waited = machines.check(0, "wait-results", urls[0], run_id, "6", "240", timeout=270)
    assert waited.returncode == 0, "the run made no progress: " + (tmp / "controller.log").read_text()[-3000:]
    before = int(json.loads(waited.stdout)["results"])
    victim: Node = cluster.stream_leader(f"KF_RUN_{run_id}")
    victim.kill()
    assert before < CANDIDATES, "the run was over before the server was killed"
    # The cluster goes on without it: more results are stored while it is down (the run's
    # stream, its consumers and the buckets have replicas on the two servers left).
    alive = next(i for i, n in enumerate(cluster.nodes) if n is not victim)
    during = machines.check(alive, "wait-results", urls[alive], run_id, str(before + 4), "90", timeout=120)
    assert during.returncode == 0, f"no progress with {victim.name} down: {during.stdout} {during.stderr[-2000:]}"
    victim.start()
    cluster.wait_healthy(90)

    try:
        controller.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not end within 300 s of the server's restart")
    out = (tmp / "controller.log").read_text()
    assert f"run {run_id} ended" in out, out[-3000:]
    time.sleep(2.0)  # evaluators and diagnosers finish what they hold after the RunEnd
    after = machines.audit(0, run_id)
    candidates, results, feedback = (dict(after[k]) for k in ("candidates", "results", "feedback"))  # type: ignore[call-overload]
    assert len(results) >= CANDIDATES, (len(results), out[-2000:])
    # Nothing lost: every candidate published has a result and feedback; nothing doubled.
    assert sorted(set(candidates) - set(results)) == []
    assert sorted(set(results) - set(feedback)) == []
    for what, table in (("candidates", candidates), ("results", results), ("feedback", feedback)):
        assert [c for c, n in table.items() if n != 1] == [], f"{what} doubled"
    assert after["run_ends"] == 1
    assert after["dead_letters"] == 0
    assert after["undecodable"] == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_on_three_servers_survives_the_leader_of_its_stream_being_killed(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "nats", ["127.0.0.1"] * 3)
    machines = Machines(tmp_path, cluster)
    cluster.start()
    try:
        _failover_run(tmp_path, machines)
    finally:
        machines.stop_all()
        cluster.stop()


# -- the same run with each group of processes in its own network namespace ----------------------

# TEST-NET-1 (RFC 5737): never routed anywhere; the addresses exist only inside the namespaces
# this test creates, which have no route but their own /24.
SUBNET = "192.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _can_make_namespaces() -> bool:
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    probe = f"kfprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError):
        return False
    _ip("netns", "del", probe)
    return True


@pytest.fixture
def namespaces() -> Iterator[list[str]]:
    """Three namespaces ("machines") joined by veth pairs to a bridge in a fourth one."""
    if not _can_make_namespaces():
        pytest.skip("network namespaces need Linux and root (ip netns)")
    tag = uuid.uuid4().hex[:5]
    switch = f"kf{tag}sw"
    machines = [f"kf{tag}m{i}" for i in range(3)]
    made: list[str] = []
    try:
        for ns in (switch, *machines):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, ns in enumerate(machines):
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", switch)
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        yield machines
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_spread_over_three_network_namespaces_survives_a_server_loss(tmp_path: Path, namespaces: list[str]) -> None:
    hosts = [f"{SUBNET}.{i + 1}" for i in range(3)]
    cluster = Cluster(tmp_path / "nats", hosts, netns=namespaces)
    machines = Machines(tmp_path, cluster, namespaces)
    cluster.start()
    try:
        _failover_run(tmp_path, machines)
    finally:
        machines.stop_all()
        cluster.stop()
