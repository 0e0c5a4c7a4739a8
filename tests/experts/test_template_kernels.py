"""Every template against PyTorch, on the CPU under the Triton interpreter.

All references of ``template_cases`` at each of their sizes (non-powers of two included), each
rendered with the default parameters, a "stress" configuration (smallest tiles, multi-pass rows,
the least fusion the plan allows), two seeded random mutants and, at the first size, 64-bit
indexing. The checks run in two child processes with ``TRITON_INTERPRET=1`` (started once for
the module, in parallel); each verdict requires identical parameters under the same seed,
outputs within 1e-4, unchanged inputs, and an error against float64 no worse than 8x eager's.
The default run checks every case at its first size and one case of each kind of kernel at its
second too (:data:`_BOTH_SIZES_BY_DEFAULT`); the slow run checks the other cases' second sizes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, render
from actors.experts.template import emit as emit_module
from actors.experts.template.interp_check import Verdict, finish_check, start_check
from actors.experts.template.ir import NodeKind
from tests.experts.template_cases import CASES, Case

pytestmark = pytest.mark.timeout(300)

_STRESS = {
    "pw_warps": 1,
    "pw_ept": 1,
    "row_block_m": 2,
    "row_block_r": 64,
    "row_block_i": 8,
    "row_one_pass": False,
    "row_stages": 2,
    "mm_block_m": 16,
    "mm_block_n": 16,
    "mm_block_k": 16,
    "mm_warps": 1,
    "mm_group_m": 2,
}


def _plan(source: str) -> Plan:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return plan


def _variants(plan: Plan, size_index: int) -> list[tuple[str, TemplateParams]]:
    default = default_params(plan)
    epilogue, prologue = plan.fusions[-1]
    stress = TemplateParams.from_dict({**_STRESS, "fuse_epilogue": epilogue, "fuse_prologue": prologue})
    rng = np.random.default_rng(1000 + size_index)
    first = mutate(plan, default, rng, diagnosis=None)
    second = mutate(plan, first, rng, diagnosis=None)
    return [("default", default), ("stress", stress), ("mutant1", first), ("mutant2", second)]


_BOTH_SIZES_BY_DEFAULT = frozenset(
    {"act_relu_gelu_swish", "softmax_scale", "reduce_middle", "linear_relu", "bmm_scale_softmax"}
)
"""The cases the default run checks at their second size too: one of each kind of kernel (an
elementwise one, a row reduction over the last dimension, whose 100 columns take two of the stress
configuration's 64-wide passes, one over a middle dimension, a product, and a product whose rows
are then normalised), each cheap under the interpreter. The other cases' second sizes are checked
in the slow run, about 60% of the module's interpreter time."""


def _by_default(case: str, size: int) -> bool:
    """Whether the default run checks the case at that size (:data:`_BOTH_SIZES_BY_DEFAULT`)."""
    return size == 0 or case in _BOTH_SIZES_BY_DEFAULT


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the default run checks."""
    return _check(tmp_path_factory.mktemp("interp"), by_default=True)


@pytest.fixture(scope="module")
def slow_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every candidate the slow run checks."""
    return _check(tmp_path_factory.mktemp("interp-slow"), by_default=False)


