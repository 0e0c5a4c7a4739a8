"""A configuration per size bucket for the copies that take other sizes (issue 38 item 1,
``buckets.py``): rendered with a model of the GPU, a model's any-size and any-batch copies get
further copies with the hardware model's tiles for calls of a quarter, a sixteenth and a
sixty-fourth of the task's work, chosen at call time; without one, nothing changes. Checked on the
text and under Triton's interpreter against the reference, in each bucket and at its edges."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.experts.template import any_batch, any_sizes, buckets, default_params, mutate
from actors.experts.template.expert import AnalysisMode, TemplateExpert
from actors.experts.template.hardware import CPU_FALLBACK, TABLE
from actors.experts.template.ir import Plan, Unsupported
from actors.experts.template.params import TemplateParams
from actors.experts.template.render import analyse, render
from schemas import GenerateRequest, Task
from tests.experts.test_template_any_batch import ALL_CASES, _check_in_child, _source

H200 = TABLE["H200"]
BUCKETED = 78
"""Renderings with bucket copies among the test cases' (at their first sizes, from an H200's
first parameters and a mutation of them) when this was written."""

LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))

batch_size = 2048
in_features = 32
out_features = 1152

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return []
"""
"""A product large enough that an H200's first tiles are 128 x 128 (16 x 9 of them fill its 132
SMs), with a short K so that the interpreter runs it quickly."""

CHILD = """
import json, sys
from pathlib import Path
import torch
from tests.experts.test_template_any_size import _load

def flat(v):
    return [x for i in v for x in flat(i)] if isinstance(v, (tuple, list)) else [v]

def check(job):
    module = _load(job["rendered"], Path(job["path"]))
    ran = []
    cls = module.ModelNew
    for name in [n for n in vars(cls) if n.startswith("_kf_any")]:
        def recorded(self, *args, _name=name, _method=getattr(cls, name)):
            ran.append(_name)
            return _method(self, *args)
        setattr(cls, name, recorded)
    ns = {}
    exec(compile(job["source"], job["label"], "exec"), ns)
    seen = {}
    for point in job["points"]:
        ns.update(point)
        torch.manual_seed(0)
        inputs, init = list(ns["get_inputs"]()), list(ns["get_init_inputs"]())
        torch.manual_seed(1)
        reference = ns["Model"](*init)
        torch.manual_seed(1)
        candidate = module.ModelNew(*init)
        try:
            want = flat(reference(*inputs))
        except Exception:  # the reference refuses these sizes: nothing to compare
            continue
        ran.clear()
        got = flat(candidate(*inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (point, g.shape, w.shape)
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"at {point}: {m}")
        seen[",".join(str(v) for v in point.values())] = ran[-1] if ran else "forward"
    return seen

out = {}
for job in json.loads(Path(sys.argv[1]).read_text()):
    try:
        out[job["label"]] = check(job)
    except Exception as exc:  # reported to the test, which fails naming it
        out[job["label"]] = f"{type(exc).__name__}: {exc}"[:3000]
print(json.dumps(out))
"""
"""Checks each job's model against the reference at each of its points, in a process of its own
with ``TRITON_INTERPRET=1`` from its start (``test_template_any_batch._check_in_child``), and
reports per point the last of ``ModelNew``'s copy methods that ran (``forward``: none did), or the
error that stopped the job."""


def _ran(label: str, source: str, rendered: str, tmp_path: Path, name: str, values: list[int]) -> dict[int, str]:
    """Per value of the size ``name``, the copy method that computed the model's (correct) output."""
    job = {
        "label": label,
        "source": source,
        "rendered": rendered,
        "path": str(tmp_path / f"kf_buckets_{label}.py"),
        "points": [{name: v} for v in values],
    }
    outcome: dict[str, Any] = _check_in_child([job], tmp_path, CHILD)
    assert isinstance(outcome[label], dict), outcome[label]
    return {int(k): v for k, v in outcome[label].items()}


