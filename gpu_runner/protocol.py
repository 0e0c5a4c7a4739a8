"""The wire between the evaluator and its workers: length-prefixed JSON frames plus raw tensor bytes.

Nothing here unpickles: a worker runs a candidate, so everything it sends is data the parent
decodes with a whitelist of dtypes and a size cap. A frame is an 8-byte big-endian length, a JSON
header, then ``header["blobs"]`` raw byte strings, each with its own 8-byte length. Stdlib and
numpy only, so the worker side stays light.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import stat
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_LEN = struct.Struct(">Q")
MAX_HEADER_BYTES = 4 << 20
"""Largest JSON header the parent accepts."""
MAX_SHARED_OUTPUTS = 64
"""Most shared output buffers one spare makes (SCM_RIGHTS carries at most 253 descriptors a message)."""

WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype("<f8"),
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}
"""Torch dtype name -> the numpy dtype its raw bytes travel as (bfloat16 as its 16-bit pattern)."""


Blob = bytes | bytearray | memoryview
"""Raw bytes of a tensor: anything with the buffer protocol and a byte length."""


class FrameError(Exception):
    """A frame was malformed, too large, or the stream ended inside it."""


@dataclass(frozen=True)
class WireTensor:
    """A tensor as it travels: its torch dtype name, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: Blob

    def meta(self) -> dict[str, Any]:
        """The JSON part describing this tensor."""
        return tensor_meta(self.dtype, self.shape, memoryview(self.data).nbytes)


def tensor_meta(dtype: str, shape: Sequence[int], nbytes: int) -> dict[str, Any]:
    """The JSON part describing a tensor on the wire (its bytes travel apart)."""
    return {"dtype": dtype, "shape": list(shape), "nbytes": nbytes}


PIPE_BYTES = 1 << 20
"""Pipe capacity asked for (Linux ``F_SETPIPE_SZ``): fewer, larger reads and writes of tensors."""


def _parts(header: dict[str, Any], blobs: Sequence[Blob]) -> list[Blob]:
    head = json.dumps({**header, "blobs": len(blobs)}, allow_nan=True).encode()
    parts: list[Blob] = [_LEN.pack(len(head)), head]
    for blob in blobs:
        view = memoryview(blob).cast("B")
        parts.append(_LEN.pack(view.nbytes))
        parts.append(view)
    return parts


def encode_frame(header: dict[str, Any], blobs: Sequence[Blob] = ()) -> bytes:
    """One frame: header (with ``blobs`` set to the count) and the blobs."""
    return b"".join(bytes(p) for p in _parts(header, blobs))


def _write_all(fd: int, data: Blob) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, header: dict[str, Any], blobs: Sequence[Blob] = ()) -> None:
    """Write one frame to a blocking file descriptor, blobs straight from their buffers (no joined copy)."""
    for part in _parts(header, blobs):
        _write_all(fd, part)


BULK_MIN_BYTES = 1 << 16
"""Frames whose blobs add up to more than this send them as files in the bulk directory."""


def write_bulk(directory: str, seq: int, blobs: Sequence[Blob]) -> list[dict[str, Any]]:
    """Write each blob to its own file in ``directory`` (tmpfs where there is one); their references."""
    refs = []
    for k, blob in enumerate(blobs):
        name = f"b{seq}_{k}"
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, blob)
        finally:
            os.close(fd)
        refs.append({"file": name, "nbytes": memoryview(blob).nbytes})
    return refs


