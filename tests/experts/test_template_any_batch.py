"""Models at any batch size (issue 38 item 1): the template writes its kernels for the reference's
shapes and, where the batch is a module-level size of the task, copies whose every batch-linked size
is an expression of the batch at run time (``any_batch.py``). Checked under Triton's interpreter
against the reference at batch sizes the run never saw, for every family the template's test cases
cover (products, rows, norms, convolutions, transposed convolutions, pools, scans), statistics
over the batch (batch norm in training mode, a sum or a mean over the samples) at batches many
times the reference's, and the refusals of a model that has no batch."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from string import Template
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from actors.experts.template import any_batch, default_params, mutate
from actors.experts.template.any_batch import Sym
from actors.experts.template.hardware import TABLE
from actors.experts.template.ir import Plan, Unsupported
from actors.experts.template.params import TemplateParams
from actors.experts.template.render import analyse, lowered, render
from tests.experts import (
    template_attn_cases,
    template_cases,
    template_conv_cases,
    template_loss_cases,
    template_norm_cases,
    template_pool_cases,
    template_scan_cases,
)
from tests.experts.template_cases import HEAD, Case
from tests.experts.test_template_any_size import _load

ALL_CASES: dict[str, Case] = {
    case.name: case
    for case in (
        *template_cases.CASES,
        *template_conv_cases.CONV_CASES,
        *template_pool_cases.POOL_CASES,
        *template_norm_cases.NORM_CASES,
        *template_norm_cases.GRAPH_CASES,
        *template_scan_cases.SCAN_CASES,
        *template_loss_cases.LOSS_CASES,
        *template_attn_cases.ATTN_CASES,
    )
}

FAMILIES = (
    "linear_relu",  # a product and its epilogue
    "matmul_scale_residual",  # a second input that does not move with the batch
    "gemm_groupnorm_swish",  # a product, then a norm over groups of its rows
    "softmax_middle_dim",  # rows over a middle dimension
    "layer_norm",
    "argmax_middle",
    "conv2d_grouped_asymmetric_mish_scale",
    "conv_transpose2d_grouped_clamp_divide",
    "conv2d_gelu_global_avg_pool",
    "maxpool1d_dilated_ceil",
    "cumsum_reverse",
)
"""One case per family, checked in the default run (every case in the slow one)."""

COVERED = 52
"""Cases (at their first sizes) that got an any-batch path when this was written, every one correct."""


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _source(case: Case, index: int = 0) -> str:
    """The case with its sizes as module-level variables (``KF_B = 3``), as KernelBench writes them."""
    sizes = case.sizes[index]
    head = "".join(f"KF_{k} = {v}\n" for k, v in sizes.items())
    return HEAD + head + "\n" + Template(case.template).substitute({k: f"KF_{k}" for k in sizes})


def _flat(value: Any) -> list[torch.Tensor]:
    return [x for v in value for x in _flat(v)] if isinstance(value, tuple | list) else [value]


def check_batches(
    source: str, batch_name: str, module: ModuleType, label: str, batches: list[int] | None = None
) -> list[int]:
    """The candidate against the reference at batch 1 and an odd batch above the reference's (or
    at ``batches``; the task's own ``get_inputs`` at each); returns the batches checked."""
    ns: dict[str, Any] = {}
    exec(compile(source, label, "exec"), ns)  # the test's own task source
    b0 = int(ns[batch_name])
    batches = sorted(set(batches or {1, b0 + 2 if b0 % 2 else b0 + 1}) - {b0})
    for b in batches:
        ns[batch_name] = b
        torch.manual_seed(0)
        inputs = list(ns["get_inputs"]())
        init = list(ns["get_init_inputs"]())
        torch.manual_seed(1)
        reference = ns["Model"](*init)
        torch.manual_seed(1)
        candidate = module.ModelNew(*init)
        got, want = _flat(candidate(*inputs)), _flat(reference(*inputs))
        assert len(got) == len(want), label
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, f"{label} at batch {b}"
            where = f"{label} at batch {b}"
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"{where}: {m}")  # noqa: B023
    return batches


