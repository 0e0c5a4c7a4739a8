"""Device memory one process makes and another reads after the first is gone (CUDA driver VMM).

Large trial outputs go from a candidate's worker to the trusted judge without crossing the host:
before any candidate code is loaded, the worker makes one allocation per trial output with
``cuMemCreate``, maps it, and exports it as a POSIX file descriptor
(``cuMemExportToShareableHandle``). The descriptors travel to the parent over a Unix socket
(``SCM_RIGHTS``); after each trial the worker copies the output into its allocation (device to
device). The physical memory stays alive while any descriptor of it is open, so once the
candidate's whole process tree has ended, the parent hands the descriptors to the judge, which
imports (``cuMemImportFromShareableHandle``), maps and compares on the GPU. The candidate can
write its allocation only while it runs, as it could write its own outputs; it can never reach
the judge's memory or another candidate's.

Only ``ctypes`` and the driver library: importing this module needs no GPU, and every function
that touches the driver raises :class:`DevShareError` where there is none.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
_U64, _SIZE, _REF = ctypes.c_uint64, ctypes.c_size_t, ctypes.byref


class DevShareError(RuntimeError):
    """A driver call failed (or there is no driver): the caller falls back to host files."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: Any = None


def _cuda() -> Any:
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DevShareError(f"no CUDA driver library: {exc}") from None
    return _driver


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, _REF(name))
        raise DevShareError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


def granularity(device: int) -> int:
    """The size every shared allocation is rounded up to on ``device`` (2 MiB on an H100)."""
    gran = _SIZE()
    prop = _prop(device)
    _check(
        _cuda().cuMemGetAllocationGranularity(_REF(gran), _REF(prop), _CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity",
    )
    return int(gran.value)


def rounded(nbytes: int, device: int) -> int:
    g = granularity(device)
    return max(g, -(-nbytes // g) * g)


@dataclass
class Mapping:
    """A shareable allocation mapped into this process: ``ptr`` is a device address."""

    handle: int
    ptr: int
    size: int
    device: int

    def close(self) -> None:
        """Unmap and release this process's reference (the memory lives on while a descriptor does)."""
        if not self.ptr:
            return
        cu = _cuda()
        cu.cuMemUnmap(_U64(self.ptr), _SIZE(self.size))
        cu.cuMemAddressFree(_U64(self.ptr), _SIZE(self.size))
        cu.cuMemRelease(_U64(self.handle))
        self.ptr = 0

    def tensor(self, dtype: Any, shape: tuple[int, ...]) -> Any:
        """A torch tensor over the mapping (no copy); the mapping must outlive it."""
        import torch

        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.size:
            raise DevShareError(f"a {nbytes}-byte tensor does not fit a {self.size}-byte allocation")
        flat = torch.as_tensor(_CudaArray(self.ptr, nbytes), device=f"cuda:{self.device}")
        return flat.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype, device=flat.device)


class _CudaArray:
    """The least an object needs for ``torch.as_tensor`` to view device memory (uint8, 1-D)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def _map(handle: int, size: int, device: int) -> Mapping:
    cu = _cuda()
    ptr = _U64()
    _check(
        cu.cuMemAddressReserve(_REF(ptr), _SIZE(size), _SIZE(0), _U64(0), _U64(0)),
        "cuMemAddressReserve",
    )
    try:
        _check(
            cu.cuMemMap(ptr, _SIZE(size), _SIZE(0), _U64(handle), _U64(0)),
            "cuMemMap",
        )
        access = _AccessDesc()
        access.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        rc = cu.cuMemSetAccess(ptr, _SIZE(size), _REF(access), _SIZE(1))
        if rc != 0:
            cu.cuMemUnmap(ptr, _SIZE(size))
            _check(rc, "cuMemSetAccess")
    except DevShareError:
        cu.cuMemAddressFree(ptr, _SIZE(size))
        raise
    return Mapping(handle=handle, ptr=int(ptr.value), size=size, device=device)


def _current_context() -> None:
    """The driver calls need a current context: torch's primary context of the current device."""
    ctx = ctypes.c_void_p()
    _check(_cuda().cuCtxGetCurrent(_REF(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        raise DevShareError("no current CUDA context (initialise torch.cuda first)")


def create(nbytes: int, device: int) -> tuple[Mapping, int]:
    """A new shareable allocation of at least ``nbytes`` on ``device``, mapped here, and a file
    descriptor exporting it (the caller owns both)."""
    _current_context()
    size = rounded(nbytes, device)
    cu = _cuda()
    handle = _U64()
    prop = _prop(device)
    _check(
        cu.cuMemCreate(_REF(handle), _SIZE(size), _REF(prop), _U64(0)),
        "cuMemCreate",
    )
    try:
        fd = ctypes.c_int(-1)
        _check(
            cu.cuMemExportToShareableHandle(_REF(fd), handle, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, _U64(0)),
            "cuMemExportToShareableHandle",
        )
        try:
            mapping = _map(int(handle.value), size, device)
        except DevShareError:
            os.close(fd.value)
            raise
    except DevShareError:
        cu.cuMemRelease(handle)
        raise
    return mapping, int(fd.value)


def open_shared(fd: int, size: int, device: int) -> Mapping:
    """Map the allocation that ``fd`` exports (``size`` as its maker rounded it); ``fd`` stays the caller's."""
    _current_context()
    if size <= 0 or size % granularity(device):
        raise DevShareError(f"size {size} is not a positive multiple of the allocation granularity")
    cu = _cuda()
    handle = _U64()
    _check(
        cu.cuMemImportFromShareableHandle(_REF(handle), ctypes.c_void_p(fd), _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle",
    )
    try:
        return _map(int(handle.value), size, device)
    except DevShareError:
        cu.cuMemRelease(handle)
        raise
