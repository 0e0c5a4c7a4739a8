"""The task signature comes from the meta device: shapes and FLOPs of huge references at no cost."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors.commands.signature import SignatureRun, signature_of, signature_within
from schemas import Task

pytestmark = pytest.mark.timeout(60)

HUGE_MM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(torch.matmul(a, b))

def get_inputs():
    return [torch.rand(65536, 65536), torch.rand(65536, 32768)]  # 16 GiB + 8 GiB: never built

def get_init_inputs():
    return []
"""

DATA_DEPENDENT = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x[x > 0.5].sum().reshape(1) * float(x.max().item())

def get_inputs():
    return [torch.rand(64, 32)]

def get_init_inputs():
    return []
"""

HUGE_DATA_DEPENDENT = DATA_DEPENDENT.replace("torch.rand(64, 32)", "torch.rand(65536, 65536)")


def test_huge_reference_is_described_without_building_its_inputs() -> None:
    t0 = time.perf_counter()
    sig = signature_of(HUGE_MM, "huge_mm")
    assert time.perf_counter() - t0 < 20  # 24 GiB of CPU tensors would not even fit this machine's budget
    assert [s.shape for s in sig.inputs] == [(65536, 65536), (65536, 32768)]
    assert [s.shape for s in sig.outputs] == [(65536, 32768)]
    assert sig.flops == 2 * 65536 * 65536 * 32768
    assert sig.bytes_moved == 4 * (65536 * 65536 + 2 * 65536 * 32768)
    assert "matmul" in sig.ops
    assert "relu" in sig.ops


def test_small_reference_the_meta_device_cannot_run_is_run_on_the_cpu() -> None:
    sig = signature_of(DATA_DEPENDENT, "data_dependent")
    assert [s.shape for s in sig.inputs] == [(64, 32)]
    assert [s.shape for s in sig.outputs] == [(1,)]


def test_large_reference_the_meta_device_cannot_run_is_not_built_on_the_cpu() -> None:
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="nonzero"):  # what the meta device raised, not a CPU run
        signature_of(HUGE_DATA_DEPENDENT, "huge_data_dependent")
    assert time.perf_counter() - t0 < 20


SLOW_IMPORT = """
import time
time.sleep(3)  # a task that never returns, standing in: this one ends after the test
raise RuntimeError("described no further: no trace runs beside the next test's")
"""

LATE = """
import time
import torch
import torch.nn as nn

time.sleep(1)

class Model(nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    return [torch.rand(4)]

def get_init_inputs():
    return []
"""

PRINTS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        print("from the task")
        return x

def get_inputs():
    return [torch.rand(4)]

def get_init_inputs():
    return []
"""


async def test_a_run_waits_for_its_task_signature_a_bounded_time() -> None:
    task = Task.from_source("slow", SLOW_IMPORT)
    t0 = time.monotonic()
    described = await signature_within(task, wait_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert described.signature is None


def test_a_signature_given_up_on_ends_quietly_when_it_comes(capsys: pytest.CaptureFixture[str]) -> None:
    async def given_up() -> None:
        await signature_within(Task.from_source("late", LATE), wait_s=0.2)

    asyncio.run(given_up())
    end = time.monotonic() + 20.0
    while any(t.name == "task-signature" for t in threading.enumerate()) and time.monotonic() < end:
        time.sleep(0.1)  # until the late signature came
    assert "Exception in thread" not in capsys.readouterr().err


async def test_a_signature_given_up_on_is_known_unreturned_until_it_returns() -> None:
    run = SignatureRun()
    assert run.unreturned_s() is None  # not begun
    await signature_within(Task.from_source("late", LATE), wait_s=0.2, run=run)
    stuck = run.unreturned_s()
    assert stuck is not None
    assert stuck >= 0.2
    assert await asyncio.to_thread(run.returned.wait, 20.0)
    assert run.unreturned_s() is None
    quick = SignatureRun()
    await signature_within(Task.from_source("prints", PRINTS), wait_s=10.0, run=quick)
    assert quick.unreturned_s() is None


async def test_a_task_that_exits_at_import_gets_no_signature_and_no_error() -> None:
    task = Task.from_source("exits", "import sys\nsys.exit(3)\n")
    t0 = time.monotonic()
    described = await signature_within(task, wait_s=10.0)
    assert time.monotonic() - t0 < 5.0  # answered, not waited out
    assert described.signature is None


def test_what_the_task_prints_while_described_is_not_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    signature_of(PRINTS)
    assert "from the task" not in capsys.readouterr().out


SPINS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        while True:
            pass

def get_inputs():
    return [torch.rand(4)]

def get_init_inputs():
    return []
"""


async def test_a_description_spinning_at_the_runs_end_is_stopped_and_stays_unreturned() -> None:
    # a forward spinning in Python holds the GIL against the run's end while its thread lives
    run = SignatureRun()
    await signature_within(Task.from_source("spins", SPINS), wait_s=0.3, run=run)
    assert run.thread is not None
    assert run.thread.is_alive()
    run.stop()
    frozen = run.unreturned_s()
    assert frozen is not None
    assert frozen >= 0.3
    run.thread.join(10.0)
    assert not run.thread.is_alive()
    assert run.unreturned_s() == frozen  # stopped, not returned: still a forward that never returned
    assert not run.returned.is_set()
