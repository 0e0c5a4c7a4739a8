"""The judge's side: compare a trial's outputs on the GPU, in a process no candidate ever ran in.

For tasks whose outputs are gigabytes, shipping them to the parent's numpy would cost more than
the kernel by orders of magnitude (FACTS: one host pass over 6.4 GB is ~0.26 s, a numpy
comparison several seconds). The judge is a run worker that is never prepared and never takes a
job: it reads the candidate's output files (moved by the parent out of the candidate's reach after
its process tree was gone), the reference's outputs and their float64 residuals (moved there
when the spare shipped them, before any candidate code existed), chunk by chunk onto the GPU,
and sends back only the sums and counts of :class:`gpu_runner.compare.Scan` per output.
The arithmetic is :mod:`gpu_runner.compare`'s, in float64 on the device.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import torch

from gpu_runner.worker_common import Channel, sync

CHUNK = 1 << 26
"""Elements per step (64M: three float64 temporaries of 512 MB)."""

_DTYPES = {
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


class _Mapped:
    """A file mapped read-only as a flat CPU tensor (an empty file is an empty tensor)."""

    def __init__(self, path: str, dtype: torch.dtype, numel: int) -> None:
        self.mm: mmap.mmap | None = None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            need = numel * torch.empty(0, dtype=dtype).element_size()
            if size < need:
                raise ValueError(f"{os.path.basename(path)} holds {size} bytes, {need} expected")
            if need:
                self.mm = mmap.mmap(fd, need, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if self.mm is None:
            self.t = torch.empty(0, dtype=dtype)
        else:
            # frombuffer warns that the buffer is not writable: the tensor is only read here
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.t = torch.frombuffer(self.mm, dtype=dtype, count=numel)

    def close(self) -> None:
        del self.t
        if self.mm is not None:
            self.mm.close()


def _first(mask: torch.Tensor, offset: int) -> int | None:
    hits = torch.nonzero(mask.reshape(-1))
    return offset + int(hits[0, 0]) if hits.numel() else None


def _scan_chunk(
    out: dict[str, Any], lo: int, c: torch.Tensor, r: torch.Tensor, d: torch.Tensor | None, atol: float, rtol: float
) -> None:
    """One chunk, as :func:`gpu_runner.compare._exact_chunk` does it (NaN/Inf located; rest compared
    where the reference is finite), which on finite data equals the fast path."""
    c64, r64 = c.double(), r.double()
    c_fin, r_fin = torch.isfinite(c64), torch.isfinite(r64)
    nan_bad = (c_fin != r_fin) | (torch.isnan(c64) != torch.isnan(r64))
    n_bad = int(nan_bad.sum())
    if n_bad:
        out["nan_bad"] += n_bad
        if out["nan_first"] is None:
            out["nan_first"] = _first(nan_bad, lo)
    del nan_bad, c_fin
    zero = torch.zeros((), dtype=torch.float64, device=c64.device)
    c64, r64 = torch.where(r_fin, c64, zero), torch.where(r_fin, r64, zero)
    diff = (c64 - r64).abs_()
    r_abs = r64.abs()
    outside = diff > r_abs * rtol + atol
    n_out = int(outside.sum())
    if n_out:
        out["outside"] += n_out
        if out["outside_first"] is None:
            out["outside_first"] = _first(outside, lo)
    del outside
    if diff.numel():
        out["max_abs"] = max(out["max_abs"], float(diff.max()))
        out["max_rel"] = max(out["max_rel"], float((diff / r_abs.clamp_min_(atol)).max()))
    del diff, r_abs
    if d is not None:
        d64 = d.double()
        exact = r64 + d64
        fin = torch.isfinite(exact) & r_fin
        exact, d64, c64 = torch.where(fin, exact, zero), torch.where(fin, d64, zero), torch.where(fin, c64, zero)
        err = c64 - exact
        out["sq_err"] += float(torch.dot(err, err))
        out["sq_ref_err"] += float(torch.dot(d64, d64))
        out["sq_exact"] += float(torch.dot(exact, exact))


def judge_output(spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Scan one output pair (float: the tolerance scan; other dtypes: exact equality)."""
    dtype = _DTYPES[str(spec["dtype"])]
    numel = 1
    for n in spec["shape"]:
        numel *= int(n)
    cand = _Mapped(spec["cand"], dtype, numel)
    ref = _Mapped(spec["ref"], dtype, numel)
    res = _Mapped(spec["res"], torch.float32, numel) if spec.get("res") else None
    try:
        if spec.get("exact"):
            mismatches, first = 0, None
            for lo in range(0, numel, CHUNK):
                hi = min(lo + CHUNK, numel)
                bad = cand.t[lo:hi].to(device) != ref.t[lo:hi].to(device)
                n = int(bad.sum())
                if n and first is None:
                    first = _first(bad, lo)
                mismatches += n
            return {"size": numel, "mismatches": mismatches, "first": first}
        out: dict[str, Any] = {
            "size": numel,
            "nan_bad": 0,
            "nan_first": None,
            "outside": 0,
            "outside_first": None,
            "max_abs": 0.0,
            "max_rel": 0.0,
            "sq_err": 0.0,
            "sq_ref_err": 0.0,
            "sq_exact": 0.0,
        }
        atol, rtol = float(spec["atol"]), float(spec["rtol"])
        for lo in range(0, numel, CHUNK):
            hi = min(lo + CHUNK, numel)
            c = cand.t[lo:hi].to(device, non_blocking=False)
            r = ref.t[lo:hi].to(device, non_blocking=False)
            d = res.t[lo:hi].to(device) if res is not None else None
            _scan_chunk(out, lo, c, r, d, atol, rtol)
        return out
    finally:
        for m in (cand, ref, res):
            if m is not None:
                m.close()


def judge(msg: dict[str, Any], device: torch.device, channel: Channel) -> None:
    """Every output of one trial, under the parent's GPU lease; one ``judged`` frame back."""
    results: list[dict[str, Any]] = []
    try:
        with channel.gpu_lease(device):
            for spec in msg["outputs"]:
                results.append(judge_output(spec, device))
            sync(device)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        channel.send("judged", error=f"{type(exc).__name__}: {exc}"[:1000], results=results)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
    channel.send("judged", results=results)
