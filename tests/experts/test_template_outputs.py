"""Models that return several tensors (a tuple or a list): the template renders every one, fused
where the schedule allows, and returns them as a tuple; each is checked under the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.experts.template import analyse, default_params, render
from actors.experts.template.interp_check import finish_check, start_check
from actors.experts.template.ir import Plan, Unsupported

pytestmark = pytest.mark.timeout(300)

HEAD = "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
TAIL = "\n\ndef get_inputs():\n    return [torch.randn(64, 96)]\n\n\ndef get_init_inputs():\n    return []\n"

TWO = HEAD + "        return torch.relu(x), x * 2.0\n" + TAIL
"""Two elementwise outputs of one input: one kernel writes both."""
ROW_AND_ELEMENTS = HEAD + "        y = torch.softmax(x, dim=-1)\n        return [y, y.sum(dim=-1) * 3.0]\n" + TAIL
"""A list: a row softmax and a reduction of it (the softmax is both an output and an operand)."""
VIEWS = HEAD + "        y = torch.relu(x)\n        return y, y.view(-1)\n" + TAIL
"""Two views of one tensor: outputs that share memory, which the evaluator refuses."""


def test_several_outputs_render_as_a_tuple_and_match_pytorch(tmp_path: Path) -> None:
    jobs = []
    for source, count in ((TWO, 2), (ROW_AND_ELEMENTS, 2)):
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        assert len(plan.outputs) == count
        candidate = render(plan, default_params(plan))
        assert "return (_b" in candidate
        jobs.append({"reference": source, "candidate": candidate, "seeds": [3, 4], "atol": 1e-4, "rtol": 1e-4})
    plan = analyse(TWO)
    assert isinstance(plan, Plan)
    assert render(plan, default_params(plan)).count("[(") == 1  # one launch writes both outputs
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert [v.ok for v in verdicts] == [True, True], verdicts


def test_outputs_that_share_memory_are_declined() -> None:
    found = analyse(VIEWS)
    assert isinstance(found, Unsupported)
    assert "two views of one tensor" in found.detail


def test_an_input_modified_in_place_and_returned_is_declined_as_in_place() -> None:
    """``x.relu_(); return x``: the statement's result is unused, but the decline names the
    in-place op, not "returns an input without computing on it"."""
    for body in ("        x.relu_()\n        return x\n", "        torch.relu_(x)\n        return x\n"):
        found = analyse(HEAD + body + TAIL)
        assert isinstance(found, Unsupported)
        assert "in-place op on an input" in found.detail
    found = analyse(HEAD + "        return x.view(-1)\n" + TAIL)
    assert isinstance(found, Unsupported)
    assert "returns an input or parameter without computing on it" in found.detail
