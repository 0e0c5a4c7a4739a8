"""The problems of a KernelBench checkout: where a level's files are, and which ones a spec picks.

A checkout is the public repository's ``KernelBench/`` folder (``level1/`` … beside each other)
or the repository root that holds it. Problem files are ``<number>_<Name>.py``, used unchanged.

``DEV_SUBSET`` is the development subset: the only KernelBench problems the project tunes and
tests on; every other problem is kept for acceptance. It is defined here and nowhere else
(``--problems dev`` selects it; scripts import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from actors.kbench.errors import LayoutError, ProblemSpecError

DEV_SUBSET: Mapping[int, tuple[int, ...]] = {
    1: (
        2,
        3,
        4,
        6,
        8,
        10,
        16,
        18,
        20,
        21,
        24,
        26,
        29,
        33,
        35,
        38,
        39,
        42,
        45,
        48,
        51,
        54,
        57,
        63,
        67,
        82,
        86,
        89,
        95,
        98,
    ),
    2: (2, 4, 6, 9, 14, 18, 21, 22, 28, 30, 33, 40, 45, 52, 56, 59, 63, 66, 67, 73, 80, 86, 88, 92, 95),
    3: (2, 3, 6, 8, 9, 15, 19, 22, 25, 28, 29, 31, 33, 36, 39, 46, 48, 50),
}
"""Level → problem numbers of the development subset (issue 12; level 3 grown to 18 by issue 35, one
problem of each kind the template expert used to decline)."""

_FILE = re.compile(r"^(\d+)_\w+\.py$")
_RANGE = re.compile(r"^(\d+)-(\d+)$")


@dataclass(frozen=True)
class Problem:
    """One problem file of a level."""

    level: int
    number: int
    path: Path

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``19_ReLU``."""
        return self.path.stem


def level_dir(root: Path, level: int) -> Path:
    """The folder of ``level`` in the checkout at ``root`` (``root/levelN`` or ``root/KernelBench/levelN``)."""
    if level < 1:
        raise LayoutError(f"--level {level}: levels start at 1")
    if not root.is_dir():
        raise LayoutError(f"not a directory: {root}")
    for candidate in (root / f"level{level}", root / "KernelBench" / f"level{level}"):
        if candidate.is_dir():
            return candidate
    levels = sorted(p.name for p in (*root.glob("level*"), *root.glob("KernelBench/level*")) if p.is_dir())
    if not levels:
        raise LayoutError(f"not a KernelBench checkout: {root} has no level<N>/ folder (nor KernelBench/level<N>/)")
    raise LayoutError(f"{root} has no level{level}/ (it has {', '.join(levels)})")


def list_problems(folder: Path, level: int) -> dict[int, Problem]:
    """Number → problem, for every ``<number>_<Name>.py`` in ``folder``."""
    found: dict[int, Problem] = {}
    for path in sorted(folder.iterdir()):
        match = _FILE.match(path.name)
        if match and path.is_file():
            number = int(match.group(1))
            if number in found:
                raise LayoutError(f"{folder}: two files for problem {number}: {found[number].path.name}, {path.name}")
            found[number] = Problem(level=level, number=number, path=path)
    if not found:
        raise LayoutError(f"{folder} holds no problem files (<number>_<Name>.py)")
    return found


def parse_spec(spec: str, level: int) -> tuple[int, ...]:
    """Problem numbers of a spec: comma-separated numbers, ranges ``A-B``, ``dev`` (the development
    subset of the level) or ``all`` (returned as an empty tuple: every problem of the level)."""
    numbers: set[int] = set()
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise ProblemSpecError(f"--problems {spec!r}: empty item (use e.g. 1,2,5-9, dev or all)")
    for part in parts:
        low = part.lower()
        if low == "all":
            if len(parts) > 1:
                raise ProblemSpecError(f"--problems {spec!r}: 'all' cannot be combined with other items")
            return ()
        if low == "dev":
            if level not in DEV_SUBSET:
                raise ProblemSpecError(f"--problems dev: no development subset for level {level}")
            numbers.update(DEV_SUBSET[level])
        elif part.isdigit():
            numbers.add(int(part))
        elif match := _RANGE.match(part):
            first, last = int(match.group(1)), int(match.group(2))
            if first > last:
                raise ProblemSpecError(f"--problems {spec!r}: range {part} runs backwards")
            numbers.update(range(first, last + 1))
        else:
            raise ProblemSpecError(f"--problems {spec!r}: cannot read {part!r} (use e.g. 1,2,5-9, dev or all)")
    if 0 in numbers:
        raise ProblemSpecError(f"--problems {spec!r}: problem numbers start at 1")
    return tuple(sorted(numbers))


def select(root: Path, level: int, spec: str) -> list[Problem]:
    """The problems ``spec`` picks from level ``level`` of the checkout at ``root``, in number order."""
    available = list_problems(level_dir(root, level), level)
    numbers = parse_spec(spec, level) or tuple(sorted(available))
    missing = [n for n in numbers if n not in available]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" …" if len(missing) > 8 else "")
        raise ProblemSpecError(
            f"--problems {spec!r}: level {level} has no problem {shown} (it has {min(available)}-{max(available)})"
        )
    return [available[n] for n in numbers]


def dev_problems(root: Path, level: int) -> list[Problem]:
    """The development subset of ``level`` in the checkout at ``root`` (for tuning scripts and tests)."""
    return select(root, level, "dev")
