"""A small model of the target GPU (SM count, DRAM bandwidth, shared memory, tensor-core peaks)
and the first configurations it implies for the template families.

Where the model comes from, first hit wins: the device name of a result already measured (the
parent's ``DeviceInfo``), then ``torch.cuda.get_device_properties`` when this process already has
CUDA started (never started here: an expert must not create a CUDA context beside the evaluator),
then ``nvidia-smi``'s device name, each looked up in :data:`TABLE` (H100, H200, A100); a GPU not in
the table keeps its SM count and shared memory from its properties with H100-class peaks. With no
GPU at all, :data:`CPU_FALLBACK` (which still gives sensible tiles).

The families ask it for starting points only (``tuning.default_params``): matrix tiles that give
every SM work (:meth:`GpuModel.mm_tiles`), rows per program that keep every SM busy when rows are
few and long (:meth:`GpuModel.rows_per_program`), a vector width of 16 bytes
(:meth:`GpuModel.vector_width`), pipelining stages that fit shared memory
(:meth:`GpuModel.stages_that_fit`), split-K when the tiles of a long-K product cannot fill the
machine (:meth:`GpuModel.split_k`), and the three-pass TF32 dot for fp32 products and
convolutions where tensor cores make it pay (:attr:`GpuModel.tf32x3_pays`; a candidate the
precision check rejects is repaired back to ``ieee`` by the ``incorrect.precision`` mutation).
"""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
from dataclasses import dataclass, replace

from actors.runtime.logs import get_logger

log = get_logger(__name__)


SPLIT_STEPS = 512
"""Most ``BLOCK_K`` steps one program's sequential fp32 sum should take before K is split."""