def _linear_plan() -> Plan:
    plan = analyse(LINEAR)
    assert isinstance(plan, Plan), plan
    assert plan.sizes is not None
    assert plan.sizes.names == ("batch_size",)
    return plan


def _comments(rendered: str) -> list[str]:
    return re.findall(r"^ *# (buckets? [^\n]*)$", rendered, re.M)


@pytest.mark.slow  # ~6 s on a 2-core host; the default run keeps the any-batch copies' buckets below
def test_any_size_copies_get_the_hardware_models_tiles_per_bucket_and_are_correct_in_each(tmp_path: Path) -> None:
    plan = _linear_plan()
    params = default_params(plan, H200, tf32=True)
    assert (params.mm_block_m, params.mm_block_n, params.mm_warps) == (128, 128, 8)
    rendered = render(plan, params, hw=H200)
    # bucket 1 (a batch of 256: 4 x 36 tiles of 64 x 32 fill the SMs) has tiles of its own; buckets
    # 2 and 3 both take the smallest, one copy serving them
    assert f"def {any_sizes.METHOD}_1(self, x, kf_batch_size):" in rendered
    assert f"def {any_sizes.METHOD}_2(self, x, kf_batch_size):" in rendered
    assert f"def {any_sizes.METHOD}_3(" not in rendered
    assert _comments(rendered) == [
        "buckets 2 to 3 (at most 1/16 of the task's work): mm_block_m=32, mm_block_n=32, mm_warps=4, "
        "the hardware model's choice at batch_size=64",
        "bucket 1 (at most 1/4 of the task's work): mm_block_m=64, mm_block_n=32, mm_warps=4, "
        "the hardware model's choice at batch_size=256",
    ]
    assert "if 0 < _kf_work * 16 <= 2048:\n            return self._kf_any_sizes_2(x, kf_batch_size)" in rendered
    assert "_kf_mm0_s1[" in rendered
    assert "BLOCK_M=32, BLOCK_N=32" in rendered.split(f"def {any_sizes.METHOD}_2(")[1]
    # the task's size runs forward; a call of over a quarter of its work the run's own copy; the
    # edges of each bucket (512 is a quarter, 128 a sixteenth) go to the deeper side
    ran = _ran("sizes", LINEAR, rendered, tmp_path, "batch_size", [2048, 700, 512, 300, 129, 128, 1])
    copy = any_sizes.METHOD
    assert ran == {
        2048: "forward",
        700: copy,
        512: f"{copy}_1",
        300: f"{copy}_1",
        129: f"{copy}_1",
        128: f"{copy}_2",
        1: f"{copy}_2",
    }


@pytest.mark.slow  # ~4 s on a 2-core host; the default run keeps the any-batch copies' buckets below
def test_a_bucket_whose_copy_is_the_runs_own_falls_through_to_it(tmp_path: Path) -> None:
    # the candidate's own tiles are what the hardware model takes for the deepest buckets: those
    # run the candidate's copy, and bucket 1, between them and the task, is bounded on both sides
    plan = _linear_plan()
    params = default_params(plan, H200, tf32=True).with_changes(mm_block_m=32, mm_block_n=32, mm_warps=4)
    rendered = render(plan, params, hw=H200)
    assert f"def {any_sizes.METHOD}_1(" in rendered
    assert f"def {any_sizes.METHOD}_2(" not in rendered
    assert f"def {any_sizes.METHOD}_3(" not in rendered
    assert _comments(rendered) == [
        "bucket 1 (at most 1/4 of the task's work, over 1/16): mm_block_m=64, "
        "the hardware model's choice at batch_size=256",
    ]
    assert "if 0 < _kf_work * 4 <= 2048 < _kf_work * 16:" in rendered
    ran = _ran("through", LINEAR, rendered, tmp_path, "batch_size", [129, 128, 1])
    assert ran == {129: f"{any_sizes.METHOD}_1", 128: any_sizes.METHOD, 1: any_sizes.METHOD}


