"""Where a rendered ``forward`` keeps its intermediates: one buffer per dtype, reused as they die.

Each ``torch.empty`` cost a forward about 7 us of host time on an H200 machine, as much as half a
kernel launch: ResNet18 (KernelBench L3-9) allocated about 100 intermediates a call. The
intermediates that only kernels read and write (no PyTorch op, shape check or output touches
them) and the scratch buffers of a launch (``Launch.work``) live instead in one buffer of their
dtype, allocated once per call: each at an offset of its own while it is live, from the kernel
that writes it to the last kernel that reads it, and its space reused by later ones (first fit,
in the order they appear). A kernel passed such a tensor gets the buffer and adds the offset to
its pointer at its top (``share.py``: as a constant, or as an argument of its launches where
kernels of the same code share one function); offsets are multiples of 64 elements, so pointers keep the 16-byte
alignment Triton specialises on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from actors.experts.template.emit import Launch

ALIGN = 64
"""Offsets and sizes in the buffer are multiples of this many elements."""


@dataclass
class Arena:
    """The placement: member name (``_bN``, ``_xcN``...) → (buffer name, element offset)."""

    slots: dict[str, tuple[str, int]] = field(default_factory=dict)
    sizes: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Buffer name → (dtype, elements)."""
    shifts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    """Kernel name → (pointer parameter, element offset) added at its top: constants in its text,
    or run-time arguments where it shares its text with other kernels (``share.py``)."""
    args: dict[str, dict[str, int | float]] = field(default_factory=dict)
    """Kernel name → the offsets its launches pass as arguments (``{"kf_o0": 1009152}``)."""

    def arg(self, name: str) -> str:
        """What ``forward`` passes for ``name``: its buffer, or itself."""
        slot = self.slots.get(name)
        return slot[0] if slot else name


def positional(launch: Launch) -> list[str]:
    """The forward-side names a launch passes positionally, in its kernel's parameter order."""
    return [*launch.lead_args, *(f"_b{b}" for b in launch.pointers)]


def _params(source: str) -> list[str]:
    """The parameter names of a kernel source's ``def``."""
    match = re.search(r"^def \w+\((.*?)\):", source, re.M | re.S)
    if match is None:
        return []
    return [p.split(":")[0].strip() for p in match.group(1).split(",") if p.strip()]


def place(
    stages: list[list[Launch]], members: Mapping[str, tuple[int, tuple[int, ...], str]], texts: list[str]
) -> Arena:
    """Place ``members`` (name → (kernel index that allocates it, shape, dtype)). ``stages``: each
    kernel's launches in order; ``texts``: every other forward line, where a member named in one
    stays a tensor of its own (``torch.empty``)."""
    blob = "\n".join(texts)
    last: dict[str, int] = {}
    uses: dict[str, list[tuple[str, str]]] = {}
    for i, kernel in enumerate(stages):
        for stage in kernel:
            params = _params(stage.source)
            for pos, name in enumerate(positional(stage)):
                if name not in members:
                    continue
                last[name] = i
                param = params[pos] if pos < len(params) else ""
                uses.setdefault(name, []).append((stage.name, param))
    arena = Arena()
    live: dict[str, list[tuple[int, int, int]]] = {}  # buffer -> (offset, size, last kernel)
    for name, (first, shape, dtype) in members.items():
        if name not in last or re.search(rf"\b{name}\b", blob):
            continue
        if any(not param.isidentifier() for _, param in uses[name]):
            continue
        size = max(ALIGN, math.ceil(math.prod(shape) / ALIGN) * ALIGN)
        buffer = f"_ws_{dtype}"
        blocks = sorted(b for b in live.get(buffer, []) if b[2] >= first)
        offset = 0
        for start, length, _ in blocks:
            if offset + size <= start:
                break
            offset = max(offset, start + length)
        live[buffer] = [*blocks, (offset, size, last[name])]
        arena.slots[name] = (buffer, offset)
        end = offset + size
        arena.sizes[buffer] = (dtype, max(end, arena.sizes.get(buffer, (dtype, 0))[1]))
        for stage_name, param in uses[name]:
            # at offset 0 too: a kernel is then the same code as one whose buffer lies elsewhere
            # (``share.py`` passes both offsets; a kernel alone adds no line for it)
            arena.shifts.setdefault(stage_name, []).append((param, offset))
    return arena
