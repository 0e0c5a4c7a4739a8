"""Which GPUs evaluators use: the machine's GPUs, the ``--gpus``/``--gpu`` selection, and sizing.

GPUs are numbered as CUDA numbers them in this environment: the GPUs ``nvidia-smi`` lists,
narrowed and reordered by ``CUDA_VISIBLE_DEVICES`` when it is set (indices or ``GPU-`` UUIDs).
Each selected GPU is pinned by its UUID (``CUDA_VISIBLE_DEVICES=GPU-…`` in its evaluator's
workers), so the pin holds whatever order CUDA enumerates devices in. Nothing here starts CUDA.

``--gpus`` forms: ``all`` (every visible GPU), ``N`` (the first N), ``I,J,…`` (those indices; one
index alone is written ``I,``). Compile workers are the machine's cores shared between the
evaluators of this machine, at least one each; spares are sized per device by its own memory
plan (measured in a worker pinned to that device).
"""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from actors.runtime.errors import ConfigError
from gpu_runner.config import usable_cores


@dataclass(frozen=True)
class Gpu:
    """One GPU as this machine shows it."""

    index: int
    """Its number among the visible GPUs (what ``--gpus`` and ``--gpu`` take)."""
    uuid: str
    """``GPU-…``: what its evaluator's workers are pinned to."""
    name: str
    """Device name, e.g. ``NVIDIA H200``."""
    memory_bytes: int
    """Total device memory."""

    def label(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.uuid})"


def parse_smi(text: str) -> list[Gpu]:
    """The rows of ``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits``
    (memory in MiB), numbered physically."""
    gpus: list[Gpu] = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit() or not parts[1].startswith(("GPU-", "MIG-")):
            raise ConfigError(f"unexpected nvidia-smi line: {line!r}")
        memory = int(parts[3]) << 20 if parts[3].isdigit() else 0
        gpus.append(Gpu(index=int(parts[0]), uuid=parts[1], name=parts[2], memory_bytes=memory))
    return gpus


