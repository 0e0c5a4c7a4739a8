"""Helpers shared by the worker's stages: tensors to the wire, output checks, device facts.

Runs inside the sandboxed worker: imports only the stdlib, numpy, psutil and torch.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from gpu_runner.frames import Op, Report, decode_op
from gpu_runner.probe import cpu_name
from gpu_runner.protocol import (
    BULK_MIN_BYTES,
    WIRE_DTYPES,
    Blob,
    WireTensor,
    read_frame,
    tensor_meta,
    write_bulk,
    write_frame,
)

# Memory bandwidth (GB/s) and arithmetic ceilings (TFLOP/s, dense: fp32 on CUDA cores, TF32 and
# 16-bit on tensor cores), SXM parts unless named.
PEAKS: tuple[tuple[str, float, float, float, float], ...] = (
    ("H200", 4300.0, 60.0, 494.0, 989.0),
    ("H100 PCIe", 2000.0, 51.0, 378.0, 756.0),
    ("H100", 3350.0, 67.0, 494.0, 989.0),
    ("A100-SXM4-80GB", 2039.0, 19.5, 156.0, 312.0),
    ("A100", 1555.0, 19.5, 156.0, 312.0),
    ("L40S", 864.0, 91.6, 91.6, 362.0),
)
TF32_PASSES = 3
"""The evaluator accepts any scheme as accurate as the reference against float64: for fp32
contractions that includes three TF32 tensor-core passes (``tl.dot(..., input_precision="tf32x3")``),
so the fp32 ceiling is the faster of the CUDA cores and a third of the TF32 peak. With the CUDA-core
figure alone, honest tf32x3 GEMMs on an H100 (1.54x over eager) measured 117% of speed-of-light
and were all flagged for review."""


TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
"""Torch dtypes by the names the wire and the metadata use."""


class Channel:
    """The worker's end of the pipe to the parent (large tensors go as files in the bulk directory)."""

    def __init__(self, in_fd: int, out_fd: int, bulk_dir: str | None = None, share_fd: int = -1) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.bulk_dir = bulk_dir
        self.share_fd = share_fd
        """The share socket (-1: none): a spare sends its shared outputs' descriptors and closes it;
        the judge receives descriptors over it (:mod:`gpu_runner.sandboxed.shared_slots`)."""
        self.seq = 0
        self.gpu_held = False
        """Whether this process holds the parent's (shared) GPU lease now."""

    def next_op(self) -> Op:
        """Wait for the parent's next op (its fields checked against :data:`gpu_runner.frames.OPS`)."""
        return self.next()[0]

    def next(self) -> tuple[Op, dict[str, Any]]:
        """Wait for the parent's next op: the op and its whole header (fields checked)."""
        header, _ = read_frame(self.in_fd)
        return decode_op(header), header

    def send_bulk(self, kind: Report, bulk: list[dict[str, Any]], **fields: Any) -> None:
        """A frame whose tensors already lie in bulk files (see :class:`OutputSlots`)."""
        write_frame(self.out_fd, {"kind": kind, **fields, "bulk": bulk})

    def send(self, kind: Report, *, blobs: Sequence[Blob] = (), **fields: Any) -> None:
        header: dict[str, Any] = {"kind": kind, **fields}
        if self.bulk_dir and sum(memoryview(b).nbytes for b in blobs) > BULK_MIN_BYTES:
            self.seq += 1
            header["bulk"] = write_bulk(self.bulk_dir, self.seq, blobs)
            blobs = ()
        write_frame(self.out_fd, header, blobs)

    def close_share(self) -> None:
        """Close the share socket (a spare does before any candidate code is loaded)."""
        if self.share_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.share_fd)
            self.share_fd = -1

    @contextlib.contextmanager
    def gpu_lease(self, device: torch.device) -> Iterator[None]:
        """Hold the parent's GPU lease (the one timing holds) around GPU-heavy work; a no-op on the CPU."""
        self.acquire_gpu(device)
        try:
            yield
        finally:
            self.release_gpu(device)

    def acquire_gpu(self, device: torch.device) -> None:
        """Wait for the parent's (shared) GPU lease; a no-op on the CPU or while held."""
        if device.type != "cuda" or self.gpu_held:
            return
        self.send(Report.GPU_ACQUIRE)
        op = self.next_op()
        if op is not Op.GPU_GRANTED:
            raise RuntimeError(f"expected the GPU lease, got {op.value!r}")
        self.gpu_held = True

    def release_gpu(self, device: torch.device) -> None:
        """Finish this process's GPU work, then give the lease back; a no-op unless held."""
        if not self.gpu_held:
            return
        sync(device)
        self.send(Report.GPU_RELEASE)
        self.gpu_held = False


