"""A JetStream cluster of real ``nats-server`` processes for tests: free ports, temporary stores,
nodes that can be killed and restarted on the same ports and store, optionally each inside a
network namespace ("machine") that the test made."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.runtime.nats_server import find_binary

PORT_RANGE = (20000, 32000)
"""Where the cluster's listening ports are drawn: below Linux's ephemeral range (32768-60999), from
which the kernel hands out the source ports of outgoing connections. A port found free there by
binding to port 0 could be taken a moment later by a route connecting between the servers just
started, and the server meant to listen on it never joined the cluster (a three-replica bucket then
waited 60 s on "no suitable peers for placement" in CI)."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports in :data:`PORT_RANGE` that were free on ``host`` a moment ago."""
    rng = random.Random()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind((host, rng.randrange(*PORT_RANGE)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    """One server of the cluster."""

    name: str
    host: str
    port: int
    cluster_port: int
    http_port: int
    store: Path
    routes: list[str] = field(default_factory=list)
    netns: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        cmd = [
            str(find_binary()), "-n", self.name, "-a", self.host, "-p", str(self.port),
            "-m", str(self.http_port), "-js", "-sd", str(self.store / "jetstream"),
            "--cluster_name", "kf-test", "--cluster", f"nats://{self.host}:{self.cluster_port}",
            "--routes", ",".join(self.routes),
        ]  # fmt: skip
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def start(self) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        log = open(self.store / "server.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def kill(self) -> None:
        """SIGKILL: the server dies with whatever it held (the hard case)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> bool:
        """JetStream on this server is current with the cluster (``/healthz``)."""
        url = f"http://{self.host}:{self.http_port}/healthz"
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, "python3", "-c", _HEALTH_PROBE, url]
            return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def jsz(self) -> dict[str, Any]:
        url = f"http://{self.host}:{self.http_port}/jsz?accounts=true&streams=true"
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, "python3", "-c", _JSZ_PROBE, url]
            out = subprocess.run(cmd, capture_output=True, timeout=10, check=True).stdout
            return dict(json.loads(out))
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return dict(json.loads(resp.read()))


_HEALTH_PROBE = "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)"
_JSZ_PROBE = (
    "import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
)


class Cluster:
    """Three (or more) servers routed to each other, with JetStream clustered over them."""

    def __init__(self, root: Path, hosts: Sequence[str], netns: Sequence[str | None] | None = None) -> None:
        namespaces = list(netns) if netns is not None else [None] * len(hosts)
        self.nodes: list[Node] = []
        ports = free_ports(3 * len(hosts))  # at once: one node's ports are never another's
        for i, (host, ns) in enumerate(zip(hosts, namespaces, strict=True)):
            port, cport, hport = ports[3 * i : 3 * i + 3] if ns is None else (4222, 6222, 8222)
            self.nodes.append(Node(f"n{i + 1}", host, port, cport, hport, root / f"n{i + 1}", netns=ns))
        for node in self.nodes:
            node.routes = [f"nats://{n.host}:{n.cluster_port}" for n in self.nodes if n is not node]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            node.start()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60.0, nodes: Sequence[Node] | None = None) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(nodes or self.nodes)
        while waiting:
            waiting = [n for n in waiting if not n.healthy()]
            if not waiting:
                return
            for n in waiting:
                if n.proc is not None and n.proc.poll() is not None:
                    log = (n.store / "server.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"nats-server {n.name} exited: {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"servers not healthy within {timeout} s: {[n.name for n in waiting]}")
            time.sleep(0.2)

    def stream_leader(self, stream: str) -> Node:
        """The node that leads ``stream`` now."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            with contextlib.suppress(OSError, ValueError, subprocess.CalledProcessError):
                for account in node.jsz().get("account_details", []) or []:
                    for s in account.get("stream_detail", []) or []:
                        if s.get("name") == stream and (s.get("cluster") or {}).get("leader"):
                            leader = s["cluster"]["leader"]
                            return next(n for n in self.nodes if n.name == leader)
        raise LookupError(f"no leader known for stream {stream}")

    def describe(self, tail: int = 1500) -> str:
        """Each node's state and the end of its log, for a failing test's message."""
        parts = []
        for n in self.nodes:
            state = (
                "not started"
                if n.proc is None
                else ("running" if n.proc.poll() is None else f"exited {n.proc.returncode}")
            )
            log_path = n.store / "server.log"
            log = log_path.read_text(errors="replace")[-tail:] if log_path.exists() else ""
            parts.append(f"--- {n.name} ({n.url}, cluster port {n.cluster_port}): {state}\n{log}")
        return "\n".join(parts)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
