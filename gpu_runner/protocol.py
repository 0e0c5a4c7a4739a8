"""The wire between the evaluator and its workers: length-prefixed JSON frames plus raw tensor bytes.

Nothing here unpickles: a worker runs a candidate, so everything it sends is data the parent
decodes with a whitelist of dtypes and a size cap. A frame is an 8-byte big-endian length, a JSON
header, then ``header["blobs"]`` raw byte strings, each with its own 8-byte length. Stdlib and
numpy only, so the worker side stays light.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_LEN = struct.Struct(">Q")
MAX_HEADER_BYTES = 4 << 20
"""Largest JSON header the parent accepts."""

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


class FrameError(Exception):
    """A frame was malformed, too large, or the stream ended inside it."""


@dataclass(frozen=True)
class WireTensor:
    """A tensor as it travels: its torch dtype name, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def meta(self) -> dict[str, Any]:
        """The JSON part describing this tensor."""
        return {"dtype": self.dtype, "shape": list(self.shape), "nbytes": len(self.data)}


def encode_frame(header: dict[str, Any], blobs: Sequence[bytes] = ()) -> bytes:
    """One frame: header (with ``blobs`` set to the count) and the blobs."""
    head = json.dumps({**header, "blobs": len(blobs)}, allow_nan=True).encode()
    parts = [_LEN.pack(len(head)), head]
    for blob in blobs:
        parts.append(_LEN.pack(len(blob)))
        parts.append(blob)
    return b"".join(parts)


def write_frame(fd: int, header: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
    """Write one frame to a blocking file descriptor (worker side)."""
    view = memoryview(encode_frame(header, blobs))
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise FrameError("stream closed inside a frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_blob: int = 1 << 40) -> tuple[dict[str, Any], list[bytes]]:
    """Read one frame from a blocking file descriptor (worker side reads what the parent sent)."""
    (size,) = _LEN.unpack(_read_exact(fd, _LEN.size))
    header = decode_header(_read_exact(fd, size))
    blobs = []
    for _ in range(int(header.get("blobs", 0))):
        (blen,) = _LEN.unpack(_read_exact(fd, _LEN.size))
        if blen > max_blob:
            raise FrameError(f"blob of {blen} bytes exceeds the cap of {max_blob}")
        blobs.append(_read_exact(fd, blen))
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


def tensor_from_wire(meta: dict[str, Any], data: bytes) -> npt.NDArray[Any]:
    """Decode a tensor the worker sent into a numpy array (bfloat16 widened to float32)."""
    dtype_name = meta.get("dtype")
    if dtype_name not in WIRE_DTYPES:
        raise FrameError(f"dtype {dtype_name!r} is not accepted on the wire")
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise FrameError(f"bad shape {shape!r}")
    wire = WIRE_DTYPES[dtype_name]
    count = int(np.prod(shape)) if shape else 1
    if count * wire.itemsize != len(data):
        raise FrameError(f"{len(data)} bytes do not hold {dtype_name}{shape}")
    arr: npt.NDArray[Any] = np.frombuffer(data, dtype=wire).reshape(shape)
    if dtype_name == "bfloat16":
        widened: npt.NDArray[Any] = (arr.astype(np.uint32) << 16).view(np.float32)
        return widened
    return arr