class Laps:
    """Durations of consecutive steps (seconds by name), reported to the parent for its logs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        """Add the time since the previous lap (or the start) to ``name``."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


def sync(device: torch.device) -> None:
    """Wait for all work on the device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_wire(t: torch.Tensor) -> WireTensor:
    """A tensor's bytes on the host, in a dtype the parent accepts."""
    t = t.detach().to("cpu").contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name not in WIRE_DTYPES:
        t = t.to(torch.float64)
        name = "float64"
    if name == "bfloat16":
        t = t.view(torch.int16)
    return WireTensor(dtype=name, shape=tuple(t.shape), data=t.numpy().reshape(-1).view("u1").data)


def pack(tensors: Sequence[torch.Tensor]) -> tuple[list[dict[str, Any]], list[Blob]]:
    """Wire metadata and blobs for a list of tensors."""
    wires = [to_wire(t) for t in tensors]
    return [w.meta() for w in wires], [w.data for w in wires]


class OutputSlots:
    """Page-locked host files for tensors that go to the parent: made before the GPU is needed.

    One file per trial and tensor in the bulk directory (tmpfs where there is one), sized from
    ``templates`` (per trial, the tensors to expect), mapped, every page touched and, on CUDA,
    page-locked. A trial's tensors then go from the device into their files in one DMA copy,
    and the frame carries only the file names; the parent reads (and unlinks) them as any bulk
    file. Used for the candidate's trial outputs (on the H200, copying 64 MB outputs to fresh
    host memory and writing them to tmpfs took 0.5-1.2 s of the GPU window per candidate) and
    for the reference's outputs and float64 residuals (pageable copies held a spare's GPU lease
    0.5-0.6 s for 640 MB; page-locked, 0.012 s: bench/prep_probe.py). Tensors that do not match
    the templates' shapes and dtypes go the usual way.
    """

    def __init__(
        self,
        directory: str,
        templates: Sequence[Sequence[torch.Tensor]],
        device: torch.device,
        prefix: str = "slot",
        prefault: bool = True,
    ) -> None:
        """``prefault=False`` maps the files without touching or page-locking them: for outputs of
        gigabytes, pinning costs more (about 0.6 s per GB, H200) than the pageable copy it saves."""
        import mmap

        self.slots: dict[tuple[int, int], tuple[str, torch.Tensor]] = {}
        """(trial, index) -> (file name, host tensor over the file's mapping; it keeps the mapping alive)."""
        self.pinned = 0
        """How many slots CUDA page-locked (the others are copied into as pageable memory)."""
        self._registered: list[torch.Tensor] = []
        for t, outs in enumerate(templates):
            for i, ref in enumerate(outs):
                nbytes = ref.numel() * ref.element_size()
                if str(ref.dtype).removeprefix("torch.") not in WIRE_DTYPES:
                    continue
                fname = f"{prefix}{t}_{i}"
                fd = os.open(os.path.join(directory, fname), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    if nbytes:
                        os.ftruncate(fd, nbytes)
                        mm = mmap.mmap(fd, nbytes)
                finally:
                    os.close(fd)
                if not nbytes:  # an empty file (nothing to map): e.g. no float64 residual for an integer output
                    self.slots[(t, i)] = (fname, torch.empty(ref.shape, dtype=ref.dtype))
                    continue
                host = torch.frombuffer(mm, dtype=ref.dtype, count=ref.numel()).view(ref.shape)
                if not prefault:
                    self.slots[(t, i)] = (fname, host)
                    continue
                host.view(-1).view(torch.uint8).zero_()  # every page in now, not in the copy
                if device.type == "cuda" and register_host(host):
                    self.pinned += 1
                    self._registered.append(host)
                self.slots[(t, i)] = (fname, host)

    def fill(
        self, trial: int, tensors: Sequence[torch.Tensor]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """Copy a trial's tensors into their files: (tensor metadata, bulk references), or None."""
        picked = [self.slots.get((trial, i)) for i in range(len(tensors))]
        if not tensors or any(
            slot is None or slot[1].shape != t.shape or slot[1].dtype != t.dtype
            for slot, t in zip(picked, tensors, strict=True)
        ):
            return None
        metas, refs = [], []
        for slot, t in zip(picked, tensors, strict=True):
            assert slot is not None
            fname, host = slot
            host.copy_(t.detach())
            nbytes = host.numel() * host.element_size()
            metas.append(tensor_meta(str(t.dtype).removeprefix("torch."), t.shape, nbytes))
            refs.append({"file": fname, "nbytes": nbytes})
        return metas, refs

    def release(self) -> None:
        """Unlock and unmap every slot; the files stay until the parent reads them."""
        for host in self._registered:
            unregister_host(host)
        self._registered.clear()
        self.slots.clear()


def register_host(t: torch.Tensor) -> bool:
    """Page-lock a host tensor's memory in place (CUDA), so copies to and from it are DMA; False if refused."""
    nbytes = t.numel() * t.element_size()
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)  # type: ignore[no-untyped-call]
    if int(rc) != 0:
        _clear_cuda_error()
    return int(rc) == 0


def _clear_cuda_error() -> None:
    """Reset the runtime's last error, which a refused registration sets and torch's next kernel
    launch check would otherwise report as that launch's failure (torch binds no cudaGetLastError)."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "libcudart.so" in line), None)
        if path is not None:
            ctypes.CDLL(path).cudaGetLastError()
    except (OSError, AttributeError):
        pass


def unregister_host(t: torch.Tensor) -> None:
    """Undo :func:`register_host`."""
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())  # type: ignore[no-untyped-call]


_CHECKSUM_PRIME = 65521
_WEIGHTS: dict[tuple[str, int], torch.Tensor] = {}
"""Per device and step: the weights of one step at every phase, ``(k % 65521) + 1`` for
``k < chunk + 65520`` (int32; a step starting at word ``lo`` takes them from ``lo % 65521``)."""


def _weights(device: torch.device, chunk: int) -> torch.Tensor:
    key = (str(device), chunk)
    w = _WEIGHTS.get(key)
    if w is None:
        n = chunk + _CHECKSUM_PRIME - 1
        w = (torch.arange(n, device=device, dtype=torch.int64) % _CHECKSUM_PRIME + 1).to(torch.int32)
        _WEIGHTS[key] = w
    return w


def checksum(t: torch.Tensor, chunk: int = 1 << 24) -> int:
    """An exact, order-independent fingerprint of a tensor's bits (its bytes as int32 words, each
    weighted by its position, summed in int64 in steps of ``chunk`` words), the same for the same data.

    Tensors of a step or more take their weights from a window made once per process and device
    (int32, 67 MB for the default step), and every step's sum stays on the device until the last:
    the position arithmetic (an int64 modulo per word) and a synchronisation per step made an 8 GB
    input's checksum ~0.19 s on an H200, paid by the spare, the candidate's trials and the judge."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    pad = (-flat.numel()) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    words = flat.view(torch.int32)
    if words.numel() < chunk:
        weights = torch.arange(words.numel(), device=words.device, dtype=torch.int64) % _CHECKSUM_PRIME + 1
        return int((words.to(torch.int64) * weights).sum())
    window = _weights(words.device, chunk)
    sums = []
    for lo in range(0, words.numel(), chunk):
        part = words[lo : lo + chunk].to(torch.int64)
        phase = lo % _CHECKSUM_PRIME
        sums.append(part.mul_(window[phase : phase + part.numel()]).sum())
    return sum(int(x) for x in torch.stack(sums).tolist())


