"""The import path of a child process: the parent's own, handed over explicitly.

A child started with a scrubbed environment sees only the interpreter's default path plus what
``PYTHONPATH`` names. When the parent found its packages elsewhere (``PYTHONPATH`` of its own,
``--target`` installs, ``sys.path`` changed at run time), the child would fail to import them;
so children get the parent's ``sys.path`` entries, in order, as their ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def child_pythonpath(*first: Path) -> str:
    """``PYTHONPATH`` for a child: ``first``, then every existing entry of this process's
    ``sys.path`` (the empty entry, the parent's working directory, is left out), without repeats."""
    seen: set[str] = set()
    entries: list[str] = []
    for entry in [*(str(p) for p in first), *sys.path]:
        if entry and entry not in seen and os.path.exists(entry):
            seen.add(entry)
            entries.append(entry)
    return os.pathsep.join(entries)
