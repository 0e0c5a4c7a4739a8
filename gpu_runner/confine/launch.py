"""Launcher of a fresh-interpreter worker: enter the namespaces and Landlock domain, then exec.

``python -m gpu_runner.confine.launch PLAN_JSON -- PROGRAM ARGS...``: the same steps a fork
server's child takes (:func:`spawn_confined`), for workers started without a fork server.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpu_runner.confine import fsview, landlock
from gpu_runner.confine.namespaces import enter


def spawn_confined(spec: dict[str, Any], cwd: str) -> None:
    """In a fresh single-threaded process: namespaces, the filesystem view, then the worker-wide
    Landlock domain (after which the mount tree cannot change any more: Landlock forbids it).

    Returns in the worker; what held is left in ``KF_CONFINED`` (JSON) for the worker's report.
    """
    done: dict[str, str] = {}
    if spec.get("namespaces"):
        done.update(enter(spec["namespaces"]))
        if spec.get("view"):
            done.update(fsview.apply(fsview.View(**{k: tuple(v) for k, v in spec["view"].items()})))
        os.chdir(cwd)  # the cwd as the new mount tree sees it
    if spec.get("landlock"):
        done.update(landlock.restrict(landlock.Grants(**{k: tuple(v) for k, v in spec["landlock"].items()})))
    os.environ["KF_CONFINED"] = json.dumps(done)


def main(argv: list[str] | None = None) -> int:  # returns only on a usage error
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m gpu_runner.confine.launch PLAN_JSON -- PROGRAM ARGS...\n")
        return 2
    spec, program = json.loads(args[0]), args[2:]
    spawn_confined(spec, os.getcwd())
    os.execv(program[0], program)


if __name__ == "__main__":
    raise SystemExit(main())