def flatten_outputs(out: object) -> list[object]:
    """A forward's result as a flat list (a tensor, or a tuple/list of them, nested ones too: an
    ``nn.LSTM``'s ``(output, (h, c))``), in order."""
    if isinstance(out, tuple | list):
        return [item for value in out for item in flatten_outputs(value)]
    return [out]


def output_structure(out: object) -> object:
    """How a forward's result nests, in the wire form the parent reads (:mod:`gpu_runner.structure`):
    ``"tensor"`` for a tensor (another value: its type's name), ``["tuple", ...]`` or
    ``["list", ...]`` with the items' structures for a tuple or a list."""
    if isinstance(out, tuple | list):
        return ["list" if isinstance(out, list) else "tuple", *(output_structure(v) for v in out)]
    return "tensor" if isinstance(out, torch.Tensor) else type(out).__name__


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold exactly the same bits (one fused comparison; NaN equals NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = _SAME_SIZE_INT.get(a.element_size())
    if as_int is not None and a.dtype is not torch.bool and not a.is_complex():
        try:
            return bool(torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int)))
        except RuntimeError:
            pass
    if a.is_floating_point() or a.is_complex():
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return bool(torch.equal(a, b))


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Hand the allocator a block full of 0xFF (NaN as float) so stale memory cannot pass as output."""
    if nbytes <= 0:
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    sync(device)
    del block


def storage_ptrs(values: Sequence[object]) -> set[int]:
    """Data pointers of the storages behind the tensors among ``values``."""
    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor) and v.numel()}


def device_info(device: torch.device, interpreter: bool) -> dict[str, Any]:
    """Fields of :class:`schemas.DeviceInfo`, measured here."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    info: dict[str, Any] = {
        "kind": device.type,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "triton_interpreter": interpreter,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["name"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
    else:
        info["name"] = cpu_name()
        info["capability"] = None
    return info


def table_peaks(name: str) -> dict[str, Any]:
    """The ceilings of a GPU named ``name`` from :data:`PEAKS` (``None`` each when it is not there);
    ``tflops_fp32`` is the fastest fp32-accurate scheme's (see :data:`TF32_PASSES`), ``tflops_tf32``
    one TF32 pass's (the ceiling where precision parity admits the reference's own TF32)."""
    for key, gbps, fp32, tf32, tf16 in PEAKS:
        if key in name:
            fp32_accurate = max(fp32, tf32 / TF32_PASSES)
            return {
                "gbps": gbps,
                "tflops_fp32": fp32_accurate,
                "tflops_tf32": tf32,
                "tflops_16": tf16,
                "source": f"table:{key}",
            }
    return {"gbps": None, "tflops_fp32": None, "tflops_tf32": None, "tflops_16": None}


def peaks(device: torch.device) -> dict[str, Any]:
    """Memory (GB/s) and arithmetic (TFLOP/s) ceilings of the device: a table on CUDA, measured on the CPU."""
    if device.type == "cuda":
        return table_peaks(torch.cuda.get_device_properties(device).name)
    src = torch.empty(16 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    gbps = 2 * src.numel() * 4 / best / 1e9
    a = torch.randn(384, 384)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - t0)
    tflops = 2 * 384**3 / best / 1e12
    return {"gbps": gbps, "tflops_fp32": tflops, "tflops_tf32": tflops, "tflops_16": tflops, "source": "measured"}


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """Type, message and traceback of an exception, robust to hostile ``__str__``."""
    import traceback

    try:
        message = str(exc)
    except Exception as inner:  # noqa: BLE001 - a hostile __str__ must not take the worker down
        message = f"<str() failed: {type(inner).__name__}>"
    try:
        tb = "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001 - same
        tb = ""
    return {"etype": type(exc).__name__, "message": message[:4000], "traceback": tb[-8000:]}


def log(message: str) -> None:
    """A line to the worker's log (stderr, captured by the parent into the runtime log)."""
    sys.stderr.write(f"[worker {os.getpid()}] {message}\n")
    sys.stderr.flush()
