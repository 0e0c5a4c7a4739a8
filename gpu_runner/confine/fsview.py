"""The mount namespace's filesystem view: everything read-only, homes and project folders hidden.

Applied in a worker's own mount namespace just before a candidate runs (mount changes reach all
its threads). Each folder to hide gets an empty read-only tmpfs over it; what must stay
reachable beneath a hidden folder (the interpreter, site-packages, the evaluator's package, the
worker's private and bulk folders) is cloned first and put back on top. Then the whole tree is
made read-only, and the worker's private folders are made writable again.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from gpu_runner.confine.syscalls import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MS_NODEV,
    MS_NOSUID,
    mount,
    mount_setattr,
    move_mount,
    open_tree,
)


@dataclass(frozen=True)
class View:
    """What a worker sees of the filesystem."""

    hide: tuple[str, ...]
    """Folders covered by an empty tmpfs (absent ones are skipped)."""
    expose: tuple[str, ...]
    """Paths kept readable even beneath a hidden folder."""
    writable: tuple[str, ...]
    """The worker's own folders: the only writable places."""
    write_files: tuple[str, ...] = ()
    """Folders whose existing files stay writable though the tree is read-only: the worker's own
    ``/proc/self/task`` (resolved here, by the worker), where the NVIDIA driver names its threads
    at ``cuInit``; under a read-only ``/proc`` CUDA fails with error 304."""


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _placeholder(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _cover(path: str) -> None:
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")


def apply(view: View) -> dict[str, str]:
    """Build the view in the current mount namespace (needs CAP_SYS_ADMIN there)."""
    hide = sorted({os.path.realpath(p) for p in view.hide if os.path.isdir(p)}, key=len)
    outer = [h for h in hide if not any(o != h and _beneath(h, o) for o in hide)]
    keep = sorted({os.path.realpath(p) for p in (*view.expose, *view.writable) if os.path.exists(p)}, key=len)
    under = [p for p in keep if any(_beneath(p, h) for h in outer)]
    clones: dict[str, tuple[int, bool]] = {}
    try:
        for path in under:
            if not any(path != q and _beneath(path, q) for q in under):  # a kept parent carries it
                clones[path] = (open_tree(path), os.path.isdir(path))
        for h in outer:
            _cover(h)
        for path, (fd, is_dir) in clones.items():
            _placeholder(path, is_dir)
            move_mount(fd, path)
    finally:
        for fd, _ in clones.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    # A hidden folder inside a kept tree (e.g. a run folder in the project) is covered again.
    for h in hide:
        if any(h != k and _beneath(h, k) for k in clones) and os.path.isdir(h):
            _cover(h)
    mount_setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
    for path in (os.path.realpath(p) for p in view.writable if os.path.isdir(p)):
        fd = open_tree(path)
        try:
            mount_setattr("", 0, MOUNT_ATTR_RDONLY, dirfd=fd, empty=True)
            mount_setattr("", MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID, 0, dirfd=fd, empty=True)
            move_mount(fd, path)
        finally:
            os.close(fd)
    for path in (os.path.realpath(p) for p in view.write_files if os.path.isdir(p)):
        fd = open_tree(path)
        try:
            mount_setattr("", 0, MOUNT_ATTR_RDONLY, dirfd=fd, empty=True)
            move_mount(fd, path)
        finally:
            os.close(fd)
    what = f"read-only root, {len(hide)} folders hidden, {len(view.writable)} writable"
    if view.write_files:
        what += f", thread names writable ({', '.join(view.write_files)})"
    return {"mount_view": what}
