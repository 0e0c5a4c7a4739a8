"""Copy a Triton cache tree so that the copy is a cache hit where it lands.

Triton records, in each kernel's ``__grp__<name>.json``, the absolute paths of the kernel's files
(metadata, cubin, ...) and treats the kernel as uncached when those paths do not exist. A tree
copied from a compile worker's folder to a run worker's still names the compile worker's folder,
which a run worker's filesystem view hides: every launch then compiled again, and with the
sandbox forbidding ``ptxas`` each candidate ended in ``PermissionError`` (seen on an H100). Each
group file of a copy is rewritten to name the files beside it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

GROUP_PREFIX = "__grp__"


def relocate_groups(tree: Path) -> int:
    """Point every group file under ``tree`` at the files in its own folder; how many changed."""
    changed = 0
    for group in tree.rglob(f"{GROUP_PREFIX}*.json"):
        try:
            data = json.loads(group.read_text())
        except (OSError, ValueError):
            continue  # not Triton's; left as it is (Triton ignores what it cannot read)
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            continue
        moved = {name: str(group.parent / Path(str(path)).name) for name, path in children.items()}
        if moved == children or not all(Path(p).exists() for p in moved.values()):
            continue
        tmp = group.with_name(f".{group.name}.tmp")
        tmp.write_text(json.dumps({**data, "child_paths": moved}))
        os.replace(tmp, group)  # a reader sees the old file or the new one, never half of one
        changed += 1
    return changed


def copy_tree(src: Path, dst: Path, copy_function: Callable[[str, str], Any] = shutil.copy2) -> None:
    """``shutil.copytree`` into ``dst`` (merging), then :func:`relocate_groups` on ``dst``."""
    shutil.copytree(
        src, dst, dirs_exist_ok=True, symlinks=False, ignore_dangling_symlinks=True, copy_function=copy_function
    )
    relocate_groups(dst)
