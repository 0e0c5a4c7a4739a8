"""A Triton cache tree copied to another folder is a cache hit there (its group files relocated)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from gpu_runner.triton_cache import copy_tree, relocate_groups

pytestmark = pytest.mark.timeout(120)

KERNEL = """
import os, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_one(x_ptr, n, block: tl.constexpr):
    offs = tl.program_id(0) * block + tl.arange(0, block)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


src = ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "block": "constexpr"}, constexprs={"block": 256})
print(triton.compile(src, target=GPUTarget("cuda", 90, 32)).hash)
"""


def _files(tree: Path) -> dict[str, int]:
    """Every file under ``tree`` with its inode (Triton writes a new file for each compile)."""
    return {str(p.relative_to(tree)): p.stat().st_ino for p in tree.rglob("*") if p.is_file()}


def _compile(script: Path, cache: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_CACHE_DIR": str(cache), "TRITON_DEFAULT_FP_FUSION": "1"})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]


def test_group_files_are_pointed_at_the_files_beside_them(tmp_path: Path) -> None:
    folder = tmp_path / "copy" / "HASH"
    folder.mkdir(parents=True)
    for name in ("k.json", "k.cubin"):
        (folder / name).write_text("x")
    stale = {"child_paths": {n: f"/elsewhere/worker-1/triton/HASH/{n}" for n in ("k.json", "k.cubin")}}
    (folder / "__grp__k.json").write_text(json.dumps(stale))
    (folder / "__grp__other.json").write_text("not json")  # left alone, not an error
    assert relocate_groups(tmp_path / "copy") == 1
    moved = json.loads((folder / "__grp__k.json").read_text())["child_paths"]
    assert moved == {n: str(folder / n) for n in ("k.json", "k.cubin")}
    assert relocate_groups(tmp_path / "copy") == 0  # already pointing home


def test_a_group_whose_files_are_missing_here_is_left_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "HASH"
    folder.mkdir()
    text = json.dumps({"child_paths": {"k.cubin": "/elsewhere/HASH/k.cubin"}})
    (folder / "__grp__k.json").write_text(text)
    assert relocate_groups(tmp_path) == 0
    assert (folder / "__grp__k.json").read_text() == text


@pytest.mark.skipif(
    not (Path(str(triton.__file__)).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
    reason="Triton's ptxas is not installed here",
)
def test_a_copied_kernel_is_a_cache_hit_once_its_source_folder_is_gone(tmp_path: Path) -> None:
    """What a run worker sees: the compile worker's folder is hidden, only the copy is there.
    Control: a plain copy recompiles (Triton writes the kernel's files again)."""
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    first = tmp_path / "compile-worker" / "triton"
    _compile(script, first)
    plain, relocated = tmp_path / "plain", tmp_path / "relocated"
    shutil.copytree(first, plain)
    copy_tree(first, relocated)
    shutil.rmtree(first)
    for tree, hit in ((relocated, True), (plain, False)):
        before = _files(tree)
        _compile(script, tree)
        assert (_files(tree) == before) is hit, tree.name
