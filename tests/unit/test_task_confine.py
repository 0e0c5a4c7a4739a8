"""``--confine-task``: the two places outside the evaluator that import the user's task file (the
template expert's analysis and the run controller's task signature) run it confined, in the
evaluator's layers; without the switch they run it as the user (the control, so these tests can
fail). Real child processes, a real TCP listener on loopback, no mocks."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.signature import with_signature
from actors.experts.template.ir import Plan
from actors.experts.template.isolate import analyse_in_child
from actors.runtime import task_confine
from schemas import Task

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.setblocking(False)
    yield sock
    sock.close()


def _nosy_task(marker: Path, port: int) -> str:
    """A valid reference whose top level writes a file on the host and connects to a host port,
    carrying on where either fails."""
    return f"""
import socket
import torch
import torch.nn as nn

try:
    with open({str(marker)!r}, "w") as f:
        f.write("ran")
except OSError:
    pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
except OSError:
    pass


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(16, 16)]


def get_init_inputs():
    return []
"""


def _connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@pytest.mark.parametrize("confine", [True, False])
def test_the_template_analysis_runs_the_task_confined_only_when_asked(
    tmp_path: Path, listener: socket.socket, confine: bool
) -> None:
    marker = tmp_path / "marker"
    plan = asyncio.run(analyse_in_child(_nosy_task(marker, listener.getsockname()[1]), 180.0, confine=confine))
    assert isinstance(plan, Plan), plan
    assert marker.exists() is not confine
    assert _connected(listener) is not confine


@pytest.mark.parametrize("confine", [True, False])
def test_the_task_signature_is_computed_confined_only_when_asked(
    tmp_path: Path, listener: socket.socket, confine: bool
) -> None:
    marker = tmp_path / "marker"
    task = Task(task_id="t1", name="nosy", source=_nosy_task(marker, listener.getsockname()[1]))
    signed = with_signature(task, confine=confine)
    assert signed.signature is not None
    assert signed.signature.ops == ("relu", "mul")
    assert [s.shape for s in signed.signature.outputs] == [(16, 16)]
    assert marker.exists() is not confine
    assert _connected(listener) is not confine


def test_the_switch_is_an_option_of_run_and_actor_and_an_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "task.py", "--confine-task"]).confine_task is True
    assert parser.parse_args(["actor", "expert", "--run", "r1", "--confine-task"]).confine_task is True
    assert parser.parse_args(["run", "task.py"]).confine_task is False
    monkeypatch.delenv(task_confine.ENV, raising=False)
    assert task_confine.wanted() is False
    task_confine.enable()
    assert task_confine.wanted() is True
    monkeypatch.setenv(task_confine.ENV, "yes")
    with pytest.raises(task_confine.TaskConfineError, match="use 1"):
        task_confine.wanted()
