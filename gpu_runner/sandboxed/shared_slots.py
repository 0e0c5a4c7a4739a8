"""Trial outputs handed to the judge as shared memory the candidate's process made before it ran.

A spare whose task the judge compares (``device_verdict``) and whose plan has room for it
(``shared_outputs``) makes, while it is still trusted (before any candidate code is loaded), one
buffer per trial output: on CUDA device memory exported as a file descriptor
(:mod:`gpu_runner.devshare`), on the CPU a ``memfd``. It sends every descriptor with its trial,
index, size, dtype and shape to the parent over the worker's share socket (``SCM_RIGHTS``) and
closes the socket: what the parent holds was fixed before a candidate existed. After each trial
the worker copies the candidate's outputs into their buffers (on CUDA device to device: no host
copy of gigabytes). The parent keeps the descriptors, so the memory outlives the worker; once
the candidate's whole process tree is gone it passes them to the judge (:func:`open_slot`),
which compares in place. Anything that fails here before the candidate runs leaves the spare on
the host files of :class:`gpu_runner.sandboxed.common.OutputSlots`.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpu_runner import devshare
from gpu_runner.protocol import MAX_SHARED_OUTPUTS, tensor_meta


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class SharedSlots:
    """The worker's side: buffers for every trial's outputs, their descriptors already sent."""

    def __init__(self, templates: Sequence[Sequence[torch.Tensor]], device: torch.device, share_fd: int) -> None:
        """Make a buffer per ``templates[trial][index]`` and send the descriptors over ``share_fd``
        (closed on return, whatever happens); raises ``OSError``/``DevShareError`` when that fails."""
        self.device = device
        self.views: dict[tuple[int, int], torch.Tensor] = {}
        self._keep: list[Any] = []  # mappings (device) or mmaps (host) behind the views
        fds: list[int] = []
        entries: list[dict[str, Any]] = []
        sock = socket.socket(fileno=share_fd)
        try:
            count = sum(len(outs) for outs in templates)
            if not 0 < count <= MAX_SHARED_OUTPUTS:
                raise OSError(f"{count} outputs to share: 1..{MAX_SHARED_OUTPUTS} are supported")
            for t, outs in enumerate(templates):
                for i, ref in enumerate(outs):
                    nbytes = ref.numel() * ref.element_size()
                    view, fd, size = self._make(nbytes, ref.dtype)
                    fds.append(fd)
                    # Fresh device memory holds whatever was there before: a candidate that never
                    # writes its buffer must not find another process's outputs in it.
                    view.zero_()
                    self.views[(t, i)] = view[: ref.numel()].view(ref.shape) if ref.numel() else view[:0]
                    entries.append(
                        {"trial": t, "index": i, "size": size, "dtype": _dtype_name(ref), "shape": list(ref.shape)}
                    )
            socket.send_fds(sock, [json.dumps(entries).encode()], fds)
        finally:
            for fd in fds:
                os.close(fd)  # the parent holds its own copies now (or nothing was sent)
            sock.close()  # nothing more goes over it: the candidate finds no socket to the parent

    def _make(self, nbytes: int, dtype: torch.dtype) -> tuple[torch.Tensor, int, int]:
        """A flat ``dtype`` tensor over a new shareable buffer, its descriptor and its size in bytes."""
        item = torch.empty((), dtype=dtype).element_size()
        numel = nbytes // item
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            mapping, fd = devshare.create(max(nbytes, 1), index)
            self._keep.append(mapping)
            return mapping.tensor(dtype, (numel,)), fd, mapping.size
        size = max(nbytes, mmap.PAGESIZE)
        fd = os.memfd_create("kf-trial-output", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            raise
        self._keep.append(mm)
        flat = torch.frombuffer(mm, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        return flat, fd, size

    def fill(self, trial: int, tensors: Sequence[torch.Tensor]) -> list[dict[str, Any]] | None:
        """Copy a trial's outputs into their buffers: their metadata, or None if they do not match."""
        views = [self.views.get((trial, i)) for i in range(len(tensors))]
        if (
            not tensors
            or len(tensors) != sum(1 for key in self.views if key[0] == trial)
            or any(v is None or v.shape != t.shape or v.dtype != t.dtype for v, t in zip(views, tensors, strict=True))
        ):
            return None
        metas = []
        for view, t in zip(views, tensors, strict=True):
            assert view is not None
            view.copy_(t.detach())
            metas.append(tensor_meta(_dtype_name(t), t.shape, t.numel() * t.element_size()))
        return metas


def open_slot(
    fd: int, size: int, dtype: torch.dtype, numel: int, device: torch.device
) -> tuple[torch.Tensor, Callable[[], None]]:
    """The judge's side: a flat tensor over a shared buffer (on ``device``) and what releases it."""
    need = numel * torch.empty((), dtype=dtype).element_size()
    if need > size:
        raise ValueError(f"a shared buffer of {size} bytes cannot hold {numel} {dtype} elements")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        mapping = devshare.open_shared(fd, size, index)
        return mapping.tensor(dtype, (numel,)), mapping.close
    if os.fstat(fd).st_size < need:
        raise ValueError("the shared buffer is smaller than it was announced")
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    import warnings

    with warnings.catch_warnings():  # read only: frombuffer warns that the buffer is not writable
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mm, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
    return flat, mm.close