CHILD = """
import json, sys
from pathlib import Path
from tests.experts.test_template_any_batch import _load, check_batches

jobs = json.loads(Path(sys.argv[1]).read_text())
out = {}
for job in jobs:
    try:
        module = _load(job["rendered"], Path(job["path"]))
        out[job["label"]] = check_batches(
            job["source"], job["batch_name"], module, job["label"], job.get("batches")
        )
    except Exception as exc:  # reported to the test, which fails naming it
        out[job["label"]] = f"{type(exc).__name__}: {exc}"[:3000]
print(json.dumps(out))
"""
"""Runs the checks in a process of its own with ``TRITON_INTERPRET=1`` from its start: the
interpreter takes Triton's library functions (``tl.zeros``) only where it was on when Triton was
first imported, which in a test session another test may have done without it."""


def _check_in_child(jobs: list[dict[str, Any]], tmp_path: Path, child: str = CHILD) -> dict[str, Any]:
    """Each job's outcome (``child``'s last line: for :data:`CHILD`, the batches it was checked at,
    or the error that stopped it)."""
    listing = tmp_path / "jobs.json"
    listing.write_text(json.dumps(jobs))
    script = tmp_path / "child.py"
    script.write_text(child)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    argv = [sys.executable, "-W", "ignore::RuntimeWarning", str(script), str(listing)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=2400, check=False, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _job(label: str, source: str, plan: Plan, rendered: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / f"kf_anyb_{len(label)}_{abs(hash(label))}.py"
    return {"label": label, "source": source, "batch_name": plan.batch_name, "rendered": rendered, "path": str(path)}


def _batch_only(source: str) -> Plan | Unsupported:
    """The plan of ``source`` with its batch path alone (``any_sizes``, which supersedes it where
    every free size moves, is tested in ``test_template_any_sizes``)."""
    plan = analyse(source)
    return replace(plan, sizes=None) if isinstance(plan, Plan) else plan


def _any_batch_case(name: str, tmp_path: Path, index: int = 0) -> tuple[str, Plan, str]:
    source = _source(ALL_CASES[name], index)
    plan = _batch_only(source)
    assert isinstance(plan, Plan), plan
    return source, plan, render(plan, TemplateParams())


def test_a_model_of_each_family_is_correct_at_batch_sizes_the_run_never_saw(tmp_path: Path) -> None:
    jobs = []
    for name in FAMILIES:
        source, plan, rendered = _any_batch_case(name, tmp_path)
        assert plan.batch_name.startswith("KF_"), plan.batch_name
        assert f"def {any_batch.METHOD}(self" in rendered, name
        jobs.append(_job(name, source, plan, rendered, tmp_path))
    outcomes = _check_in_child(jobs, tmp_path)
    bad = {k: v for k, v in outcomes.items() if not isinstance(v, list)}
    assert not bad, bad
    assert sorted(outcomes) == sorted(FAMILIES)


def _variants(plan: Plan, seed: int) -> list[tuple[str, TemplateParams]]:
    """The parameters a run starts from and two of its mutations (TMA left out: the interpreter
    has no tensor descriptors)."""
    start = default_params(plan)
    rng = np.random.default_rng(seed)
    out = [("plain", TemplateParams()), ("default", start)]
    for k in range(2):
        out.append((f"mutant{k}", mutate(plan, start, rng, diagnosis=None).with_changes(mm_tma=False)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_every_case_with_an_any_batch_path_is_correct_at_other_batches(tmp_path: Path) -> None:
    covered: list[str] = []
    jobs = []
    for name, case in ALL_CASES.items():
        for index in range(len(case.sizes)):
            source = _source(case, index)
            plan = _batch_only(source)
            if isinstance(plan, Unsupported):
                continue
            for label, params in _variants(plan, index):
                rendered = render(plan, params)
                if f"def {any_batch.METHOD}(self" not in rendered:
                    continue
                jobs.append(_job(f"{name}[{index}] {label}", source, plan, rendered, tmp_path))
                if index == 0 and label == "plain":
                    covered.append(name)
    outcomes = _check_in_child(jobs, tmp_path)
    bad = {k: v for k, v in outcomes.items() if not isinstance(v, list)}
    assert not bad, bad
    assert len(outcomes) == len(jobs)
    assert len(covered) >= COVERED, covered


def test_a_length_read_in_windows_is_not_taken_for_a_batch(tmp_path: Path) -> None:
    # the pooled length's output is 9 at a length of 22, 23 and 24 (ceil mode, stride 3) but not at
    # 1 or 47: a size that moves another dimension than an input's first is not a batch
    _, plan, rendered = _any_batch_case("avgpool1d_padded_exclude_pad_ceil", tmp_path)
    assert not plan.batch
    assert any_batch.METHOD not in rendered


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps a model of each family at other batches
def test_statistics_over_the_batch_loop_over_it_and_hold_at_batches_many_times_the_references(
    tmp_path: Path,
) -> None:
    # a sum over every element, batch norm's statistics (divided by the batch times the pixels: a
    # constant that moves with the batch) and a loss averaged over the samples: their reductions
    # over the batch loop over it in blocks of a size the batch does not set, so batches of five
    # blocks and more hold too
    jobs = []
    for name in ("full_sum", "batchnorm2d_training_relu", "kl_div_batchmean"):
        source, plan, rendered = _any_batch_case(name, tmp_path)
        assert f"def {any_batch.METHOD}(self" in rendered, name
        assert re.search(rf"for r0 in range\(0, \(?{any_batch.NAME}\b", rendered), name
        if name != "full_sum":
            assert any(any(c) for c in plan.batch_args), name  # the divisor moves with the batch
        jobs.append({**_job(name, source, plan, rendered, tmp_path), "batches": [1, 2, 70, 333]})
    outcomes = _check_in_child(jobs, tmp_path)
    assert outcomes == {name: [1, 2, 70, 333] for name in ("full_sum", "batchnorm2d_training_relu", "kl_div_batchmean")}


_GEMM_BATCHNORM1D = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 12)
        self.bn = nn.BatchNorm1d(12, eps=1e-4)

    def forward(self, x):
        return self.bn(self.fc(x) * 1.5)

batch_size = 9

def get_inputs():
    return [torch.randn(batch_size, 10)]

def get_init_inputs():
    return []
"""


def test_a_batch_the_reference_refuses_is_refused_and_the_others_hold(tmp_path: Path) -> None:
    # batch norm in training mode refuses one value per channel: so does the any-batch path
    plan = _batch_only(_GEMM_BATCHNORM1D)
    assert isinstance(plan, Plan), plan
    assert (plan.batch_name, plan.batch_least) == ("batch_size", 2)
    rendered = render(plan, TemplateParams())
    module = _load(rendered, tmp_path / "kf_anyb_bn1d_refuse.py")
    with pytest.raises(ValueError, match="x has a batch of 1: the reference refuses a batch below 2"):
        module.ModelNew()(torch.randn(1, 10))
    job = {**_job("bn1d", _GEMM_BATCHNORM1D, plan, rendered, tmp_path), "batches": [2, 37, 300]}
    assert _check_in_child([job], tmp_path) == {"bn1d": [2, 37, 300]}


def test_a_model_without_a_batch_size_of_its_own_refuses_other_shapes_naming_the_dimension(tmp_path: Path) -> None:
    # the task's inputs have no module-level size that get_inputs alone reads: nothing to move
    source, plan, rendered = _any_batch_case("gemm_scale_batchnorm1d", tmp_path)
    assert not plan.batch
    assert any_batch.METHOD not in rendered
    module = _load(rendered, tmp_path / "kf_anyb_fixed.py")
    ns: dict[str, Any] = {}
    exec(compile(source, "gemm_scale_batchnorm1d", "exec"), ns)
    x = ns["get_inputs"]()[0]
    with pytest.raises(ValueError, match=r"dimension 0 is 1, not \d+\. .*specialised to"):
        module.ModelNew(*ns["get_init_inputs"]())(x[:1])


def test_the_any_batch_path_refuses_other_dimensions_and_an_empty_batch(tmp_path: Path) -> None:
    source, _plan, rendered = _any_batch_case("linear_relu", tmp_path)
    module = _load(rendered, tmp_path / "kf_anyb_refuse.py")
    ns: dict[str, Any] = {}
    exec(compile(source, "linear_relu", "exec"), ns)
    model = module.ModelNew(*ns["get_init_inputs"]())
    k = int(ns["KF_K"])
    with pytest.raises(
        ValueError, match=rf"^x has shape \(5, {k + 1}\): dimension 1 is {k + 1}, not {k}\. .*any KF_M;"
    ):
        model(torch.randn(5, k + 1))
    with pytest.raises(ValueError, match=r"^x has a batch of 0"):
        model(torch.randn(0, k))
    with pytest.raises(ValueError, match=r"^x has 3 dimensions"):
        model(torch.randn(5, k, 1))


def test_symbolic_sizes_print_as_expressions_of_the_batch() -> None:
    b = Sym(12, affine=(1, 0))
    assert str(b) == "kf_B"
    assert int(b) == 12
    rows = b * 7
    assert f"{rows}" == "(kf_B * 7)"
    assert int(rows) == 84
    tiles = math.ceil(rows / 64)
    assert str(tiles) == "((kf_B * 7 + 63) // 64)"
    assert int(tiles) == 2
    assert repr((rows, 5)) == "((kf_B * 7), 5)"
    assert str((b + 63) - 63) == "kf_B"  # affine forms fold
    assert (b * 3 - b * 3) == 0
    assert not isinstance(b * 3 - b * 3, Sym)
    assert str(rows % 5 * 1) == "((kf_B * 7) % 5)"
    assert str(2 * b + 1) == "(kf_B * 2 + 1)"


def test_the_batch_is_found_only_where_the_plan_is_the_same_but_for_sizes(tmp_path: Path) -> None:
    source, plan, _ = _any_batch_case("matmul_scale_residual", tmp_path)
    assert plan.batch_name == "KF_M"
    by_id = {n.id: n for n in plan.nodes}
    moving = {by_id[n.id].shape: plan.batch[n.id] for n in plan.inputs}
    assert sorted(moving.values()) == [(0, 0), (1, 0), (1, 0)]  # the (K, N) operand stays
    # a batch written as a literal is not a size of the task; the sizes that are move other
    # dimensions than an input's first (the contraction's length, the columns): no any-batch path
    literal = source.replace("KF_M = ", "UNUSED = ").replace("KF_M", "33")
    plain = analyse(literal)
    assert isinstance(plain, Plan)
    assert not plain.batch


COMPILE = """
import json, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from actors.experts.template.trace import load_namespace
from gpu_runner.sandboxed.candidate import import_candidate
from gpu_runner.sandboxed.compiling import _CompileOnlyDriver
from gpu_runner.sandboxed.hooks import CompileShare, LaunchLog, install_triton_hooks

candidate, reference, name, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sizes = json.loads(batch) if name == "-" else {name: int(batch)}  # "-" then {"size": value, ...}
driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
kernels = []
install_triton_hooks(LaunchLog(), compile_only=True, compiled=kernels, share=CompileShare())
ns = load_namespace(open(reference).read())
ns.update(sizes)
torch.manual_seed(0)
inputs, init = list(ns["get_inputs"]()), list(ns["get_init_inputs"]())
model = import_candidate(candidate)["ModelNew"](*init)
with torch.no_grad():
    getattr(model, sys.argv[5])(*inputs)
print(json.dumps({"kernels": len(kernels)}))
"""
"""Compiles what the any-batch method launches for an H200 (sm_90) on a machine without a GPU:
Triton's driver replaced by one that only names the target, launches turned into compile-only
calls (the evaluator's compile stage does the same). The interpreter takes sizes the compiler
would refuse (a block shape that is not a constant); this does not."""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_any_batch_kernels_compile_for_a_hopper_gpu_without_one(tmp_path: Path) -> None:
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    for name in FAMILIES:
        source, plan, _ = _any_batch_case(name, tmp_path)
        rendered = render(plan, default_params(plan, TABLE["H200"]))
        assert any_batch.METHOD in rendered, name
        candidate, reference = tmp_path / f"cand_{name}.py", tmp_path / f"ref_{name}.py"
        candidate.write_text(rendered)
        reference.write_text(source)
        argv = [sys.executable, str(script), str(candidate), str(reference), plan.batch_name, "3", any_batch.METHOD]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert json.loads(done.stdout.strip().splitlines()[-1])["kernels"] >= 1, name
    cubins = {p.stem for p in (tmp_path / "cache").rglob("*.cubin")}
    assert cubins, "nothing was compiled"
    assert all(c.endswith(any_batch.SUFFIX) for c in cubins), cubins


_SLOW_LINEAR = """
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.fc(x))

batch_size = 16
n = 32

def get_inputs():
    return [torch.randn(batch_size, n)]

def get_init_inputs():
    $work
    return [n]
"""


@pytest.mark.slow  # ~8 s on a 2-core host: three analyses, one of them spinning
def test_the_lowering_limit_counts_the_analysis_own_work_not_a_busy_hosts_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On an H200 host busy starting its evaluator, KernelBench L2-9's first analysis took longer
    # than the limit in wall time and its kernels got no any-batch copies. Waiting (here a sleep)
    # does not count; the analysis's own CPU time does (here a spin).
    analyse(Template(_SLOW_LINEAR).substitute(work="pass"))  # the process's first tracing, at full limit
    monkeypatch.setattr(any_batch, "PROBE_LIMIT_S", 0.2)
    waits = analyse(Template(_SLOW_LINEAR).substitute(work="time.sleep(0.4)"))
    assert isinstance(waits, Plan), waits
    assert waits.batch_name == "batch_size"
    spin = "t = time.thread_time()\n    while time.thread_time() - t < 0.4:\n        pass"
    works = analyse(Template(_SLOW_LINEAR).substitute(work=spin))
    assert isinstance(works, Plan), works
    assert works.batch_name == ""
    assert works.batch == ()


def test_the_probe_budget_counts_the_analysis_own_work_not_a_busy_hosts_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # KernelBench L3-6 ran first on a fresh H100 machine and its first candidate had no any-batch
    # copies, which the same analysis on an idle host gives it: the probes' budget was wall time.
    # Here the first lowering at another batch is another model (no links), so a second one is
    # needed, after the first took 0.4 s: waited (a sleep) it is still inside a 0.2 s budget of the
    # analysis's own work; worked (a spin) it is not.
    source = Template(_SLOW_LINEAR).substitute(work="pass")
    plan, at_17 = lowered(source), lowered(source, sizes={"batch_size": 17})
    other = lowered(source.replace("torch.relu(self.fc(x))", "torch.sigmoid(torch.relu(self.fc(x)))"))
    monkeypatch.setattr(any_batch, "PROBE_BUDGET_S", 0.2)

    def relower(pause: Callable[[], None]) -> Callable[[dict[str, int]], Plan]:
        def at(sizes: dict[str, int]) -> Plan:
            pause()
            return other if sizes["batch_size"] < 16 else at_17

        return at

    def spin() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.4:
            pass

    waited = any_batch.find({"batch_size": 16}, plan, relower(lambda: time.sleep(0.4)))
    assert waited.name == "batch_size"
    worked = any_batch.find({"batch_size": 16}, plan, relower(spin))
    assert worked.name == ""
