"""Plans kept on disk between runs: a task analysed once is not analysed again.

Analysing a whole model (tracing it, lowering it, finding its batch by lowering it again) takes
seconds, up to tens of seconds for a recurrent one, and a run's first candidate waits for it. A
user runs the same task again and again (a longer budget, another expert, another GPU), and every
run started with the same analysis. :class:`PlanStore` keeps each plan the analysis produced
(declines are not kept: a time limit may have caused one) under a key of everything it depends
on: the reference's source, the plan's policy for ops left to PyTorch, the torch version and a
fingerprint of the code that analyses (every Python file of ``actors/`` and ``gpu_runner/``), so
a changed reference or a new version of Kernel Foundry analyses afresh. One JSON file per plan
(``plan_to_dict``), written whole or not at all; a file that does not read back is removed and
counts as absent; the oldest beyond :data:`STORE_KEPT` are removed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import structlog

from actors.experts.template.ir import KeepTorch, Plan, plan_to_dict
from actors.experts.template.lowering import read_plan

log = structlog.get_logger(__name__)

STORE_KEPT = 256
"""Plans kept (a few hundred KB each at most: a whole model's nodes)."""
_ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def code_fingerprint() -> str:
    """A hash of the code that analyses a reference (every ``.py`` of ``actors/`` and
    ``gpu_runner/``, by path and content), torch's version and Python's."""
    import torch

    digest = hashlib.sha256(f"{torch.__version__}|{sys.version_info[:2]}".encode())
    for package in ("actors", "gpu_runner"):
        for path in sorted((_ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def default_store_dir() -> Path:
    """``$KFOUNDRY_HOME/cache/plans`` (``~/.kfoundry/cache/plans``), beside the compile cache."""
    from gpu_runner.config import default_cache_dir

    return default_cache_dir() / "plans"


class PlanStore:
    """Plans on disk under ``root``, by reference source, policy and code (see the module's doc).
    Its methods read and write files: call them from a worker thread."""

    def __init__(self, root: Path, kept: int = STORE_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"kept={kept} must be at least 1")
        self.root = root
        self.kept = kept

    def path(self, source: str, keep_torch: KeepTorch) -> Path:
        """Where the plan of ``source`` under ``keep_torch`` is kept."""
        key = hashlib.sha256(f"{code_fingerprint()}|{KeepTorch(keep_torch).value}|".encode() + source.encode())
        return self.root / f"{key.hexdigest()}.json"

    def get(self, source: str, keep_torch: KeepTorch) -> Plan | None:
        """The kept plan, or ``None`` (none kept, or a file that does not read back, then removed)."""
        path = self.path(source, keep_torch)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            plan = read_plan(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("plan_store.unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: removed last
        return plan

    def put(self, source: str, keep_torch: KeepTorch, plan: Plan) -> None:
        """Keep ``plan`` (written to a temporary file, then renamed into place); a store that cannot
        be written is logged and left as it is: the plan is still used by this run."""
        path = self.path(source, keep_torch)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".plan-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(plan_to_dict(plan), f)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._prune()
        except OSError as exc:
            log.warning("plan_store.unwritable", root=str(self.root), error=f"{type(exc).__name__}: {exc}"[:300])

    def _prune(self) -> None:
        """Remove the least recently used plans beyond :attr:`kept`."""
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in files[: max(0, len(files) - self.kept)]:
            with contextlib.suppress(OSError):
                old.unlink()