def _check(workdir: Path, by_default: bool) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate of the
    default run's share (``by_default``, the quickstart's too) or of the slow run's."""
    jobs: list[dict[str, object]] = []
    labels: list[tuple[str, str]] = []
    for case in CASES:
        for i, source in enumerate(case.sources()):
            if _by_default(case.name, i) != by_default:
                continue
            plan = _plan(source)
            for label, params in _variants(plan, i):
                jobs.append(
                    {"reference": source, "candidate": render(plan, params), "seeds": [11], "atol": 1e-4, "rtol": 1e-4}
                )
                labels.append((case.name, f"size{i}/{label}"))
            if i == 0:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(emit_module, "INT32_LIMIT", 0)
                    wide = render(plan, default_params(plan))
                assert ".to(tl.int64)" in wide
                jobs.append({"reference": source, "candidate": wide, "seeds": [12], "atol": 1e-4, "rtol": 1e-4})
                labels.append((case.name, "size0/int64-indexing"))
    if by_default:
        quickstart = (Path(__file__).resolve().parents[2] / "examples" / "quickstart.py").read_text()
        plan = _plan(quickstart)
        for label, params in _variants(plan, 0)[:2]:
            jobs.append(
                {"reference": quickstart, "candidate": render(plan, params), "seeds": [13], "atol": 1e-4, "rtol": 1e-4}
            )
            labels.append(("quickstart", label))
    half = len(jobs) // 2
    procs = [start_check(jobs[:half], workdir), start_check(jobs[half:], workdir)]
    results = [v for proc in procs for v in finish_check(proc, timeout=280)]
    by_case: dict[str, list[tuple[str, Verdict]]] = defaultdict(list)
    for (name, label), verdict in zip(labels, results, strict=True):
        by_case[name].append((label, verdict))
    return dict(by_case)


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_rendered_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    sizes = [i for i in range(len(_case(case).sizes)) if _by_default(case, i)]
    _assert_all_correct(verdicts[case], sizes)
    assert "size0/int64-indexing" in {label for label, _ in verdicts[case]}


