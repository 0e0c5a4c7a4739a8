"""Models that return several tensors (a tuple or a list, nested or not): the template renders every
one, fused where the schedule allows, and returns them nested as the reference does, each tuple a
tuple and each list a list; each is checked under the interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.experts.template import analyse, default_params, render
from actors.experts.template.interp_check import finish_check, start_check
from actors.experts.template.ir import Plan, Unsupported, plan_from_dict, plan_to_dict

pytestmark = pytest.mark.timeout(300)

HEAD = "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
TAIL = "\n\ndef get_inputs():\n    return [torch.randn(64, 96)]\n\n\ndef get_init_inputs():\n    return []\n"

TWO = HEAD + "        return torch.relu(x), x * 2.0\n" + TAIL
"""Two elementwise outputs of one input: one kernel writes both."""
ROW_AND_ELEMENTS = HEAD + "        y = torch.softmax(x, dim=-1)\n        return [y, y.sum(dim=-1) * 3.0]\n" + TAIL
"""A list: a row softmax and a reduction of it (the softmax is both an output and an operand)."""
VIEWS = HEAD + "        y = torch.relu(x)\n        return y, y.view(-1)\n" + TAIL
"""Two views of one tensor: outputs that share memory, which the evaluator refuses."""


NESTED = {
    "tuple_in_tuple": ("        return x.relu(), (x * 2.0, x.sum(1))\n", ("tuple", 0, ("tuple", 1, 2))),
    "lstm_like": (
        "        h = torch.tanh(x)\n        c = torch.sigmoid(x) * 2.0\n        return h * c, (h, c)\n",
        ("tuple", 0, ("tuple", 1, 2)),
    ),
    "one_tuple": ("        return (x.relu(),)\n", ("tuple", 0)),
    "lists": ("        return [x.relu(), [x * 2.0]]\n", ("list", 0, ("list", 1))),
}
"""Nested outputs (an ``nn.LSTM``'s ``(output, (h, c))`` made of elementwise ops), a tuple of one
tensor and nested lists, with the nesting the plan must record."""


def test_several_outputs_render_as_the_references_tuple_or_list_and_match_pytorch(tmp_path: Path) -> None:
    jobs = []
    for source, count, opening in ((TWO, 2, "return (_b"), (ROW_AND_ELEMENTS, 2, "return [_b")):
        plan = analyse(source)
        assert isinstance(plan, Plan), plan
        assert len(plan.outputs) == count
        candidate = render(plan, default_params(plan))
        assert opening in candidate
        jobs.append({"reference": source, "candidate": candidate, "seeds": [3, 4], "atol": 1e-4, "rtol": 1e-4})
    plan = analyse(TWO)
    assert isinstance(plan, Plan)
    assert render(plan, default_params(plan)).count("(_kfs, ") == 1  # one launch writes both outputs
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert [v.ok for v in verdicts] == [True, True], verdicts


@pytest.mark.slow  # ~2 s on a 2-core host; the default run keeps the flat tuple and list above
def test_nested_outputs_render_nested_as_the_reference_and_match_pytorch(tmp_path: Path) -> None:
    jobs = []
    for name, (body, returns) in NESTED.items():
        source = HEAD + body + TAIL
        plan = analyse(source)
        assert isinstance(plan, Plan), (name, plan)
        assert plan.returns == returns, name
        assert plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))) == plan  # as the analysis child sends it
        jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [7],
                     "atol": 1e-4, "rtol": 1e-4})  # fmt: skip
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert [v.ok for v in verdicts] == [True] * len(jobs), (list(NESTED), verdicts)


def test_outputs_that_share_memory_are_declined() -> None:
    found = analyse(VIEWS)
    assert isinstance(found, Unsupported)
    assert "two views of one tensor" in found.detail


IN_PLACE = {
    "input_then_read": "        x.mul_(2.0)\n        return x + 1.0\n",
    "input_returned": "        x.relu_()\n        return x\n",
    "function_on_input": "        torch.relu_(x)\n        return x\n",
    "augmented_alias": "        y = x * 3.0\n        z = y\n        y += x\n        return z * 2.0\n",
    "read_before_and_after": "        y = x * 2.0\n        x.sub_(1.0)\n        return y + x\n",
    "inplace_positional": "        F.relu(x, True)\n        return x * 2.0\n",
}
"""Models that write a tensor in place and read it afterwards (the reference's own input too):
the template computes each in-place op as its result, which every later read sees."""


def test_in_place_ops_are_computed_as_their_results(tmp_path: Path) -> None:
    jobs = []
    head = HEAD.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n")
    for name, body in IN_PLACE.items():
        source = head + body + TAIL
        plan = analyse(source)
        assert isinstance(plan, Plan), (name, plan)
        jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [5],
                     "atol": 1e-4, "rtol": 1e-4})  # fmt: skip
    module = HEAD.replace("    def forward(self, x):\n", "    def __init__(self):\n        super().__init__()\n"
                          "        self.act = nn.ReLU(inplace=True)\n\n    def forward(self, x):\n")  # fmt: skip
    source = module + "        z = self.act(x)\n        return x + z\n" + TAIL
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [6],
                 "atol": 1e-4, "rtol": 1e-4})  # fmt: skip
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=280)
    assert [v.ok for v in verdicts] == [True] * len(jobs), ([*IN_PLACE, "module"], verdicts)


def test_in_place_ops_on_state_or_views_are_declined_with_the_reason() -> None:
    buffer = HEAD.replace(
        "    def forward(self, x):\n",
        "    def __init__(self):\n        super().__init__()\n        self.register_buffer('b', torch.ones(96))\n\n"
        "    def forward(self, x):\n",
    )
    cases = {
        buffer + "        self.b.add_(1.0)\n        return x + self.b\n" + TAIL: "on a parameter or buffer",
        HEAD + "        v = x.view(-1)\n        v.mul_(2.0)\n        return x + 1.0\n" + TAIL: "on a view",
        HEAD + "        v = x.view(-1)\n        x.mul_(2.0)\n        return v + 1.0\n" + TAIL: "a view was taken of",
    }
    for source, reason in cases.items():
        found = analyse(source)
        assert isinstance(found, Unsupported), source
        assert reason in found.detail, (reason, found.detail)
    found = analyse(HEAD + "        return x.view(-1)\n" + TAIL)
    assert isinstance(found, Unsupported)
    assert "returns an input or parameter without computing on it" in found.detail
