"""The convolution template against PyTorch, on the CPU under the Triton interpreter.

Every reference of ``template_conv_cases`` at each of its sizes, rendered with the default
parameters, a "stress" configuration (smallest tiles, the least fusion the plan allows), a
seeded mutant and, at the first size, 64-bit indexing. The checks run in two child processes
with ``TRITON_INTERPRET=1``; each verdict requires identical parameters under the same seed,
outputs within 1e-4, unchanged inputs, and an error against float64 no worse than 8x eager's.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, relevant_params, render
from actors.experts.template import emit as emit_module
from actors.experts.template.interp_check import Verdict, finish_check, start_check
from actors.experts.template.ir import ConvSpec, NodeKind
from tests.experts.template_conv_cases import CONV_CASES

pytestmark = pytest.mark.timeout(300)

_STRESS = {"conv_block_m": 16, "conv_block_n": 16, "conv_block_k": 16, "conv_warps": 1, "conv_stages": 1}


def _plan(source: str) -> Plan:
    plan = analyse(source)
    assert isinstance(plan, Plan), plan
    return plan


def _variants(plan: Plan, size_index: int) -> list[tuple[str, TemplateParams]]:
    default = default_params(plan)
    epilogue, prologue = plan.fusions[-1]
    stress = TemplateParams.from_dict({**_STRESS, "fuse_epilogue": epilogue, "fuse_prologue": prologue})
    mutant = mutate(plan, default, np.random.default_rng(2000 + size_index), diagnosis=None)
    return [("default", default), ("stress", stress), ("mutant", mutant)]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate."""
    jobs: list[dict[str, object]] = []
    labels: list[tuple[str, str]] = []
    for case in CONV_CASES:
        for i, source in enumerate(case.sources()):
            plan = _plan(source)
            for label, params in _variants(plan, i):
                jobs.append(
                    {"reference": source, "candidate": render(plan, params), "seeds": [5], "atol": 1e-4, "rtol": 1e-4}
                )
                labels.append((case.name, f"size{i}/{label}"))
            if i == 0:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(emit_module, "INT32_LIMIT", 0)
                    wide = render(plan, default_params(plan))
                assert ".to(tl.int64)" in wide
                jobs.append({"reference": source, "candidate": wide, "seeds": [6], "atol": 1e-4, "rtol": 1e-4})
                labels.append((case.name, "size0/int64-indexing"))
    workdir = tmp_path_factory.mktemp("interp-conv")
    half = len(jobs) // 2
    procs = [start_check(jobs[:half], workdir), start_check(jobs[half:], workdir)]
    results = [v for proc in procs for v in finish_check(proc, timeout=280)]
    by_case: dict[str, list[tuple[str, Verdict]]] = defaultdict(list)
    for (name, label), verdict in zip(labels, results, strict=True):
        by_case[name].append((label, verdict))
    return dict(by_case)


@pytest.mark.parametrize("case", [c.name for c in CONV_CASES])
def test_convolution_kernels_match_pytorch_under_the_interpreter(
    case: str, verdicts: dict[str, list[tuple[str, Verdict]]]
) -> None:
    results = verdicts[case]
    assert len(results) >= 4
    failures = [(label, v.detail) for label, v in results if not v.ok]
    assert not failures
    for label, v in results:
        if v.err_vs_fp64 is not None and v.ref_err_vs_fp64 is not None:
            assert v.err_vs_fp64 <= max(8 * v.ref_err_vs_fp64, 1e-6), (label, v.err_vs_fp64, v.ref_err_vs_fp64)


def test_conv_cases_cover_every_geometry() -> None:
    seen: set[str] = set()
    for case in CONV_CASES:
        plan = _plan(case.sources()[0])
        for node in plan.nodes:
            if node.kind is not NodeKind.CONV:
                continue
            spec = ConvSpec.from_attrs(node.attrs)
            seen.add(f"{len(node.shape) - 2}d" + ("T" if spec.transposed else ""))
            seen.update(
                name
                for name, hit in (
                    ("stride", max(spec.stride) > 1),
                    ("dilation", max(spec.dilation) > 1),
                    ("padding", max(spec.padding) > 0),
                    ("groups", spec.groups > 1),
                )
                if hit
            )
            if spec.groups == node.shape[1] > 1:
                seen.add("depthwise")
    assert {"1d", "2d", "3d", "1dT", "2dT", "3dT", "stride", "dilation", "padding", "groups", "depthwise"} <= seen


def test_conv_epilogue_fuses_into_one_kernel_and_unfused_splits() -> None:
    case = next(c for c in CONV_CASES if c.name == "conv2d_grouped_asymmetric_mish_scale")
    plan = _plan(case.sources()[0])
    assert plan.template == "conv"
    assert (False, True) in plan.fusions
    unfused = render(plan, default_params(plan).with_changes(fuse_epilogue=False))
    assert "_kf_conv0[" in unfused
    assert "_kf_pw1[" in unfused
    assert "_kf_pw1[" not in render(plan, default_params(plan))
    assert "conv_block_m" in relevant_params(plan, default_params(plan))


def test_interpreter_check_rejects_a_wrong_convolution(tmp_path: Path) -> None:
    case = next(c for c in CONV_CASES if c.name == "conv_transpose2d_grouped_clamp_divide")
    source = case.sources()[0]
    plan = _plan(source)
    good = render(plan, default_params(plan))
    bad = good.replace("t0 % 2 == 0", "t0 % 2 == 1")
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
