"""The NATS configurations of deploy/nats start as written and serve clients: each runs in a real
``nats-server`` on free loopback ports. A file is copied with only what cannot work on a test
machine replaced (its ports, ``/var/lib/kfoundry`` and ``/etc/kfoundry`` paths), and each
replaced text must still be in the file; ``leaf.conf`` runs from deploy/ itself, its client port
given on the command line. What ``nats-server -t`` checks is in tests/unit/test_deploy.py; what
each role of ``roles.conf`` may do is in tests/bus/test_deploy_auth.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from actors.runtime.bus import Bus, server_has_all
from actors.runtime.kv import get_expert_config, put_expert_config
from actors.runtime.nats_server import find_binary
from schemas import ExpertConfig, ExpertKind
from tests.cluster.nodes import free_ports

NATS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "nats"
STORE = "store_dir: /var/lib/kfoundry/nats"
"""Where every server configuration of deploy/nats keeps JetStream."""
PASSWORD = "test-secret"

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Running:
    """A started server: its client and monitoring URLs, its log."""

    url: str
    http: str
    log: Path


def _localized(name: str, dest: Path, replace: dict[str, str]) -> Path:
    """A copy of deploy/nats/``name`` in ``dest`` with each text replaced; a text the file no
    longer has fails here (the test would otherwise start something other than the file)."""
    text = (NATS_DIR / name).read_text()
    for old, new in replace.items():
        assert old in text, f"{name} no longer has {old!r}: update the stand-ins of this test"
        text = text.replace(old, new)
    path = dest / name
    path.write_text(text)
    return path


@contextlib.contextmanager
def _server(argv: list[str], log: Path, env: dict[str, str]) -> Iterator[None]:
    """``nats-server`` with ``argv``, environment ``env`` only, until it says it is ready."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(find_binary()), *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 20
        while "Server is ready" not in log.read_text():
            assert proc.poll() is None, f"nats-server exited ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"nats-server not ready in 20 s:\n{log.read_text()}"
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return dict(json.loads(resp.read()))


async def _connect(url: str | list[str], **options: Any) -> Client:
    return await nats.connect(url, allow_reconnect=False, connect_timeout=5, **options)


async def _request_until_answered(client: Client, subject: str, payload: bytes) -> Msg:
    """A request, asked again while nobody answers yet (interest crosses a leaf connection a
    moment after the subscription is made)."""
    async with asyncio.timeout(15):
        while True:
            try:
                return await client.request(subject, payload, timeout=1)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                await asyncio.sleep(0.05)