def read_bulk(dir_fd: int, refs: object, max_blob: int) -> list[Blob]:
    """The blobs a frame left as files: copied out of the parent-held directory and unlinked.

    The directory is the one the parent opened when it made it (``dir_fd``), so a worker that
    swaps it for a link reaches nothing; each name must be a plain file name, opened without
    following links, a regular file of exactly the announced size.
    """
    if not isinstance(refs, list):
        raise FrameError("bulk references are not a list")
    out: list[Blob] = []
    for ref in refs:
        if not isinstance(ref, dict):
            raise FrameError("a bulk reference is not an object")
        name, nbytes = ref.get("file"), ref.get("nbytes")
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise FrameError(f"bad bulk file name {name!r}")
        if not isinstance(nbytes, int) or not 0 <= nbytes <= max_blob:
            raise FrameError(f"bulk blob of {nbytes!r} bytes (cap {max_blob})")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as exc:
            raise FrameError(f"bulk file {name}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
                raise FrameError(f"bulk file {name} is not a regular file of {nbytes} bytes")
            # Read, never mapped: a worker could truncate the file under a mapping, and touching a
            # vanished page kills the reading process (SIGBUS); a short read is only a bad frame.
            # np.empty, not bytearray: a bytearray is zero-filled under the GIL (26 ms per 64 MB),
            # which stalled the event loop and the comparisons on the H200 (loop lag up to 0.4 s).
            buf = np.empty(nbytes, dtype=np.uint8).data
            view, got = buf, 0
            while got < nbytes:
                k = os.preadv(fd, [view[got:]], got)
                if not k:
                    raise FrameError(f"bulk file {name} shrank while it was read")
                got += k
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        out.append(buf)
    return out


def take_bulk(dir_fd: int, refs: object, dst_fd: int, prefix: str, max_blob: int) -> list[str]:
    """Move a frame's bulk files out of the worker's directory into the parent's ``dst_fd``; their new names.

    For outputs too large to read into the parent: the judge reads them where they now lie, out
    of the worker's reach. The same checks as :func:`read_bulk` (plain names, regular files of
    exactly the announced size, no links followed), and the file must have no other name.
    """
    if not isinstance(refs, list):
        raise FrameError("bulk references are not a list")
    names: list[str] = []
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise FrameError("a bulk reference is not an object")
        name, nbytes = ref.get("file"), ref.get("nbytes")
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise FrameError(f"bad bulk file name {name!r}")
        if not isinstance(nbytes, int) or not 0 <= nbytes <= max_blob:
            raise FrameError(f"bulk blob of {nbytes!r} bytes (cap {max_blob})")
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise FrameError(f"bulk file {name}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes or st.st_nlink != 1:
            raise FrameError(f"bulk file {name} is not a regular file of {nbytes} bytes with one name")
        new = f"{prefix}{i}"
        try:
            os.rename(name, new, src_dir_fd=dir_fd, dst_dir_fd=dst_fd)
        except OSError as exc:
            raise FrameError(f"bulk file {name}: {exc.strerror}") from None
        names.append(new)
    return names


def widen_pipe(fd: int) -> None:
    """Ask for a larger pipe buffer where the OS allows it (silently keeps the default otherwise)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ImportError):
        pass


class _Source:
    """Blocking reads from a pipe; with ``stop``, waits in short polls so another thread can end it."""

    def __init__(self, fd: int, stop: threading.Event | None) -> None:
        self.fd = fd
        self.stop = stop
        self.poller: select.poll | None = None
        if stop is not None:
            self.poller = select.poll()
            self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def exact(self, n: int) -> bytearray:
        """Exactly ``n`` bytes, read straight into one buffer; :class:`EOFError` if the stream ends first."""
        buf = bytearray(n)
        self.into(memoryview(buf))
        return buf

    def blob(self, n: int) -> Blob:
        """Like :meth:`exact`, into memory that is not zero-filled first (see :func:`read_bulk`)."""
        buf = np.empty(n, dtype=np.uint8).data
        self.into(buf)
        return buf

    def into(self, view: memoryview) -> None:
        n = view.nbytes
        got = 0
        while got < n:
            if self.poller is not None:
                while not self.poller.poll(200):
                    if self.stop is not None and self.stop.is_set():
                        raise EOFError("reading was stopped")
            k = os.readv(self.fd, [view[got:]])
            if not k:
                raise EOFError("stream closed" + (" inside a frame" if got else ""))
            got += k


def read_frame(
    fd: int,
    max_blob: int = 1 << 40,
    stop: threading.Event | None = None,
    bulk_fd: int | None = None,
    defer_bulk: bool = False,
) -> tuple[dict[str, Any], list[Blob]]:
    """Read one frame from a blocking file descriptor (with its bulk blobs when ``bulk_fd`` is given).

    With ``defer_bulk`` a frame's bulk references stay in its header (``"bulk"``), unread, for
    the caller to read with :func:`read_bulk` later. Raises :class:`EOFError` when the stream
    ends (or ``stop`` is set) and :class:`FrameError` when the frame is malformed or too large.
    """
    src = _Source(fd, stop)
    (size,) = _LEN.unpack(src.exact(_LEN.size))
    if size > MAX_HEADER_BYTES:
        raise FrameError(f"header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    header = decode_header(bytes(src.exact(size)))
    blobs: list[Blob] = []
    for _ in range(int(header.get("blobs", 0))):
        (blen,) = _LEN.unpack(src.exact(_LEN.size))
        if blen > max_blob:
            raise FrameError(f"blob of {blen} bytes exceeds the cap of {max_blob}")
        blobs.append(src.blob(blen))
    if "bulk" in header:
        if bulk_fd is None or blobs:
            raise FrameError("unexpected bulk references")
        if defer_bulk:
            return header, []
        blobs = read_bulk(bulk_fd, header.pop("bulk"), max_blob)
        header["blobs"] = len(blobs)
    return header, blobs


def decode_header(raw: bytes) -> dict[str, Any]:
    """Parse a JSON header, refusing anything that is not an object."""
    if len(raw) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("header is not a JSON object")
    return header


def tensor_from_wire(meta: dict[str, Any], data: Blob) -> npt.NDArray[Any]:
    """Decode a tensor the worker sent into a numpy array (bfloat16 widened to float32)."""
    dtype_name = meta.get("dtype")
    if dtype_name not in WIRE_DTYPES:
        raise FrameError(f"dtype {dtype_name!r} is not accepted on the wire")
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise FrameError(f"bad shape {shape!r}")
    wire = WIRE_DTYPES[dtype_name]
    count = int(np.prod(shape)) if shape else 1
    nbytes = memoryview(data).nbytes
    if count * wire.itemsize != nbytes:
        raise FrameError(f"{nbytes} bytes do not hold {dtype_name}{shape}")
    arr: npt.NDArray[Any] = np.frombuffer(data, dtype=wire).reshape(shape)
    if dtype_name == "bfloat16":
        widened: npt.NDArray[Any] = (arr.astype(np.uint32) << 16).view(np.float32)
        return widened
    return arr