def test_any_batch_copies_get_a_configuration_per_bucket_and_are_correct_in_each(tmp_path: Path) -> None:
    plan = replace(_linear_plan(), sizes=None)  # the batch's path alone
    assert plan.batch_name == "batch_size"
    params = default_params(plan, H200, tf32=True)
    rendered = render(plan, params, hw=H200)
    assert any_sizes.METHOD not in rendered
    assert f"def {any_batch.METHOD}_1(self, x, kf_B):" in rendered
    assert f"def {any_batch.METHOD}_2(self, x, kf_B):" in rendered
    assert "_kf_work = kf_B\n" in rendered
    assert "_kf_mm0_b2[" in rendered
    assert _comments(rendered)[1].startswith("bucket 1 (at most 1/4 of the task's work): mm_block_m=64, mm_block_n=32")
    ran = _ran("batch", LINEAR, rendered, tmp_path, "batch_size", [2048, 1000, 300, 1])
    copy = any_batch.METHOD
    assert ran == {2048: "forward", 1000: copy, 300: f"{copy}_1", 1: f"{copy}_2"}


def test_without_a_gpu_model_the_copies_keep_the_candidates_configuration() -> None:
    plan = _linear_plan()
    params = default_params(plan, H200, tf32=True)
    rendered = render(plan, params)
    assert f"def {any_sizes.METHOD}(self, x):" in rendered
    assert f"{any_sizes.METHOD}_" not in rendered
    assert "_kf_work" not in rendered
    assert render(replace(plan, sizes=None), params).count(f"def {any_batch.METHOD}") == 1
    # a model of fixed sizes has no copies, so nothing for the buckets either
    fixed = LINEAR.replace("[torch.randn(batch_size, in_features)]", "[torch.randn(2048, in_features)]")
    fixed_plan = analyse(fixed)
    assert isinstance(fixed_plan, Plan), fixed_plan
    assert render(fixed_plan, params, hw=H200) == render(fixed_plan, params)


def test_a_plan_of_many_kernels_keeps_one_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _linear_plan()
    params = default_params(plan, H200, tf32=True)
    monkeypatch.setattr(buckets, "MAX_KERNELS", 0)  # this plan's one kernel is then too many
    assert render(plan, params, hw=H200) == render(plan, params)


def test_the_cpu_models_buckets_take_the_shapes_own_defaults() -> None:
    # no GPU: the template's defaults for the shapes are what the buckets take, 128 x 128 tiles
    # from 256 rows (bucket 1: the candidate's own, so its copy), 64 x 64 below
    plan = _linear_plan()
    rendered = render(plan, default_params(plan, CPU_FALLBACK), hw=CPU_FALLBACK)
    assert _comments(rendered) == [
        "buckets 2 to 3 (at most 1/16 of the task's work): mm_block_m=64, mm_block_n=64, mm_warps=4, "
        "the hardware model's choice at batch_size=64",
    ]
    assert f"def {any_sizes.METHOD}_1(" not in rendered


async def test_the_expert_renders_its_proposals_with_buckets_for_the_gpu_it_sizes_for() -> None:
    expert = TemplateExpert(analysis=AnalysisMode.THREAD, gpu="H200")
    task = Task.from_source("linear_relu_buckets", LINEAR)
    reply = await expert.generate(GenerateRequest(run_id="r1", island="i0", task=task, n=2, seed=1))
    plan = _linear_plan()
    for proposal in reply.proposals:
        params = TemplateParams.from_dict(dict(proposal.params))
        assert proposal.source == render(plan, params, hw=H200)
    assert f"def {any_sizes.METHOD}_1(" in reply.proposals[0].source
    await expert.aclose()


def test_a_buckets_representative_sizes_divide_the_batch_first_then_the_next_size() -> None:
    # the middle of bucket b: 2 * 4 ** b times less work than the task's
    assert buckets.representative((2048,), (1,), 1) == (256,)
    assert buckets.representative((2048,), (1,), 3) == (16,)
    # the batch goes down to its least first, then the next size takes what is left
    assert buckets.representative((16, 32, 32), (1, 1, 1), 3) == (1, 4, 32)
    assert buckets.representative((16, 32, 32), (1, 1, 1), 1) == (2, 32, 32)
    # a batch the reference takes no less than 2 of (batch norm's statistics) stays at 2
    assert buckets.representative((4, 100), (2, 1), 2) == (2, 6)
    assert buckets.representative((8,), (2,), 3) == (2,)


