"""Where the runs of a bench that keeps several going at once (``--parallel``) are started.

Each slot is a group of GPUs and a share of the cores. Runs side by side never share a GPU: two
timings on one GPU at once would disturb each other. Nothing here starts CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from actors.kbench.errors import BenchError
from actors.runtime.gpus import Gpu


@dataclass(frozen=True)
class Slot:
    """Where one of the runs a bench keeps going at once is started: its GPUs and its cores.

    A slot without GPUs leaves the run whatever the bench sees (every visible GPU, or the CPU); one
    with GPUs hides the others from the run (``CUDA_VISIBLE_DEVICES`` set to their UUIDs), so runs
    side by side never time on one GPU together. ``cores`` is applied by the thread that starts
    the slot's runs (its CPU affinity, which the run's processes inherit)."""

    index: int = 0
    gpus: tuple[Gpu, ...] = ()
    cores: frozenset[int] | None = None

    def label(self) -> str:
        if self.gpus:
            return "GPU " + ",".join(str(g.index) for g in self.gpus)
        if self.cores:
            return f"cores {_ranges(sorted(self.cores))}"
        return "this machine"

    def describe(self) -> str:
        """The label, with the cores of a slot that has GPUs."""
        if not self.gpus:
            return self.label()
        return f"{self.label()} with {len(self.cores)} cores" if self.cores else f"{self.label()} with every core"

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base, PYTHONUNBUFFERED="1")
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in self.gpus)
        return env


def _ranges(values: list[int]) -> str:
    """Sorted ``[0, 1, 2, 5]`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def plan_slots(parallel: int, device: str, gpus: Sequence[Gpu], cores: Sequence[int]) -> list[Slot]:
    """Where ``parallel`` runs at once go: ``gpus`` (the visible ones; none for CPU runs) split
    into equal groups in order, ``cores`` likewise. One run at a time keeps the whole machine."""
    if parallel < 1:
        raise BenchError(f"--parallel {parallel}: must be at least 1")
    if parallel == 1:
        return [Slot()]
    if parallel > len(cores):
        raise BenchError(f"--parallel {parallel}: this process may use {len(cores)} core(s); at most one run per core")
    if device == "cuda" and not gpus:
        raise BenchError(f"--parallel {parallel} --device cuda: no GPU is visible here")
    if device != "cpu" and gpus and parallel > len(gpus):
        raise BenchError(
            f"--parallel {parallel}: {len(gpus)} GPU(s) visible here, and runs side by side never share one "
            "(their timings would disturb each other)"
        )
    use_gpus = device != "cpu" and bool(gpus)
    per_gpu = len(gpus) // parallel if use_gpus else 0
    per_core = len(cores) // parallel
    ordered = sorted(cores)
    return [
        Slot(
            index=k,
            gpus=tuple(gpus[k * per_gpu : (k + 1) * per_gpu]),
            cores=frozenset(ordered[k * per_core : (k + 1) * per_core]),
        )
        for k in range(parallel)
    ]
