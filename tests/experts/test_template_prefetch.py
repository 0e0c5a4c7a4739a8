"""The template expert's analysis in one child for the whole reference and its fallback, started
ahead by ``kfoundry run`` (``analysis_child.prefetch``) and taken by the expert's first request;
a plan kept on disk makes the analysis started ahead unnecessary (it is cancelled, its child gone)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import psutil
import pytest
from structlog.testing import capture_logs

from actors.experts import analysis_child
from actors.experts.template.expert import TemplateExpert
from actors.experts.template.ir import KeepTorch, Plan, Unsupported
from actors.experts.template.isolate import analyses_in_child
from actors.experts.template.plan_store import PlanStore
from schemas import GenerateRequest, Task

pytestmark = pytest.mark.timeout(300)

# Sliding windows of an image cut by ``unfold`` (step 1: they overlap), which the templates do not
# cover: the whole reference is declined and the fallback keeps it as an as_strided view.
PATCHES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, patch):
        super().__init__()
        self.patch = patch

    def forward(self, x):
        p = self.patch
        windows = torch.relu(x).unfold(2, p, 1).unfold(3, p, 1)
        return windows.reshape(x.shape[0], x.shape[1], -1, p * p).mean(-1) * 2.0


def get_inputs():
    return [torch.randn(2, 6, 4, 6)]


def get_init_inputs():
    return [2]
"""

WHOLE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 3.0


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
"""


def _isolate_children(zombies: bool = False) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                if zombies:
                    found.append(proc)
            elif "actors.experts.template.isolate" in proc.cmdline():
                found.append(proc)
    return found


def _request(source: str, name: str) -> GenerateRequest:
    return GenerateRequest(run_id="r1", island="i0", task=Task.from_source(name, source), n=2, seed=3)


def test_one_child_answers_for_the_whole_reference_and_for_its_fallback() -> None:
    found = asyncio.run(analyses_in_child(PATCHES, keep_torch=KeepTorch.LAYOUT, confine=False))
    assert set(found) == {KeepTorch.NONE, KeepTorch.LAYOUT}
    whole, kept = found[KeepTorch.NONE], found[KeepTorch.LAYOUT]
    assert isinstance(whole, Unsupported)
    assert "unfold" in whole.detail
    assert isinstance(kept, Plan)
    # covered whole: no fallback analysed
    only = asyncio.run(analyses_in_child(WHOLE, keep_torch=KeepTorch.LAYOUT, confine=False))
    assert set(only) == {KeepTorch.NONE}
    assert isinstance(only[KeepTorch.NONE], Plan)


def test_the_expert_takes_the_analysis_started_ahead() -> None:
    async def scenario() -> tuple[TemplateExpert, list[MutableMapping[str, Any]]]:
        analysis_child.prefetch(PATCHES, KeepTorch.LAYOUT.value, False)
        expert = TemplateExpert()
        with capture_logs() as logs:
            reply = await expert.generate(_request(PATCHES, "patches"))
        assert reply.decline is None, reply.decline
        assert reply.proposals
        assert not analysis_child._PENDING  # taken
        return expert, logs

    expert, logs = asyncio.run(scenario())
    assert [e["event"] for e in logs if e["event"] == "analysis started ahead taken"] == [
        "analysis started ahead taken"
    ]
    assert expert.stats().plans_traced == 1


def test_a_kept_plan_cancels_the_analysis_started_ahead(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)

    async def first() -> None:
        expert = TemplateExpert(plan_store=store)
        reply = await expert.generate(_request(PATCHES, "patches"))
        assert reply.decline is None, reply.decline
        assert (expert.stats().plans_traced, expert.stats().plans_stored) == (1, 0)

    asyncio.run(first())
    # Only the fallback's plan is kept (the whole reference is not covered): a later expert reads it
    # without analysing the whole reference again, and the child started ahead is not needed.
    assert store.get(PATCHES, KeepTorch.NONE) is None
    assert isinstance(store.get(PATCHES, KeepTorch.LAYOUT), Plan)

    async def second() -> TemplateExpert:
        analysis_child.prefetch(PATCHES, KeepTorch.LAYOUT.value, False)
        await asyncio.sleep(0.5)  # its child started
        expert = TemplateExpert(plan_store=store)
        reply = await expert.generate(_request(PATCHES, "patches"))
        assert reply.decline is None, reply.decline
        assert not analysis_child._PENDING
        # The cancelled child was killed and reaped before the expert answered: its process object
        # knows it ended (else it warns when freed after the loop closed: CI of 6cc80d6).
        assert not _isolate_children(zombies=True)
        return expert

    expert = asyncio.run(second())
    assert (expert.stats().plans_traced, expert.stats().plans_stored) == (0, 1)
    assert not _isolate_children()


def test_analyses_started_ahead_and_never_taken_are_cancelled_with_their_children() -> None:
    async def scenario() -> None:
        analysis_child.prefetch(PATCHES, KeepTorch.LAYOUT.value, False)
        analysis_child.prefetch(PATCHES, KeepTorch.LAYOUT.value, False)  # the same analysis: one child
        assert len(analysis_child._PENDING) == 1
        for _ in range(100):
            if _isolate_children():
                break
            await asyncio.sleep(0.1)
        assert len(_isolate_children()) == 1
        await analysis_child.cancel_prefetches()
        assert not analysis_child._PENDING
        assert not _isolate_children()

    asyncio.run(scenario())