def visible(physical: Sequence[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """``physical`` as CUDA sees it under ``CUDA_VISIBLE_DEVICES`` (``None``: unset, all of them),
    renumbered from 0. Like CUDA, the list ends at its first entry that names no GPU."""
    if cuda_visible_devices is None:
        chosen = list(physical)
    else:
        chosen = []
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            if entry.isdigit():
                match = [g for g in physical if g.index == int(entry)]
            elif entry.startswith(("GPU-", "MIG-")):
                match = [g for g in physical if g.uuid.startswith(entry)]
            else:
                match = []
            if len(match) != 1 or match[0] in chosen:
                break
            chosen.append(match[0])
    return [Gpu(index=i, uuid=g.uuid, name=g.name, memory_bytes=g.memory_bytes) for i, g in enumerate(chosen)]


def list_gpus(env: Mapping[str, str] | None = None) -> list[Gpu]:
    """The GPUs visible here (empty without ``nvidia-smi`` or a GPU)."""
    environ = os.environ if env is None else env
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return visible(parse_smi(out.stdout), environ.get("CUDA_VISIBLE_DEVICES"))


class SelectionKind(enum.StrEnum):
    """The forms of ``--gpus``."""

    ALL = "all"
    """Every visible GPU."""
    COUNT = "count"
    """The first N visible GPUs."""
    INDICES = "indices"
    """The listed GPUs."""


@dataclass(frozen=True)
class GpuSelection:
    """A parsed ``--gpus`` value (checked against the machine by :func:`select_gpus`)."""

    kind: SelectionKind
    text: str
    count: int | None = None
    indices: tuple[int, ...] = ()


def parse_selection(text: str) -> GpuSelection:
    """Parse ``all``, ``N`` or ``I,J,…`` (one index: ``I,``); a bad value is a one-line error."""
    value = text.strip().lower()
    if value == "all":
        return GpuSelection(SelectionKind.ALL, text)
    if "," not in value:
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"--gpus {text}: expected all, a number of GPUs (>= 1) or a list of indices such as 0,2 (one: 3,)"
            )
        return GpuSelection(SelectionKind.COUNT, text, count=int(value))
    entries = [e.strip() for e in value.split(",")]
    if entries and entries[-1] == "":
        entries.pop()  # "3," is the list holding GPU 3
    if not entries or not all(e.isdigit() for e in entries):
        raise ConfigError(f"--gpus {text}: GPU indices are numbers >= 0 separated by commas, such as 0,2")
    indices = tuple(int(e) for e in entries)
    seen: set[int] = set()
    for i in indices:
        if i in seen:
            raise ConfigError(f"--gpus {text}: GPU {i} is listed twice (one evaluator per GPU)")
        seen.add(i)
    return GpuSelection(SelectionKind.INDICES, text, indices=indices)


def _machine(gpus: Sequence[Gpu]) -> str:
    names = sorted({g.name for g in gpus})
    return f"{len(gpus)} GPU(s) visible here: {', '.join(str(g.index) for g in gpus)} ({'; '.join(names)})"


def select_gpus(selection: GpuSelection, gpus: Sequence[Gpu], *, option: str = "--gpus") -> list[Gpu]:
    """The GPUs ``selection`` names among ``gpus`` (the visible ones), or a one-line error."""
    if not gpus:
        raise ConfigError(
            f"{option} {selection.text}: no GPU is visible here (nvidia-smi finds none, or CUDA_VISIBLE_DEVICES "
            f"hides them); drop {option} or use --device cpu"
        )
    if selection.kind is SelectionKind.ALL:
        return list(gpus)
    if selection.kind is SelectionKind.COUNT:
        assert selection.count is not None
        if selection.count > len(gpus):
            raise ConfigError(f"{option} {selection.text}: asks for {selection.count} GPUs, {_machine(gpus)}")
        return list(gpus[: selection.count])
    by_index = {g.index: g for g in gpus}
    for i in selection.indices:
        if i not in by_index:
            raise ConfigError(f"{option} {selection.text}: there is no GPU {i}; {_machine(gpus)}")
    return [by_index[i] for i in selection.indices]


def select_one(index: int, gpus: Sequence[Gpu]) -> Gpu:
    """``--gpu K`` of a hand-started evaluator."""
    if index < 0:
        raise ConfigError(f"--gpu {index}: a GPU index is a number >= 0")
    return select_gpus(GpuSelection(SelectionKind.INDICES, str(index), indices=(index,)), gpus, option="--gpu")[0]


BUSY_CORES = 8
"""Cores of its own from which a GPU's evaluator judges more candidates at once by default."""


def evaluator_sizing(on_gpu: bool, cores: int) -> tuple[int, int]:
    """(candidates one evaluator judges at once, spares it keeps ready) by default, for an
    evaluator with ``cores`` of its own: 4 and 3 on a GPU with at least :data:`BUSY_CORES`, else 2
    and 2; the memory plan still cuts spares to what fits. Measured on an H100 with 16 cores, each
    pair warm and one after the other: 45 s of KernelBench L1-2 evaluated 23 candidates instead of
    19 (0.818 against 0.659 per second; the GPU held 72% of the time instead of 57%), L1-3, already
    bound by the GPU, 19 instead of 18 (87% against 77%); scale_bench's 1 GB row sum streamed 1.58
    candidates/s with 3 spares against 1.08 with 2."""
    return (4, 3) if on_gpu and cores >= BUSY_CORES else (2, 2)


def compile_workers_per_gpu(n_gpus: int, cores: int | None = None) -> int:
    """Compile processes each of ``n_gpus`` evaluators of one machine gets: its fair share of the
    cores, at least one."""
    if n_gpus < 1:
        raise ConfigError(f"evaluators per machine must be >= 1, got {n_gpus}")
    total = cores if cores is not None else usable_cores()
    return max(1, total // n_gpus)
