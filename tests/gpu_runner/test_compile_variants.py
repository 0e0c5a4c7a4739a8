"""The compile stage compiles at the task's held-out shapes too: a candidate whose kernels take any
batch (or any size) launches copies of them only at other shapes, and the run process (which may
not start ``ptxas``) must find those compiled. Compiled here for an H200 (sm_90) without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, any_batch, any_sizes, default_params, render
from actors.experts.template.hardware import TABLE
from gpu_runner.triton_cache import copy_tree

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parents[2]
SUFFIX = (any_batch.SUFFIX, any_sizes.SUFFIX)
"""The names' endings of the template's copies (any batch, any size)."""

SCRIPT = """
import json, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from gpu_runner.sandboxed.candidate import import_candidate
from gpu_runner.sandboxed.compiling import (
    _CompileOnlyDriver, _compile_in_shares, _everywhere, _shaped_inputs, compile_at_variants,
)
from gpu_runner.sandboxed.hooks import CompileShare, LaunchLog, install_triton_hooks
import os, pathlib

driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
kernels, share = [], CompileShare()
install_triton_hooks(LaunchLog(), compile_only=True, compiled=kernels, share=share)
shaped = _shaped_inputs(open(sys.argv[2]).read())
cand = import_candidate(sys.argv[1])["ModelNew"](*shaped.reference["get_init_inputs"]())
variants, processes = json.loads(sys.argv[3]), int(sys.argv[4])
said = ""
if processes > 1:  # as the compile stage does: helpers share out every shape's launches first
    everywhere = lambda: _everywhere(cand, shaped.inputs, shaped.reference, variants)
    said = _compile_in_shares(everywhere, share, processes, kernels)
before = sorted(p.stem for p in pathlib.Path(os.environ["TRITON_CACHE_DIR"]).rglob("*.cubin"))
with torch.no_grad():
    cand(*shaped.inputs)
at_reference = len(kernels)
note = compile_at_variants(cand, shaped.reference, variants)
print(json.dumps({"note": note, "at_reference": at_reference, "kernels": len(kernels), "said": said, "before": before}))
"""


def _compile(
    tmp_path: Path, variants: list[dict[str, int]], seed: Path | None = None, processes: int = 1
) -> dict[str, object]:
    reference = (HERE / "examples" / "quickstart.py").read_text()
    plan = analyse(reference)
    assert isinstance(plan, Plan)
    assert plan.batch_name == "batch_size"
    (tmp_path / "cand.py").write_text(render(plan, default_params(plan, TABLE["H200"])))
    (tmp_path / "ref.py").write_text(reference)
    (tmp_path / "script.py").write_text(SCRIPT)
    cache = tmp_path / f"cache{len(variants)}{'s' if seed else ''}p{processes}"
    if seed is not None:  # as the compile stage seeds a late compile at the shapes
        copy_tree(seed, cache)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(HERE))
    argv = [sys.executable, str(tmp_path / "script.py"), str(tmp_path / "cand.py"), str(tmp_path / "ref.py")]
    argv += [json.dumps(variants), str(processes)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    out["cubins"] = sorted(p.stem for p in cache.rglob("*.cubin"))
    out["cache"] = str(cache)
    return out


def test_the_copies_a_candidate_launches_at_held_out_batches_are_compiled_ahead(tmp_path: Path) -> None:
    plain = _compile(tmp_path, [])
    assert plain["note"] == ""
    assert not any(str(c).endswith(SUFFIX) for c in plain["cubins"])  # type: ignore[attr-defined]
    held = _compile(tmp_path, [{"batch_size": 21}, {"batch_size": 1}, {"in_features": 100}])
    cubins = [str(c) for c in held["cubins"]]  # type: ignore[attr-defined]
    copies = [c for c in cubins if c.endswith(SUFFIX)]
    assert copies, cubins
    # the batch is not specialised on: one compile of each copy serves batches 21 and 1
    assert len(copies) == len(set(copies)), copies
    assert held["kernels"] > held["at_reference"]  # type: ignore[operator]
    # two batches ran; another feature size is refused by the candidate's forward (its answer there)
    assert held["note"] == "; at 2 of 3 held-out shapes too (1 raised in the forward)", held["note"]


@pytest.mark.slow  # ~7 s on a 2-core host; the default run keeps the held-out copies' compile above
def test_a_compile_at_the_shapes_seeded_with_the_first_compiles_cache_compiles_only_the_copies(
    tmp_path: Path,
) -> None:
    # A candidate compiled before its task's held-out shapes were known is compiled again at them;
    # started from the first compile's Triton cache (copied to another folder, as the compile stage
    # does), the kernels at the reference's shapes are cache hits and only the copies are new.
    plain = _compile(tmp_path, [])
    stored = Path(str(plain["cache"]))
    before = {p.relative_to(stored): p.stat().st_mtime_ns for p in stored.rglob("*.cubin")}
    first = stored.rename(tmp_path / "stored")  # its group files name a folder that is gone, as a worker's is
    held = _compile(tmp_path, [{"batch_size": 21}, {"batch_size": 1}], seed=first)
    cache = Path(str(held["cache"]))
    after = {p.relative_to(cache): p.stat().st_mtime_ns for p in cache.rglob("*.cubin")}
    new = sorted(p.stem for p in set(after) - set(before))
    assert before
    assert new
    assert all(stem.endswith(SUFFIX) for stem in new), new  # the copies alone were compiled
    # the first compile's files were found, not written again (the copy keeps their times)
    assert {p: after.get(p) for p in before} == before


@pytest.mark.slow  # ~8 s on a 2-core host; the default run keeps the compile above and test_compile_shares
def test_the_helpers_compile_the_held_out_shapes_copies_too(tmp_path: Path) -> None:
    # The compile stage's helpers share out the launches at the held-out shapes with those at the
    # task's own: the copies are in the cache before the stage's own passes (which then only find
    # them), the same cubins as one process compiles, and the note is the same.
    variants = [{"batch_size": 21}, {"batch_size": 1}, {"in_features": 100}]
    alone = _compile(tmp_path, variants)
    shared = _compile(tmp_path, variants, processes=3)
    assert shared["said"] == "compiled in 3 processes, 2 of 2 helpers finished"
    assert shared["cubins"] == alone["cubins"]
    assert shared["before"] == alone["cubins"]  # every one, the copies included, before the full pass
    assert any(str(c).endswith(SUFFIX) for c in shared["before"])  # type: ignore[attr-defined]
    assert alone["before"] == []
    assert shared["note"] == alone["note"] == "; at 2 of 3 held-out shapes too (1 raised in the forward)"