@pytest.mark.slow  # the other cases' second sizes: ~60% of the interpreter time (default run: 29 -> 11 s)
@pytest.mark.parametrize(
    "case", [c.name for c in CASES if any(not _by_default(c.name, i) for i in range(len(c.sizes)))]
)
def test_rendered_kernels_match_pytorch_under_the_interpreter_at_their_other_sizes(
    case: str, slow_verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    _assert_all_correct(slow_verdicts[case], [i for i in range(len(_case(case).sizes)) if not _by_default(case, i)])


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def _assert_all_correct(results: list[tuple[str, Verdict]], sizes: list[int]) -> None:
    """Every variant at each of ``sizes`` was checked and passed, with an error against float64
    no worse than 8x eager's."""
    assert sizes
    wanted = {f"size{i}/{label}" for i in sizes for label in ("default", "stress", "mutant1", "mutant2")}
    assert wanted <= {label for label, _ in results}
    failures = [(label, v.detail) for label, v in results if not v.ok]
    assert not failures
    for label, v in results:
        if v.err_vs_fp64 is not None and v.ref_err_vs_fp64 is not None:
            bound = max(8 * v.ref_err_vs_fp64, 1e-6)
            assert v.err_vs_fp64 <= bound, (label, v.err_vs_fp64, v.ref_err_vs_fp64)


def test_quickstart_renders_correct_kernels(verdicts: dict[str, list[tuple[str, Verdict]]]) -> None:
    assert [(label, v.detail) for label, v in verdicts["quickstart"]] == [("default", "ok"), ("stress", "ok")]


def test_the_default_run_checks_both_sizes_of_each_kind_of_kernel() -> None:
    """The cases the default run checks at both sizes are cases with two, and among them are
    elementwise, row and product kernels."""
    by_name = {case.name: case for case in CASES}
    assert set(by_name) >= _BOTH_SIZES_BY_DEFAULT
    kinds = {kind for name in _BOTH_SIZES_BY_DEFAULT for kind in _plan(by_name[name].sources()[1]).template.split("+")}
    assert kinds == {"pw", "row", "mm"}
    assert all(len(by_name[name].sizes) > 1 for name in _BOTH_SIZES_BY_DEFAULT)


def test_cases_cover_the_issue_op_list() -> None:
    ew: set[str] = set()
    reductions: set[str] = set()
    canon: set[str] = set()
    kinds: set[str] = set()
    for case in CASES:
        plan = _plan(case.sources()[0])
        canon.update(plan.ops)
        kinds.update(plan.template.split("+"))
        for node in plan.nodes:
            if node.kind is NodeKind.EW:
                ew.add(node.op)
            elif node.kind is NodeKind.RED:
                reductions.add(node.op)
    activations = {"relu", "leaky_relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "mish", "softplus"}
    activations |= {"hardtanh", "hardswish", "hardsigmoid", "elu", "selu", "clamp_min", "clamp_max"}
    assert activations | {"add", "mul", "div", "sub"} <= ew
    assert {"sum", "prod", "amax", "amin", "argmax", "argmin"} <= reductions
    norms = {"softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "mean", "logsumexp"}
    assert norms | {"max", "min", "linear", "matmul"} <= canon
    assert kinds == {"pw", "row", "mm"}


def test_interpreter_check_rejects_a_wrong_kernel(tmp_path: Path) -> None:
    source = next(c for c in CASES if c.name == "softmax_scale").sources()[0]
    plan = _plan(source)
    good = render(plan, default_params(plan))
    bad = good.replace("* 3.0", "* 3.001")
    assert bad != good
    proc = start_check(
        [
            {"reference": source, "candidate": good, "seeds": [3], "atol": 1e-4, "rtol": 1e-4},
            {"reference": source, "candidate": bad, "seeds": [3], "atol": 1e-4, "rtol": 1e-4},
        ],
        tmp_path,
    )
    ok, wrong = finish_check(proc, timeout=120)
    assert ok.ok
    assert not wrong.ok
    assert "mismatch" in wrong.detail


@pytest.mark.parametrize(("op", "layout"), [("log_softmax", "last"), ("softmax", "last"), ("softmax", "inner")])
def test_a_multi_pass_softmax_reads_its_row_twice(op: str, layout: str) -> None:
    """The maximum and the sum of exponentials come from one read of the row (online), the output
    from a second: KernelBench L1-24's log_softmax over rows of 393216 read them three times."""
    dim, shape = (1, "(4096, 393216)") if layout == "last" else (1, "(8, 4096, 96)")
    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        f"        return torch.{op}(x, dim={dim})\n\n\ndef get_inputs():\n    return [torch.rand{shape}]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    params = default_params(plan).with_changes(row_one_pass=False)
    text = render(plan, params)
    assert text.count("for r0 in range(") == 2, text
    assert text.count("tl.load(p0 + ") == 2, text


@pytest.mark.parametrize(
    ("body", "hints"),
    [
        # statistics, then the output: the first read keeps the row in L2, the last lets it go
        ("return x / torch.norm(x, p=2, dim=1, keepdim=True) * w", ["evict_last", "evict_first"]),
        # one loop: nothing to keep
        ("return torch.sum(x * w, dim=1)", []),
    ],
)
def test_a_multi_pass_row_kernel_keeps_its_rows_in_l2_until_their_last_read(body: str, hints: list[str]) -> None:
    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x, w):\n"
        f"        {body}\n\n\ndef get_inputs():\n    return [torch.rand(32768, 65535), torch.rand(65535)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    text = render(plan, default_params(plan).with_changes(row_one_pass=False))
    assert re.findall(r"tl\.load\(p0 \+ [^\n]*eviction_policy='(\w+)'", text) == hints, text
    assert all("eviction_policy" not in line for line in text.splitlines() if "tl.load(p1 + " in line)


def test_a_product_with_a_diagonal_matrix_is_a_broadcast_product() -> None:
    """``diag(v) @ b`` scales b's rows (``b @ diag(v)`` its columns): no product node, no N x N
    matrix; ``diag`` read any other way declines with a reason."""
    cases = next(c for c in CASES if c.name == "diag_products")
    plan = analyse(cases.sources()[0])
    assert isinstance(plan, Plan), plan
    assert not any(n.kind is NodeKind.MM for n in plan.nodes)
    assert max(n.numel for n in plan.nodes) == 33 * 47
    for body, why in (
        ("torch.diag(a) + b", "torch.diag as an operand of add"),
        ("torch.diag(b) @ b", "vector on the main diagonal"),
        ("torch.diag(a) @ torch.diag(a)", "two torch.diag"),
    ):
        source = (
            "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, a, b):\n"
            f"        return {body}\n\n\ndef get_inputs():\n    return [torch.randn(8), torch.randn(8, 8)]\n\n\n"
            "def get_init_inputs():\n    return []\n"
        )
        declined = analyse(source)
        assert not isinstance(declined, Plan), body
        assert why in declined.detail, (body, declined)
