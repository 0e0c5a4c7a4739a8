"""Valid but unusual references the template expert renders: conversions between float32, float16
and bfloat16 inside forward (``.half()``, ``.to(torch.bfloat16)``, ``.float()``: a half conversion
rounds, later ops compute on the rounded value), a Python int among the inputs (a scalar operand,
as a Python float is), and forward arguments that get_inputs() leaves to their defaults; each
checked against the reference under ``TRITON_INTERPRET=1``, with the reference's output types."""

from __future__ import annotations

from pathlib import Path

from actors.experts.template import Plan, analyse, default_params, render
from actors.experts.template.interp_check import finish_check, start_check

HEAD = "import torch\nimport torch.nn as nn\n\n"
TAIL = "\ndef get_init_inputs():\n    return []\n"

CASES = {
    "to_half_at_the_end": (
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x).half()\n\n"
        "def get_inputs():\n    return [torch.randn(33, 70)]\n",
        "float16",
    ),
    "to_bfloat16_then_math": (
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.sigmoid(x.to(torch.bfloat16)) * 3\n\n"
        "def get_inputs():\n    return [torch.randn(33, 70)]\n",
        "bfloat16",
    ),
    "half_input_to_float": (
        "class Model(nn.Module):\n    def forward(self, x):\n        return x.float() * 0.1 + 1\n\n"
        "def get_inputs():\n    return [torch.randn(33, 70, dtype=torch.float16)]\n",
        "float32",
    ),
    "python_int_input": (
        "class Model(nn.Module):\n    def forward(self, x, k):\n        return torch.relu(x) * k + 1\n\n"
        "def get_inputs():\n    return [torch.randn(33, 70), 3]\n",
        "float32",
    ),
    "defaulted_argument": (
        "class Model(nn.Module):\n    def forward(self, x, alpha=0.25, shift=None):\n"
        "        y = torch.relu(x) * alpha\n        return y if shift is None else y + shift\n\n"
        "def get_inputs():\n    return [torch.randn(33, 70)]\n",
        "float32",
    ),
}


def test_unusual_references_render_and_match_under_the_interpreter(tmp_path: Path) -> None:
    jobs = []
    for name, (body, dtype) in CASES.items():
        source = HEAD + body + TAIL
        plan = analyse(source)
        assert isinstance(plan, Plan), (name, plan)
        assert plan.nodes[plan.output].dtype == dtype, name
        tol = 2e-2 if dtype == "bfloat16" else 1e-2 if dtype == "float16" else 1e-5
        jobs.append({"reference": source, "candidate": render(plan, default_params(plan)), "seeds": [2],
                     "atol": tol, "rtol": tol})  # fmt: skip
    verdicts = finish_check(start_check(jobs, tmp_path), timeout=600)
    for name, verdict in zip(CASES, verdicts, strict=True):
        assert verdict.ok, (name, verdict.detail)


def test_a_conversion_to_float64_is_declined_with_its_reason() -> None:
    source = HEAD + "class Model(nn.Module):\n    def forward(self, x):\n        return x.double() * 2\n\n"
    source += "def get_inputs():\n    return [torch.randn(4, 8)]\n" + TAIL
    got = analyse(source)
    assert not isinstance(got, Plan)
    assert "double" in str(got) or "float64" in str(got)
