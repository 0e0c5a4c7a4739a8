"""The evaluator's check of a task before any candidate (on the CPU): a reference that never
returns is refused within the bound, naming the line it was stuck on; one whose outputs cannot be
compared (complex), whose ``get_init_inputs`` returns no list or that calls ``sys.exit`` is refused
naming that; one that returns a nested tuple of tensors (an ``nn.LSTM``'s ``(output, (h, c))``)
is judged (the template expert's candidate for it too), and a candidate that returns its tensors
nested otherwise is incorrect."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from actors.experts.template import analyse, default_params, render
from actors.experts.template.ir import Plan
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.errors import InvalidReference
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus, KernelLanguage

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

HEAD = "import torch\nimport torch.nn as nn\n\n\n"
INPUTS = "def get_inputs():\n    return [torch.randn(16, 16)]\n\n\n"
NO_INIT = "def get_init_inputs():\n    return []\n"


def _model(body: str) -> str:
    return f"class Model(nn.Module):\n    def forward(self, x):\n{body}\n\n"


NEVER_RETURNS = HEAD + _model("        while True:\n            pass\n") + INPUTS + NO_INIT
COMPLEX = (
    HEAD
    + _model("        return x * x\n")
    + "def get_inputs():\n    return [torch.randn(16, 16, dtype=torch.complex64)]\n\n\n"
    + NO_INIT
)
INIT_NOT_A_LIST = HEAD + _model("        return torch.relu(x)\n") + INPUTS + "def get_init_inputs():\n    return 5\n"
EXITS = "import sys\n" + HEAD + "sys.exit(3)\n\n\n" + _model("        return x\n") + INPUTS + NO_INIT
NESTED = HEAD + _model("        return torch.relu(x), (torch.relu(x) * 2.0,)\n") + INPUTS + NO_INIT
NESTED_CANDIDATE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_twice(x_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0)
    tl.store(a_ptr + offs, y, mask=mask)
    tl.store(b_ptr + offs, y * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        a, b = torch.empty_like(x), torch.empty_like(x)
        relu_twice[(triton.cdiv(x.numel(), 256),)](x, a, b, x.numel(), BLOCK=256)
        return a, (b,)
"""
FLAT_CANDIDATE = NESTED_CANDIDATE.replace("return a, (b,)", "return a, b")


FIRST_RUN_S = 8.0
"""The module's bound on a reference's first load and run: short, so the never-returning reference
is refused in seconds, yet above what an ordinary reference's first load takes on a loaded 2-core
host (at 2 s the complex-output reference was refused as never returning during a local CI run)."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[EvaluationService]:
    cfg = RunnerConfig(
        device=DeviceChoice.CPU, spares=1, compile_workers=1, timing_budget_s=0.3, reference_first_run_s=FIRST_RUN_S
    )
    async with EvaluationService(cfg) as started:
        yield started


async def _refusal(service: EvaluationService, source: str) -> str:
    with pytest.raises(InvalidReference) as caught:
        await service.prepare(source)
    return caught.value.one_line()


async def test_a_reference_that_never_returns_is_refused_with_the_line_it_is_stuck_on(
    service: EvaluationService,
) -> None:
    t0 = time.monotonic()
    said = await _refusal(service, NEVER_RETURNS)
    assert time.monotonic() - t0 < 60  # the module's bound, not the worker's start-up bound (180 s)
    assert f"did not finish its first load and run within {FIRST_RUN_S:g} s" in said, said
    assert re.search(r"\(task file line [78], in forward\)$", said), said  # `while True:` or `pass`


async def test_a_reference_with_complex_outputs_is_refused_by_the_task_check(service: EvaluationService) -> None:
    said = await _refusal(service, COMPLEX)
    assert "Model.forward returns a torch.complex64 tensor (output 0), which cannot be compared" in said, said


async def test_get_init_inputs_returning_no_list_is_refused_naming_it(service: EvaluationService) -> None:
    assert await _refusal(service, INIT_NOT_A_LIST) == "get_init_inputs() returned int, not a list"


async def test_a_reference_that_calls_sys_exit_is_refused_naming_the_call(service: EvaluationService) -> None:
    said = await _refusal(service, EXITS)
    assert said == "the reference called sys.exit(3) (task file line 6, in <module>)", said


def _job(candidate: str, name: str) -> EvalJob:
    return EvalJob(
        reference_source=NESTED,
        candidate_source=candidate,
        language=KernelLanguage.TRITON,
        timeout_s=120.0,
        candidate_id=name,
    )


async def test_a_reference_returning_a_nested_tuple_of_tensors_is_judged(service: EvaluationService) -> None:
    result = await service.evaluate(_job(NESTED_CANDIDATE, "nested"))
    assert result.status is EvalStatus.CORRECT, result.summary


async def test_the_template_experts_candidate_for_a_nested_reference_is_judged_correct(
    service: EvaluationService,
) -> None:
    plan = analyse(NESTED)
    assert isinstance(plan, Plan), plan
    result = await service.evaluate(_job(render(plan, default_params(plan)), "template"))
    assert result.status is EvalStatus.CORRECT, result.summary


async def test_a_candidate_nested_otherwise_than_the_reference_is_incorrect_naming_both(
    service: EvaluationService,
) -> None:
    result = await service.evaluate(_job(FLAT_CANDIDATE, "flat"))  # the same tensors, flattened
    said = "output structure differs: the reference returns (tensor, (tensor,)), the candidate (tensor, tensor)"
    assert result.status is EvalStatus.INCORRECT, result.summary
    assert result.summary == f"incorrect: {said}"
    assert result.correctness is not None
    assert result.correctness.detail == said