# -- single.conf, and leaf.conf joining it -----------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[Running, int]]:
    """deploy/nats/single.conf on loopback ports; yields it and its leafnode port."""
    port, http, leaf_port = free_ports(3)
    conf = _localized(
        "single.conf",
        tmp_path,
        {
            "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{port}",
            "http: 0.0.0.0:8222": f"http: 127.0.0.1:{http}",
            "listen: 0.0.0.0:7422": f"listen: 127.0.0.1:{leaf_port}",
            STORE: f"store_dir: {tmp_path / 'hub-js'}",
        },
    )
    log = tmp_path / "hub.log"
    with _server(["-c", str(conf)], log, {}):
        yield Running(f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{http}", log), leaf_port


@pytest.fixture
def leaf(hub: tuple[Running, int], tmp_path: Path) -> Iterator[Running]:
    """deploy/nats/leaf.conf as it is in deploy/, HUB_URL naming the hub; its client port on the
    command line (the file listens on 127.0.0.1:4222)."""
    (port,) = free_ports(1)
    log = tmp_path / "leaf.log"
    env = {"HUB_URL": f"nats-leaf://127.0.0.1:{hub[1]}"}
    with _server(["-c", str(NATS_DIR / "leaf.conf"), "-p", str(port)], log, env):
        yield Running(f"nats://127.0.0.1:{port}", "", log)


async def test_single_server_serves_clients_with_jetstream(hub: tuple[Running, int]) -> None:
    server, _ = hub
    health = await asyncio.to_thread(_get_json, f"{server.http}/healthz?js-enabled-only=true")
    varz = await asyncio.to_thread(_get_json, f"{server.http}/varz")
    assert health == {"status": "ok"}
    assert varz["server_name"] == "kf-single"
    assert varz["max_payload"] == 8 * 1024 * 1024
    client = await _connect(server.url)
    try:
        js = client.jetstream()
        name = f"KF_TEST_{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=name, subjects=[f"kf.{name}.>"])
        ack = await js.publish(f"kf.{name}.x", b"kernel")
        assert (ack.stream, ack.seq) == (name, 1)
    finally:
        await client.close()


async def test_leaf_node_joins_the_hub_that_hub_url_names(hub: tuple[Running, int], leaf: Running) -> None:
    server, _ = hub
    on_hub = await _connect(server.url)
    on_leaf = await _connect(leaf.url)
    received: list[bytes] = []
    subject = f"kf.leaftest.{uuid.uuid4().hex}"

    async def answer(msg: Msg) -> None:
        received.append(msg.data)
        await msg.respond(b"hub:" + msg.data)

    try:
        await on_hub.subscribe(subject, cb=answer)
        await server_has_all(on_hub)
        reply = await _request_until_answered(on_leaf, subject, b"from-the-leaf")
    finally:
        await on_leaf.close()
        await on_hub.close()
    assert reply.data == b"hub:from-the-leaf"
    assert received[-1] == b"from-the-leaf"
    leafz = await asyncio.to_thread(_get_json, f"{server.http}/leafz")
    assert leafz["leafnodes"] == 1, leafz


async def test_actors_on_a_leaf_node_use_the_hubs_jetstream(hub: tuple[Running, int], leaf: Running) -> None:
    server, _ = hub

    async def pong(msg: Msg) -> None:
        await msg.respond(b"pong")

    async with contextlib.AsyncExitStack() as stack:
        on_hub = await _connect(server.url)
        stack.push_async_callback(on_hub.close)
        on_leaf = await _connect(leaf.url)
        stack.push_async_callback(on_leaf.close)
        # The leaf connection is up once a request from the leaf is answered on the hub.
        sub = await on_hub.subscribe("kf.leaftest.ping", cb=pong)
        await server_has_all(on_hub)
        await _request_until_answered(on_leaf, "kf.leaftest.ping", b"")
        await sub.unsubscribe()
        hub_bus = await Bus.connect(server.url, name="test-hub", actor_id="test-hub")
        stack.push_async_callback(hub_bus.close)
        leaf_bus = await Bus.connect(leaf.url, name="test-leaf", actor_id="test-leaf")
        stack.push_async_callback(leaf_bus.close)
        # What an actor on the GPU host does: create streams, write and read KV, take messages
        # through a durable pull consumer and acknowledge them, all on the hub's JetStream (a
        # denied JetStream API or $KV.> is retried by the bus until this scope ends).
        await stack.enter_async_context(asyncio.timeout(20))
        await leaf_bus.ensure_shared_streams()
        config = ExpertConfig(name=f"leaf-{uuid.uuid4().hex[:8]}", kind=ExpertKind.TEMPLATE, role="template")
        await put_expert_config(leaf_bus, config)
        stored = await get_expert_config(hub_bus, config.name)
        name = f"KF_TEST_{uuid.uuid4().hex[:8]}"
        js_leaf, js_hub = on_leaf.jetstream(), on_hub.jetstream()
        await js_leaf.add_stream(name=name, subjects=[f"kf.{name}.>"])
        await js_hub.publish(f"kf.{name}.cand", b"candidate")
        pull = await js_leaf.pull_subscribe(f"kf.{name}.>", durable="evaluators", stream=name)
        (msg,) = await pull.fetch(1, timeout=5)
        await msg.ack_sync()
        info = await js_hub.consumer_info(name, "evaluators")
    assert stored == config
    assert msg.data == b"candidate"
    assert info.ack_floor is not None
    assert info.ack_floor.stream_seq == 1
    assert info.num_ack_pending == 0


def test_leaf_node_without_hub_url_refuses_to_start_naming_it() -> None:
    (port,) = free_ports(1)
    proc = subprocess.run(
        [str(find_binary()), "-c", str(NATS_DIR / "leaf.conf"), "-p", str(port)],
        capture_output=True,
        text=True,
        env={},
        timeout=10,
    )
    assert proc.returncode != 0
    assert "HUB_URL" in proc.stdout + proc.stderr


# -- cluster-node.conf ---------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Running]]:
    """Three servers of deploy/nats/cluster-node.conf (NODE=n1..n3), routed to each other on
    loopback in place of the hosts n1, n2, n3."""
    ports = free_ports(9)
    client, http, route = ports[0:3], ports[3:6], ports[6:9]
    routes = {f"nats-route://n{i + 1}:6222": f"nats-route://127.0.0.1:{route[i]}" for i in range(3)}
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(3):
            node = f"n{i + 1}"
            (tmp_path / node).mkdir()
            conf = _localized(
                "cluster-node.conf",
                tmp_path / node,
                {
                    "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{client[i]}",
                    "http: 0.0.0.0:8222": f"http: 127.0.0.1:{http[i]}",
                    "listen: 0.0.0.0:6222": f"listen: 127.0.0.1:{route[i]}",
                    STORE: f"store_dir: {tmp_path / node / 'js'}",
                    **routes,
                },
            )
            log = tmp_path / node / "server.log"
            stack.enter_context(_server(["-c", str(conf)], log, {"NODE": node}))
            servers.append(Running(f"nats://127.0.0.1:{client[i]}", f"http://127.0.0.1:{http[i]}", log))
        yield servers


@pytest.mark.slow  # ~10 s: three servers form a cluster
async def test_cluster_nodes_form_a_jetstream_cluster_that_keeps_three_replicas(cluster: list[Running]) -> None:
    for i, server in enumerate(cluster):
        varz = await asyncio.to_thread(_get_json, f"{server.http}/varz")
        assert varz["server_name"] == f"n{i + 1}"  # server_name: $NODE
        assert varz["cluster"]["name"] == "kfoundry"
    client = await _connect([s.url for s in cluster])
    name = f"KF_TEST_{uuid.uuid4().hex[:8]}"
    try:
        js = client.jetstream()
        async with asyncio.timeout(40):  # the cluster elects its JetStream leader first
            while True:
                try:
                    await js.add_stream(name=name, subjects=[f"kf.{name}.>"], num_replicas=3)
                    break
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    await asyncio.sleep(0.2)
                except nats.js.errors.APIError as exc:
                    if exc.err_code != 10008:  # JetStream cluster not ready yet
                        raise
                    await asyncio.sleep(0.2)
        ack = await js.publish(f"kf.{name}.x", b"kernel")
        info = await js.stream_info(name)
    finally:
        await client.close()
    assert ack.seq == 1
    assert info.cluster is not None
    assert info.cluster.leader in {"n1", "n2", "n3"}
    assert len(info.cluster.replicas or []) == 2


# -- auth-tls.conf with roles.conf ------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _throwaway_certificates(tls: Path) -> None:
    """A CA, and a server certificate it signed for 127.0.0.1 (the names auth-tls.conf reads)."""
    tls.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/CN=kf-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=tls,
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=localhost", cwd=tls)
    (tls / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-set_serial", "1",
        "-days", "2", "-out", "server.pem", "-extfile", "server.ext",
        cwd=tls,
    )  # fmt: skip


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[Running, Path]]:
    """deploy/nats/auth-tls.conf (with roles.conf beside it) on loopback ports, its certificates
    made for the test; yields it and the CA file."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no certificates to start auth-tls.conf with")
    _throwaway_certificates(tmp_path / "tls")
    port, http = free_ports(2)
    conf = _localized(
        "auth-tls.conf",
        tmp_path,
        {
            "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{port}",
            "http: 127.0.0.1:8222": f"http: 127.0.0.1:{http}",
            "/etc/kfoundry/tls": str(tmp_path / "tls"),
            STORE: f"store_dir: {tmp_path / 'js'}",
        },
    )
    shutil.copy(NATS_DIR / "roles.conf", tmp_path / "roles.conf")
    users = re.findall(r"\{\s*user:\s*(\w+)", (NATS_DIR / "roles.conf").read_text())
    env = {f"KF_{user.upper()}_PASSWORD": PASSWORD for user in users}
    log = tmp_path / "server.log"
    with _server(["-c", str(conf)], log, env):
        yield Running(f"tls://127.0.0.1:{port}", f"http://127.0.0.1:{http}", log), tmp_path / "tls" / "ca.pem"


@contextlib.asynccontextmanager
async def _tls_client(url: str, ca: Path, user: str, password: str) -> AsyncIterator[Client]:
    client = await _connect(url, tls=ssl.create_default_context(cafile=str(ca)), user=user, password=password)
    try:
        yield client
    finally:
        await client.close()


async def test_tls_server_with_role_users_serves_them_over_tls(tls_server: tuple[Running, Path]) -> None:
    server, ca = tls_server
    async with (
        _tls_client(server.url, ca, "operator", PASSWORD) as operator,
        _tls_client(server.url, ca, "evaluator", PASSWORD) as evaluator,
    ):
        sub = await operator.subscribe("kf.r1.result.c1")
        await server_has_all(operator)
        await evaluator.publish("kf.r1.result.c1", b"verdict")  # an evaluator's own subject
        await evaluator.flush()
        try:
            msg = await sub.next_msg(timeout=5)
        except nats.errors.TimeoutError:
            connz = await asyncio.to_thread(_get_json, f"{server.http}/connz?subs=1")
            pytest.fail(f"the evaluator's verdict did not reach the operator; the server's connz: {connz}")
        account = await operator.jetstream().account_info()
    assert msg.data == b"verdict"
    assert account.limits is not None  # JetStream answers the operator


async def test_tls_server_refuses_a_wrong_password_and_an_untrusted_client(tls_server: tuple[Running, Path]) -> None:
    server, ca = tls_server
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        async with _tls_client(server.url, ca, "evaluator", "not-the-password"):
            pass
    # A client that does not trust the test CA (the system's CAs only) refuses the certificate.
    with pytest.raises(ssl.SSLCertVerificationError):
        await _connect(server.url.replace("tls://", "nats://"), user="operator", password=PASSWORD)
