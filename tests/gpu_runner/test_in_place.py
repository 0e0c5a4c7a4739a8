"""The large-task path of a candidate's process, forced on small tasks with ``in_place_bytes=0``:
inputs used in place and checked by checksums, outputs fingerprinted at return instead of copied.
The runtime checks must still catch what they catch with copies (the gate records, not enforces)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_runner.service import EvaluationService
from schemas import CheatRule, DeviceChoice, EvalStatus
from tests.gpu_runner.conftest import fast_config, job

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def in_place(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EvaluationService]:
    tmp: Path = tmp_path_factory.mktemp("in_place")
    cfg = fast_config(DeviceChoice.CPU, tmp, enforce_gate=False, spares=1, in_place_bytes=0)
    async with EvaluationService(cfg) as service:
        yield service


@pytest.mark.parametrize(
    ("candidate", "status", "rule"),
    [
        ("honest_add_relu", EvalStatus.CORRECT, None),
        ("input_mutation", EvalStatus.REJECTED, CheatRule.INPUT_MUTATED),
        ("return_input", EvalStatus.REJECTED, CheatRule.OUTPUT_ALIASES_INPUT),
        ("stale_memory", EvalStatus.INCORRECT, None),
        ("partial_output", EvalStatus.INCORRECT, None),
    ],
)
async def test_in_place_checks_judge_like_the_copies(
    in_place: EvaluationService, candidate: str, status: EvalStatus, rule: CheatRule | None
) -> None:
    result = await in_place.evaluate(job("add_relu", candidate))
    assert result.status is status, result.summary
    if rule is not None:
        assert rule in {f.rule for f in result.findings}, result.findings
