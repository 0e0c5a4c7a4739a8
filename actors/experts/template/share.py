"""Kernels of one rendered file that are the same code share one ``triton.jit`` function.

Every distinct Triton function of a candidate is a compile of its own (0.1-0.3 s of a host core
each for sm_90), and a whole model's first verdict waits for all of them: KernelBench L3-15
(DenseNet-121) renders 960 kernels, L3-19 (MobileNetV1) 276. Layers repeat, so many kernels are
the same code but for their names, the node numbers in their local names, and the offsets into
the intermediates' buffer (``arena.py``) added to their pointers at their tops. Here each kernel is
put in a canonical form (its locals renamed in the order they first appear, each offset a run-time
argument ``kf_oK`` instead of a constant), and kernels whose canonical forms are equal become names
of the first one (``_kf_pw5 = _kf_pw3``): one function, compiled once per specialisation. Their
launch sites pass their own offsets (``kf_o0=1009152``), constant per site, so what Triton
specialises an integer on (a multiple of 16: offsets are multiples of ``arena.ALIGN``) holds at
every call of the site. A kernel that shares with no other keeps its constant offsets and its own
text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from actors.experts.template import const_args

OFFSET_ARG = "kf_o"
"""Prefix of the run-time offset arguments of a shared kernel (``kf_o0``, ``kf_o1``...)."""

_NUMBERED = re.compile(r"^[a-z]+\d+(_\d+)?$")
"""Local names that carry a node or kernel number (``p703``, ``v1184_0``, ``c0``): renamed."""


@dataclass(frozen=True)
class Kernel:
    """One kernel of the file: its name, its text without offsets, and the offsets its pointer
    parameters get at its top (parameter, elements), in the order they are added."""

    name: str
    source: str
    shifts: tuple[tuple[str, int], ...] = ()
    sized: bool = False
    """Whether its launches pass whatever :attr:`Shared.args` names for it (the plan's own launch
    sites and ``forward`` lines; the any-batch and any-size methods, their launch lines rewritten by
    ``render._passing``): only such kernels may share a function with their constants as arguments
    (:func:`share`'s ``constants``)."""


@dataclass
class Shared:
    """What the file holds in place of each kernel, and what its launch sites pass beside."""

    texts: dict[str, str] = field(default_factory=dict)
    """Kernel name → its ``def`` (with offsets as arguments where shared), or ``name = first``."""
    args: dict[str, dict[str, int | float]] = field(default_factory=dict)
    """Kernel name → the arguments its launches pass: offsets (``{"kf_o0": 1009152}``) and, with
    ``constants``, the constants that moved (``"kf_c0": 3136``)."""

    @property
    def functions(self) -> int:
        """How many distinct functions remain (what the compile stage compiles)."""
        return sum(1 for text in self.texts.values() if "def " in text)


def def_name(source: str) -> str:
    """The name of the function a kernel's source defines."""
    match = re.search(r"^def (\w+)\(", source, re.M)
    if match is None:
        raise ValueError("a kernel source without a def")
    return match.group(1)


def _def_line(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("def "))


def with_offsets(kernel: Kernel, as_args: bool) -> tuple[str, dict[str, int | float]]:
    """The kernel's text with its offsets added at its top: constants, or (``as_args``) run-time
    arguments placed after its last argument that is not a ``tl.constexpr`` (their values returned
    for the launch site), numbered in the order of the parameters they move."""
    if not kernel.shifts:
        return kernel.source, {}
    lines = kernel.source.split("\n")
    at = _def_line(lines)
    if not as_args:
        moved = [f"    {param} = {param} + {offset}" for param, offset in kernel.shifts if offset]
        return "\n".join([*lines[: at + 1], *moved, *lines[at + 1 :]]), {}
    try:
        names = [p.split(":")[0].strip() for p in const_args.params_of(lines[at])]
    except ValueError as exc:  # a signature over several lines: not shared
        raise ValueError(f"{kernel.name}: {exc}") from exc
    order = sorted(kernel.shifts, key=lambda s: names.index(s[0]))
    extra = [f"{OFFSET_ARG}{k}" for k in range(len(order))]
    moved = [f"    {param} = {param} + {arg}" for (param, _), arg in zip(order, extra, strict=True)]
    values: dict[str, int | float] = {arg: offset for (_, offset), arg in zip(order, extra, strict=True)}
    return const_args.insert_params("\n".join([*lines[: at + 1], *moved, *lines[at + 1 :]]), extra), values


_PARAMS = re.compile(r"^def \w+\((.*?)\):", re.M | re.S)
_ASSIGNED = re.compile(r"^\s*(\w+(?:\s*,\s*\w+)*)\s*(?:[-+*/%&|^]|//|<<|>>)?=(?!=)", re.M)
_LOOPED = re.compile(r"^\s*for\s+(\w+(?:\s*,\s*\w+)*)\s+in\b", re.M)


def _locals(source: str) -> set[str]:
    """The numbered parameters and assigned names of the function in ``source`` (the emitters
    write one statement a line: ``name = ...``, ``a, b = ...``, ``for name in ...``)."""
    names: set[str] = set()
    match = _PARAMS.search(source)
    if match is not None:
        names.update(p.split(":")[0].split("=")[0].strip() for p in match.group(1).split(","))
    for pattern in (_ASSIGNED, _LOOPED):
        for found in pattern.finditer(source):
            names.update(n.strip() for n in found.group(1).split(","))
    return {n for n in names if _NUMBERED.match(n)}


def canonical(source: str, name: str) -> str:
    """``source`` (one ``@triton.jit`` function named ``name``) with the function named ``KF``
    and its numbered locals renamed ``<letters>_<k>`` in the order they first appear. Attribute
    names (``tl.int64``) are left alone, and so are names that are not the function's own
    (helpers, module constants). A keyword of a call spelt as a local (``c0=``, where statements
    spell ``c0 = ``) would be renamed with it: such a kernel raises ``ValueError`` and is kept as it is."""
    text = re.sub(rf"^def {re.escape(name)}\(", "def KF(", source, count=1, flags=re.M)
    local = _locals(text)
    if not local:
        return text
    renamed: dict[str, str] = {}

    def rename(found: re.Match[str]) -> str:
        old = found.group(0)
        if old not in renamed:
            renamed[old] = f"{old.rstrip('0123456789_')}_{len(renamed)}"
        return renamed[old]

    if any(found.group(1) in local for found in _KEYWORD.finditer(text)):
        raise ValueError("a local's name is also a keyword of a call")  # kept as it is
    return _WORD.sub(lambda found: rename(found) if found.group(0) in local else found.group(0), text)


_WORD = re.compile(r"(?<![.\w])\w+")
"""A whole name (or number) that is not an attribute: one pattern for every kernel (a pattern of
each kernel's own names was compiled per kernel, a third of a whole model's sharing)."""
_KEYWORD = re.compile(r"(?<![.\w])(\w+)=(?!=)")


def _named(text: str, name: str) -> str:
    return re.sub(r"^def KF\(", f"def {name}(", text, count=1, flags=re.M)


def share(kernels: Sequence[Kernel], constants: bool = False, floats: bool = False) -> Shared:
    """Group ``kernels`` (in the file's order) by canonical form: the first of each group of two or
    more is emitted in that form under its own name (offsets as arguments), the others become its
    names; a kernel alone keeps its text with constant offsets.

    ``constants``: kernels launched with :attr:`Shared.args` (``Kernel.sized``) are grouped by
    their canonical form with every integer constant that may be a run-time value left out
    (``const_args.py``); where the members of a group differ in such a constant, it becomes an
    argument (``kf_c0``...) that each launch passes with its own value; ``floats``: float constants
    too (only where every tensor of the kernels is fp32, see ``const_args.numbers``)."""
    groups: dict[str, list[Kernel]] = {}
    forms: dict[str, tuple[str, dict[str, int | float], str]] = {}
    found: dict[str, list[tuple[const_args.Number, bool]]] = {}
    for kernel in kernels:
        try:
            text, values = with_offsets(kernel, as_args=True)
            form = canonical(text, kernel.name)
            key = form
            if constants and kernel.sized:
                found[kernel.name] = const_args.numbers(form, floats)
                key = "sized:" + const_args.skeleton(form, found[kernel.name])
        except ValueError:
            form = key = f"alone:{kernel.name}"  # kept as it is
            values = {}
        forms[kernel.name] = (key, values, form)
        groups.setdefault(key, []).append(kernel)
    shared = Shared()
    moved: dict[str, tuple[str, dict[str, dict[str, int | float]]]] = {}
    """Group key → the first member's text with its differing constants as arguments, and each
    member's values of them."""
    for kernel in kernels:
        key, values, form = forms[kernel.name]
        members = groups[key]
        if len(members) == 1 or key.startswith("alone:"):
            shared.texts[kernel.name] = with_offsets(kernel, as_args=False)[0]
            continue
        first = members[0]
        if key.startswith("sized:"):
            if key not in moved:
                moved[key] = _lifted([forms[m.name][2] for m in members], [m.name for m in members], found)
            text, by_member = moved[key]
            values = {**values, **by_member[kernel.name]}
        else:
            text = form
        if kernel is first:
            shared.texts[kernel.name] = _named(text, kernel.name).rstrip("\n")
        else:
            shared.texts[kernel.name] = f"{kernel.name} = {first.name}"
        if values:
            shared.args[kernel.name] = values
    return shared


def _lifted(
    forms: Sequence[str], names: Sequence[str], found: Mapping[str, list[tuple[const_args.Number, bool]]]
) -> tuple[str, dict[str, dict[str, int | float]]]:
    """The first of ``forms`` (canonical texts of one skeleton) with the movable constants whose
    values differ between them as arguments (one argument for constants whose values go together
    in every member), and each member's values (by ``names``)."""
    movable = [[n for n, ok in found[name] if ok] for name in names]
    differs = [j for j in range(len(movable[0])) if len({found[j].value for found in movable}) > 1]
    # positions whose values go together in every member: one argument (typed: 3136 and 3136.0
    # are equal in Python, but an int offset and a float divisor are not one argument)
    named: dict[tuple[tuple[str, int | float], ...], str] = {}
    args = {
        j: named.setdefault(
            tuple((type(found[j].value).__name__, found[j].value) for found in movable),
            f"{const_args.CONST_ARG}{len(named)}",
        )
        for j in differs
    }
    text = const_args.with_args(forms[0], {movable[0][j]: arg for j, arg in args.items()})
    values = {name: {a: found[j].value for j, a in args.items()} for name, found in zip(names, movable, strict=True)}
    return text, values


def alone(kernels: Sequence[Kernel]) -> Shared:
    """Every kernel a function of its own, with its constant offsets (what :func:`share` is compared with)."""
    return Shared(texts={kernel.name: with_offsets(kernel, as_args=False)[0] for kernel in kernels})