def test_buckets_a_call_can_reach_are_those_its_least_sizes_fall_in() -> None:
    assert buckets.reachable(2048) == [1, 2, 3]
    assert buckets.reachable(8) == [1]
    assert buckets.reachable(3) == []
    assert buckets.reachable(40, smallest=2) == [1, 2]  # a batch of 2 is a 20th of 40
    assert buckets.work((4, 12, 10)) == 480


def test_consecutive_buckets_of_one_copy_merge_and_the_runs_own_are_left_out() -> None:
    made = [(1, "a", "one"), (2, "b", "two"), (3, "b", "three")]
    assert buckets.runs(made) == [buckets.Bucket(1, 1, "one"), buckets.Bucket(2, 3, "two")]
    # bucket 2 runs the candidate's own copy: bucket 1 stops where it starts
    gapped = buckets.runs([(1, "a", "one"), (2, None, ""), (3, "a", "three")])
    assert gapped == [buckets.Bucket(1, 1, "one"), buckets.Bucket(3, 3, "three")]
    lines = buckets.dispatch(gapped, 4096, ("kf_b", "kf_h"), str)
    assert lines == [
        "_kf_work = kf_b * kf_h",
        "# bucket 3 (at most 1/64 of the task's work): three",
        "if 0 < _kf_work * 64 <= 4096:",
        "    3",
        "# bucket 1 (at most 1/4 of the task's work, over 1/16): one",
        "if 0 < _kf_work * 4 <= 4096 < _kf_work * 16:",
        "    1",
    ]


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_every_case_with_bucket_copies_is_correct_in_each_bucket(tmp_path: Path) -> None:
    # the run's first parameters on an H200 and a mutation of them (whose tiles the hardware model
    # would not choose, so most cases get buckets), checked at each bucket's representative sizes
    # and at the least sizes the reference takes
    jobs: list[dict[str, Any]] = []
    methods: dict[str, set[str]] = {}
    for name, case in ALL_CASES.items():
        source = _source(case, 0)
        plan = analyse(source)
        if isinstance(plan, Unsupported) or not (plan.sizes or plan.batch):
            continue
        start = default_params(plan, H200, tf32=True)
        mutant = mutate(plan, start, np.random.default_rng(3), diagnosis=None).with_changes(mm_tma=False)
        for label, params in (("default", start), ("mutant", mutant)):
            rendered = render(plan, params, hw=H200)
            if "_kf_work = " not in rendered:
                continue
            if plan.sizes:
                names, values, least = plan.sizes.names, plan.sizes.values, plan.sizes.least
            else:
                names, values, least = (plan.batch_name,), (any_batch.reference_batch(plan),), (plan.batch_least,)
            points = {buckets.representative(values, least, b) for b in range(1, buckets.DEEPEST + 1)}
            points.add(tuple(max(1, v) for v in least) or tuple(1 for _ in values))
            jobs.append(
                {
                    "label": f"{name} {label}",
                    "source": source,
                    "rendered": rendered,
                    "path": str(tmp_path / f"kf_buckets_all_{len(jobs)}.py"),
                    "points": [dict(zip(names, p, strict=True)) for p in sorted(points)],
                }
            )
            methods[f"{name} {label}"] = set(re.findall(r"def (_kf_any_\w+_\d)\(", rendered))
    outcomes = _check_in_child(jobs, tmp_path, CHILD)
    bad = {k: v for k, v in outcomes.items() if not isinstance(v, dict)}
    assert not bad, bad
    assert len(outcomes) == len(jobs) >= BUCKETED, len(jobs)
    # every bucket's copy ran at some point (its representative sizes fall in it)
    unran = {k: methods[k] - set(v.values()) for k, v in outcomes.items() if methods[k] - set(v.values())}
    assert not unran, unran
