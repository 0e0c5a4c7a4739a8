"""The static gate on its own: rules with line numbers, alias resolution, honest code left alone."""

from __future__ import annotations

import pytest

from gpu_runner.gate import check_candidate
from schemas import CheatRule, Severity
from tests.gpu_runner.conftest import candidate, reference

R = CheatRule
REF = reference("add_relu")

STATIC = [
    ("torch_op_instead", R.TORCH_COMPUTE),
    ("decoy_kernel", R.TORCH_COMPUTE),
    ("try_fallback", R.TORCH_FALLBACK),
    ("sys_modules_reference", R.INTROSPECTION),
    ("gc_reference", R.INTROSPECTION),
    ("thread_deferred", R.THREADS),
    ("tensor_subclass", R.TENSOR_SUBCLASS),
    ("patch_timer", R.TIMER_TAMPERING),
    ("patch_checker", R.MONKEYPATCH),
    ("redefined_inputs", R.REDEFINED_INPUTS),
    ("guessed_seeds", R.RNG_TAMPERING),
    ("torch_compile_inside", R.TORCH_COMPILE),
    ("exec_hidden", R.DYNAMIC_CODE),
    ("env_secret", R.ENVIRONMENT),
    ("segfault", R.CTYPES),
    ("spawn_children", R.PROCESSES),
    ("global_precision_flags", R.PRECISION_FLAGS),
    ("side_stream", R.DEFERRED_WORK),
    ("missing_model", R.MISSING_MODEL),
    ("dynamic_getattr", R.DYNAMIC_CODE),
    ("network_exfil", R.NETWORK),
]


@pytest.mark.parametrize(("name", "rule"), STATIC, ids=[s[0] for s in STATIC])
def test_gate_rejects_cheat_with_rule_and_line(name: str, rule: CheatRule) -> None:
    report = check_candidate(candidate(name), REF)
    hits = [f for f in report.findings if f.rule is rule and f.severity is Severity.REJECT]
    assert report.rejected
    assert hits, [f"{f.rule.value}@{f.line}" for f in report.findings]
    if rule is not R.MISSING_MODEL:
        assert all(f.line is not None and f.line >= 1 for f in hits)


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("honest_add_relu", "add_relu"),
        ("honest_helper_copy", "add_relu"),
        ("honest_linear_relu", "linear_relu"),
        ("honest_cpp_add_relu", "add_relu"),
        ("honest_cuda_add_relu", "add_relu"),
    ],
)
def test_gate_accepts_honest_candidates(name: str, ref: str) -> None:
    report = check_candidate(candidate(name), reference(ref))
    assert not report.rejected, [f"{f.rule.value}@{f.line}: {f.message}" for f in report.findings]


def test_gate_learns_kernel_names() -> None:
    triton = check_candidate(candidate("honest_add_relu"), REF)
    cuda = check_candidate(candidate("honest_cuda_add_relu"), REF)
    assert triton.triton_kernels == ("add_relu_kernel",)
    assert cuda.cuda_kernels == ("add_relu_kernel",)
    assert cuda.uses_load_inline


def test_gate_treats_identical_copies_of_reference_names_as_info() -> None:
    report = check_candidate(candidate("honest_helper_copy"), REF)
    infos = [f for f in report.findings if f.rule is R.REDEFINED_INPUTS]
    assert len(infos) == 3
    assert all(f.severity is Severity.INFO for f in infos)


def _rules(source: str) -> set[CheatRule]:
    return {f.rule for f in check_candidate(source, REF).findings if f.severity is Severity.REJECT}


def test_gate_resolves_aliases_and_constant_getattr() -> None:
    head = "import torch\nimport torch.nn.functional as Fn\nfrom torch import nn as N\nclass ModelNew(N.Module):\n"
    assert R.TORCH_COMPUTE in _rules(head + "    def forward(self, x):\n        return Fn.gelu(x)\n")
    assert R.TORCH_COMPUTE in _rules(head + "    def forward(self, x):\n        return getattr(torch, 'tanh')(x)\n")
    assert R.TORCH_COMPUTE in _rules(head + "    def forward(self, x, w):\n        return x @ w\n")


def test_gate_flags_torch_submodule_called_in_forward_but_not_its_weights() -> None:
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        w = self.lin.weight\n        return self.lin(x)\n"
    )
    findings = [f for f in check_candidate(src, REF).findings if f.rule is R.TORCH_COMPUTE]
    assert [f.line for f in findings] == [9]


def test_gate_scans_native_sources_for_torch_ops_and_threads() -> None:
    src = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
        'CPP = """\n#include <torch/extension.h>\n#include <thread>\n'
        "torch::Tensor f(torch::Tensor x) { return torch::matmul(x, x); }\n"
        '"""\n'
        "ext = load_inline(name='e', cpp_sources=CPP, functions=['f'])\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n"
    )
    findings = check_candidate(src, REF).findings
    compute = [f for f in findings if f.rule is R.TORCH_COMPUTE]
    threads = [f for f in findings if f.rule is R.THREADS]
    assert compute
    assert compute[0].line == 7
    assert threads
    assert threads[0].line == 6


def test_gate_reports_syntax_errors_without_findings() -> None:
    report = check_candidate("def broken(:\n", REF)
    assert report.syntax_error is not None
    assert report.findings == ()


def test_gate_allows_allocation_and_metadata_in_forward() -> None:
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        out = torch.empty((x.shape[0], 4), device=x.device, dtype=x.dtype)\n"
        "        acc = torch.zeros_like(out)\n        v = x.contiguous().view(-1).reshape(2, -1).permute(1, 0)\n"
        "        return out\n"
    )
    assert _rules(src) == set()