@dataclass(frozen=True)
class GpuModel:
    """The figures of a device that decide first configurations."""

    name: str
    sm_count: int
    dram_gbps: float
    """Achievable DRAM bandwidth, GB/s."""
    smem_per_block: int
    """Largest shared memory one program may use, bytes."""
    l2_bytes: int
    fp32_tflops: float
    """CUDA-core fp32 peak (no tensor cores)."""
    tf32_tflops: float
    """Dense TF32 tensor-core peak."""
    bf16_tflops: float
    """Dense 16-bit tensor-core peak."""
    max_threads_per_sm: int = 2048
    is_gpu: bool = True
    """False for the CPU fallback: first configurations are then left as the shapes alone pick them."""

    def vector_width(self, dtype_bytes: int) -> int:
        """Elements per thread for one 16-byte access (the widest global load)."""
        return max(1, min(16, 16 // max(1, dtype_bytes)))

    def mm_tiles(self, m: int, n: int, batch: int = 1) -> tuple[int, int]:
        """The largest (BLOCK_M, BLOCK_N) of 128x128, 128x64, 64x64, 64x32, 32x32 whose tiles
        fill every SM at least once (the smallest when none does)."""
        options = ((128, 128), (128, 64), (64, 64), (64, 32), (32, 32))
        for bm, bn in options:
            if batch * math.ceil(m / bm) * math.ceil(n / bn) >= self.sm_count:
                return bm, bn
        return options[-1]

    def rows_per_program(self, rows: int, row_tile: int, *, most: int = 32) -> int:
        """Rows per program (a power of two): as many as fit a tile of 2048 elements, but never
        so many that fewer than two programs per SM remain."""
        by_tile = max(1, min(most, 2048 // max(1, row_tile)))
        by_sms = max(1, rows // (2 * self.sm_count))
        fit = max(1, min(by_tile, by_sms))
        return 1 << (fit.bit_length() - 1)

    def stages_that_fit(self, bm: int, bn: int, bk: int, dtype_bytes: int, *, most: int = 4) -> int:
        """Pipelining stages whose A and B tiles fit in shared memory (at least 1)."""
        per_stage = (bm * bk + bk * bn) * dtype_bytes
        return max(1, min(most, self.smem_per_block // max(1, per_stage)))

    def split_k(self, m: int, n: int, k: int, tile: tuple[int, int, int]) -> int:
        """Slices of K for one (m x k) @ (k x n) product in ``tile`` = (BLOCK_M, BLOCK_N, BLOCK_K):
        1 when the tiles alone fill every SM or K is short; else a power of two (at most 128)
        that gives every SM two programs and leaves each slice at most ``SPLIT_STEPS`` K steps,
        since one long sequential fp32 sum is what loses accuracy (KernelBench L1-6)."""
        bm, bn, bk = tile
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        steps = math.ceil(k / bk)
        if tiles >= self.sm_count or steps <= SPLIT_STEPS:
            return 1
        want = max(math.ceil(2 * self.sm_count / tiles), math.ceil(steps / SPLIT_STEPS))
        return min(128, 1 << (want - 1).bit_length())

    @property
    def tf32x3_pays(self) -> bool:
        """Whether three TF32 tensor-core passes (fp32-accurate: the float64-based precision check
        judges them like any kernel) beat the fp32 CUDA cores with room to spare."""
        return self.is_gpu and self.tf32_tflops >= 4.5 * self.fp32_tflops

    def limits_text(self) -> str:
        """The device and its limits in one line (LLM prompts name the GPU they write for)."""
        if not self.is_gpu:
            return "no GPU visible: kernels run under Triton's CPU interpreter (timings are not speedups)"
        return (
            f"{self.name}: {self.sm_count} SMs, {self.dram_gbps:.0f} GB/s DRAM, "
            f"{self.smem_per_block // 1024} KB shared memory per block, {self.l2_bytes >> 20} MB L2, "
            f"{self.max_threads_per_sm} threads per SM; dense peaks fp32 {self.fp32_tflops:g}, "
            f"TF32 {self.tf32_tflops:g}, bf16 {self.bf16_tflops:g} TFLOP/s"
        )

    def elementwise_warps(self, numel: int, ept: int) -> int:
        """Warps per elementwise program: 8 when there is work for two programs per SM at that
        size, fewer for small tensors so that every SM still gets a program."""
        for warps in (8, 4, 2):
            if numel // (32 * warps * ept) >= 2 * self.sm_count:
                return warps
        return 1


TABLE: dict[str, GpuModel] = {
    "H200": GpuModel("H200", 132, 4300.0, 232_448, 60 << 20, 60.0, 494.0, 989.0),
    "H100": GpuModel("H100", 132, 3350.0, 232_448, 50 << 20, 67.0, 494.0, 989.0),
    "A100": GpuModel("A100", 108, 2039.0, 166_912, 40 << 20, 19.5, 156.0, 312.0),
}
"""Known devices (SXM parts), matched by substring of the device name; H200 before H100."""

CPU_FALLBACK = GpuModel("cpu", 16, 50.0, 65_536, 32 << 20, 1.0, 1.0, 1.0, is_gpu=False)
"""No GPU visible (Triton's interpreter times nothing worth fitting): shapes alone decide."""


def lookup(name: str | None) -> GpuModel | None:
    """The table's model for a device name (``NVIDIA H100 80GB HBM3`` → H100), if known."""
    if not name:
        return None
    for key, model in TABLE.items():
        if key in name.upper():
            return model
    return None


def from_properties(name: str, sm_count: int, smem_per_block: int | None, l2_bytes: int | None) -> GpuModel:
    """A model from a device's properties: the table's peaks where the name is known (else
    H100-class peaks), with the device's own SM count and memories."""
    base = lookup(name) or replace(TABLE["H100"], name=name)
    return replace(
        base,
        sm_count=sm_count or base.sm_count,
        smem_per_block=smem_per_block or base.smem_per_block,
        l2_bytes=l2_bytes or base.l2_bytes,
    )


def _torch_properties() -> GpuModel | None:
    try:
        import torch
    except ImportError:
        return None
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return from_properties(
        props.name,
        int(props.multi_processor_count),
        int(getattr(props, "shared_memory_per_block_optin", 0) or 0) or None,
        int(getattr(props, "L2_cache_size", 0) or 0) or None,
    )


def _nvidia_smi_name() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi gave no device name", error=str(exc)[:200])
        return None
    first = out.stdout.strip().splitlines()
    return first[0].strip() if first else None


@functools.cache
def _local() -> GpuModel:
    found = _torch_properties()
    if found is not None:
        return found
    name = _nvidia_smi_name()
    if name:
        return lookup(name) or replace(TABLE["H100"], name=name)
    return CPU_FALLBACK


def detect(measured_on: str | None = None) -> GpuModel:
    """The model of the target device: ``measured_on`` (a result's device name) when it is a
    GPU the table knows, else this machine's GPU, else the CPU fallback (module docstring)."""
    known = lookup(measured_on)
    return known if known is not None else _local()
