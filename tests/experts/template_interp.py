"""Shared by the template kernel tests: render cases in several variants and check them all.

``interp_verdicts`` renders every case at each of its sizes with the default parameters, a
"stress" configuration, a seeded mutant, the caller's ``also`` changes of the default and, at the
first size, 64-bit indexing, and checks them
in two child processes under ``TRITON_INTERPRET=1`` (``interp_check``). A module may check a
share of those candidates in the default run and the others in the slow one (``select``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from actors.experts.template import Plan, TemplateParams, analyse, default_params, mutate, render
from actors.experts.template import emit as emit_module
from actors.experts.template.interp_check import Verdict, finish_check, start_check
from actors.experts.template.ir import KeepTorch
from tests.experts.template_cases import Case

Select = Callable[[str, int, str], bool]
"""Whether to check a candidate, given its case's name, its size's index and its variant's label
(``default``, ``stress``, ``mutant``, ``also0``, ... or ``int64-indexing``)."""


def plan_of(source: str, keep_torch: KeepTorch = KeepTorch.NONE) -> Plan:
    """The plan of a covered reference (fails the test otherwise)."""
    plan = analyse(source, keep_torch)
    assert isinstance(plan, Plan), plan
    return plan


def interp_verdicts(
    cases: tuple[Case, ...],
    stress: Mapping[str, object],
    workdir: Path,
    also: Callable[[TemplateParams], list[dict[str, object]]] | None = None,
    keep_torch: KeepTorch = KeepTorch.NONE,
    select: Select | None = None,
) -> dict[str, list[tuple[str, Verdict]]]:
    """Verdicts by case name: (variant label, verdict) for every rendered candidate; ``also``
    lists changes of each default, each rendered as one more variant (``also0``, ``also1``, ...);
    ``keep_torch`` as the run policy plans (``LAYOUT`` under ``forbid``: data movement in PyTorch);
    ``select`` keeps only the candidates it accepts (all of them when ``None``), each with the same
    parameters and label as in the whole set, and leaves out a case with none accepted."""
    jobs: list[dict[str, object]] = []
    labels: list[tuple[str, str]] = []
    for case in cases:
        for i, source in enumerate(case.sources()):
            plan = plan_of(source, keep_torch)
            default = default_params(plan)
            epilogue, prologue = plan.fusions[-1]
            variants = [
                ("default", default),
                ("stress", TemplateParams.from_dict({**stress, "fuse_epilogue": epilogue, "fuse_prologue": prologue})),
                ("mutant", mutate(plan, default, np.random.default_rng(2000 + i), diagnosis=None)),
            ]
            for j, changes in enumerate(also(default) if also is not None else []):
                variants.append((f"also{j}", default.with_changes(**changes)))
            for label, params in variants:
                if select is not None and not select(case.name, i, label):
                    continue
                # One TF32 pass of rounded operands errs ~5e-4 of the inputs' scale (as cuDNN's TF32):
                # checked at that scale, against the IEEE float32 reference here.
                tol = 2e-3 if params.conv_precision == "tf32" else 1e-4
                jobs.append(
                    {"reference": source, "candidate": render(plan, params), "seeds": [5], "atol": tol, "rtol": tol}
                )
                labels.append((case.name, f"size{i}/{label}"))
            if i == 0 and (select is None or select(case.name, i, "int64-indexing")):
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(emit_module, "INT32_LIMIT", 0)
                    wide = render(plan, default)
                assert ".to(tl.int64)" in wide
                jobs.append({"reference": source, "candidate": wide, "seeds": [6], "atol": 1e-4, "rtol": 1e-4})
                labels.append((case.name, "size0/int64-indexing"))
    half = len(jobs) // 2
    procs = [start_check(jobs[:half], workdir), start_check(jobs[half:], workdir)]
    results = [v for proc in procs for v in finish_check(proc, timeout=280)]
    by_case: dict[str, list[tuple[str, Verdict]]] = defaultdict(list)
    for (name, label), verdict in zip(labels, results, strict=True):
        by_case[name].append((label, verdict))
    return dict(by_case)


TF32_REL_ERR = 1e-3
"""The bar of a variant computing in one TF32 pass (operands rounded to 10 mantissa bits, ~2^-11
relative each): on an H200 cuDNN's own TF32 convolutions erred 2.9-3.0e-4 against float64."""


def assert_all_correct(results: list[tuple[str, Verdict]], tf32: tuple[str, ...] = ()) -> None:
    """Every variant passed, with an error against float64 no worse than 8x eager's (variants whose
    label ends with one of ``tf32``: no worse than :data:`TF32_REL_ERR`)."""
    assert len(results) >= 4
    failures = [(label, v.detail) for label, v in results if not v.ok]
    assert not failures
    for label, v in results:
        if v.err_vs_fp64 is not None and v.ref_err_vs_fp64 is not None:
            bar = TF32_REL_ERR if label.endswith(tf32) and tf32 else max(8 * v.ref_err_vs_fp64, 1e-6)
            assert v.err_vs_fp64 <= bar, (label, v.err_vs_fp64, v.ref_err_vs_fp64)
