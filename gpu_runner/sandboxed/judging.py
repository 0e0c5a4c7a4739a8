"""The judge's side: the reference's truth and the comparison on the GPU, in a process no candidate
ever ran in.

For tasks whose outputs are gigabytes, shipping them to the parent's numpy would cost more than
the kernel by orders of magnitude (FACTS: one host pass over 6.4 GB is ~0.26 s, a numpy
comparison several seconds), and shipping the reference's outputs and float64 residuals from
every spare to host files costs more still (0.6 s per GB to map and page-lock on an H200). The
judge is a run worker that is never prepared and never takes a job. Per trial it builds the
reference from the spare's seeds (the same inputs: their checksums must match what the spare
reported before any candidate existed), computes its outputs and the float64 truth on the GPU,
reads the candidate's output files (moved by the parent out of the candidate's reach after its
process tree was gone) chunk by chunk, and sends back only the sums and counts of
:class:`gpu_runner.compare._Scan` per output. The arithmetic is :mod:`gpu_runner.compare`'s.
"""

from __future__ import annotations

import copy
import mmap
import os
import socket
from typing import Any

import torch

from gpu_runner.errors import REFERENCE_FILENAME
from gpu_runner.frames import JudgeOp, Report
from gpu_runner.protocol import MAX_SHARED_OUTPUTS
from gpu_runner.sandboxed.common import TORCH_DTYPES, Channel, Laps, checksum, flatten_outputs, log, sync
from gpu_runner.sandboxed.reference import (
    ReferenceFault,
    as_double,
    build_model,
    clone_inputs,
    exact_fp32,
    load_module,
    make_inputs,
    to_device,
    trial_defaults,
)
from gpu_runner.sandboxed.shared_slots import open_slot

CHUNK = 1 << 26
"""Elements per step (64M: three float64 temporaries of 512 MB)."""


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
        if d64.numel():  # as gpu_runner.compare._noise
            out["ref_err_max"] = max(out["ref_err_max"], float(d64.abs().max()))
        if n_out:
            hit = outside & fin
            if bool(hit.any()):
                miss = err[hit].abs_() - (atol + rtol * exact[hit].abs_())
                out["truth_excess"] = max(out["truth_excess"], float(miss.max()))
    del outside


class _Shared:
    """A shared output buffer (device memory on CUDA) as a flat tensor; ``close`` releases it."""

    def __init__(self, fd: int, size: int, dtype: torch.dtype, numel: int, device: torch.device) -> None:
        self.device = device
        self.t, self._release = open_slot(fd, size, dtype, numel, device)

    def close(self) -> None:
        del self.t
        sync(self.device)  # nothing queued may still read the memory once it is unmapped
        self._release()


def judge_output(
    spec: dict[str, Any], ref: torch.Tensor, residual: torch.Tensor | None, device: torch.device, fd: int = -1
) -> dict[str, Any]:
    """Scan one candidate output (a file, or the shared buffer ``fd``) against the reference's
    output (and residual) on the device."""
    dtype = TORCH_DTYPES[str(spec["dtype"])]
    numel = ref.numel()
    cand = (
        _Shared(fd, int(spec["size"]), dtype, numel, device)
        if spec.get("shared")
        else _Mapped(spec["cand"], dtype, numel)
    )
    r_flat = ref.reshape(-1)
    d_flat = residual.reshape(-1) if residual is not None else None
    try:
        if spec.get("exact"):
            mismatches, first = 0, None
            for lo in range(0, numel, CHUNK):
                hi = min(lo + CHUNK, numel)
                bad = cand.t[lo:hi].to(device) != r_flat[lo:hi]
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
            "truth_excess": float("-inf"),
            "ref_err_max": 0.0,
        }
        atol, rtol = float(spec["atol"]), float(spec["rtol"])
        if _fused(device, numel, dtype, ref, residual):
            try:
                fused = _fused_scan(cand.t, r_flat, d_flat, device, atol, rtol)
            except Exception as exc:  # noqa: BLE001 - the kernel did not build or run here: the PyTorch path judges
                _FUSED_OFF.append(f"{type(exc).__name__}: {exc}"[:300])
                log(f"fused scan unavailable, the PyTorch path compares: {_FUSED_OFF[0]}")
                fused = None
            if fused is not None:
                return fused
        for lo in range(0, numel, CHUNK):
            hi = min(lo + CHUNK, numel)
            c = cand.t[lo:hi].to(device)
            d = d_flat[lo:hi] if d_flat is not None else None
            _scan_chunk(out, lo, c, r_flat[lo:hi], d, atol, rtol)
        return out
    finally:
        cand.close()


FUSED_MIN_ELEMENTS = 1 << 24
"""Outputs at least this large are scanned in one pass by :mod:`gpu_runner.sandboxed.fused_scan`
on a CUDA device (smaller ones take the PyTorch path, which needs no kernel compiled)."""
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_FUSED_OFF: list[str] = []
"""Why the fused scan failed in this process, if it did (it is not tried again)."""


def _fused(
    device: torch.device, numel: int, dtype: torch.dtype, ref: torch.Tensor, residual: torch.Tensor | None
) -> bool:
    """Whether one output is scanned by the fused kernel."""
    return (
        device.type == "cuda"
        and not _FUSED_OFF
        and numel >= FUSED_MIN_ELEMENTS
        and dtype in _FUSED_DTYPES
        and ref.dtype in _FUSED_DTYPES
        and (residual is None or residual.dtype in _FUSED_DTYPES)
    )


def _fused_scan(
    c: torch.Tensor, r: torch.Tensor, d: torch.Tensor | None, device: torch.device, atol: float, rtol: float
) -> dict[str, Any] | None:
    """One output scanned by the fused kernel, ``CHUNK`` elements per launch (a candidate output
    in a host file is copied to the device a chunk at a time); None where anything is not finite."""
    from gpu_runner.sandboxed import fused_scan

    numel = r.numel()
    r = r.contiguous()
    d = d.contiguous() if d is not None else None
    parts = []
    for lo in range(0, numel, CHUNK):
        hi = min(lo + CHUNK, numel)
        part = torch.empty((fused_scan.programs(hi - lo), fused_scan.FIELDS), dtype=torch.float64, device=device)
        chunk = c[lo:hi].to(device).contiguous()
        fused_scan.launch(part, chunk, r[lo:hi], d[lo:hi] if d is not None else None, lo, atol, rtol)
        parts.append(part)
    return fused_scan.reduce(parts, numel)


def _shared_fds(channel: Channel, count: int) -> list[int]:
    """The ``count`` descriptors of shared output buffers the parent sent over the share socket."""
    if channel.share_fd < 0:
        raise OSError("the judge has no share socket")
    sock = socket.socket(fileno=os.dup(channel.share_fd))
    try:
        _, fds, _, _ = socket.recv_fds(sock, 4096, MAX_SHARED_OUTPUTS)
    finally:
        sock.close()
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} shared buffers for {count} outputs")
    return fds


_MODULES: dict[int, dict[str, Any]] = {}


def _truth(
    msg: JudgeOp, device: torch.device, laps: Laps, held: tuple[dict[str, Any], Any, int] | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor | None], str | None, list[dict[str, float] | None] | None]:
    """The reference's outputs for the trial's seed, their float64 residuals (None: no float64 run),
    why there is none, and the reference's error at PyTorch's defaults on the trial's inputs
    (:func:`~gpu_runner.sandboxed.reference.trial_defaults`, per output the job names in ``parity``).

    ``held``: the referee's own namespace, model and init seed, used as they are when the seed is
    the job's (the referee judges the task it holds); otherwise the model is built here."""
    if held is not None and held[2] == int(msg["init_seed"]):
        ns, model = held[0], held[1]
    else:
        source = str(msg["reference_source"])
        if hash(source) not in _MODULES:
            _MODULES[hash(source)] = load_module(source, REFERENCE_FILENAME, "kf_reference_judge")
        ns = _MODULES[hash(source)]
        init_args = list(ns["get_init_inputs"]())
        # As the referee built it (the CPU on the CPU, or where the device refused).
        model = build_model(ns["Model"], init_args, int(msg["init_seed"]), device, bool(msg["init_on_device"]))
    on_device = bool(msg.get("on_device"))
    scale = float(msg.get("scale", 1.0))
    skip = int(msg.get("skip", 0))
    if on_device:
        inputs = make_inputs(ns, int(msg["seed"]), device, on_device=True, scale=scale, skip=skip)
    else:
        inputs = to_device(make_inputs(ns, int(msg["seed"]), torch.device("cpu"), scale=scale, skip=skip), device)
    sums = [checksum(v) if isinstance(v, torch.Tensor) else None for v in inputs]
    expected = msg.get("input_sums")
    if expected is not None and sums != expected:
        raise ValueError("the judge's inputs differ from the spare's: get_inputs() is not reproducible under a seed")
    laps.lap("inputs_s")
    with torch.no_grad():
        with exact_fp32():
            outs = [o.detach() for o in flatten_outputs(model(*clone_inputs(inputs))) if isinstance(o, torch.Tensor)]
        sync(device)
        laps.lap("forward_s")
        residuals: list[torch.Tensor | None] = [None] * len(outs)
        fp64_error = None
        measured = None
        try:
            model64 = copy.deepcopy(model).to(torch.float64)
            outs64 = [o for o in flatten_outputs(model64(*as_double(inputs))) if isinstance(o, torch.Tensor)]
            del model64
            measured = trial_defaults(model, inputs, outs64, [bool(x) for x in msg.get("parity") or []])
            del inputs
            residuals = [
                o64.sub_(o).float() if o.is_floating_point() and o64.shape == o.shape else None
                for o, o64 in zip(outs, outs64, strict=False)
            ]
            del outs64
            sync(device)
            laps.lap("float64_s")
        except torch.OutOfMemoryError as exc:
            fp64_error = f"the float64 reference does not fit the device: {exc}"[:500]
        except Exception as exc:  # noqa: BLE001 - some references cannot run in float64: recorded
            fp64_error = f"{type(exc).__name__}: {exc}"[:500]
    return outs, residuals, fp64_error, measured


def judge(
    msg: JudgeOp, device: torch.device, channel: Channel, held: tuple[dict[str, Any], Any, int] | None = None
) -> None:
    """One trial: the truth, then every output compared, under the parent's GPU lease; one ``judged`` frame."""
    results: list[dict[str, Any]] = []
    has_residual: list[bool] = []
    fp64_error = measured = None
    laps = Laps()
    specs = list(msg["outputs"])
    fds: list[int] = []
    try:
        if any(spec.get("shared") for spec in specs):  # sent just before the op: read before anything can fail
            fds = _shared_fds(channel, len(specs))
        with channel.gpu_lease(device):
            laps.lap("lease_wait_s")
            outs, residuals, fp64_error, measured = _truth(msg, device, laps, held)
            if len(specs) != len(outs):
                raise ValueError(f"{len(specs)} outputs to compare for {len(outs)} reference outputs")
            for i, (spec, ref, res) in enumerate(zip(specs, outs, residuals, strict=True)):
                results.append(judge_output(spec, ref, res, device, fds[i] if fds else -1))
                has_residual.append(res is not None)
            del outs, residuals
            sync(device)
            laps.lap("compare_s")
    except (OSError, ValueError, RuntimeError, KeyError, ReferenceFault) as exc:
        channel.send(Report.JUDGED, error=f"{type(exc).__name__}: {exc}"[:1000], results=results)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return
    finally:
        for fd in fds:
            os.close(fd)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    laps.lap("release_s")
    channel.send(
        Report.JUDGED,
        results=results,
        has_residual=has_residual,
        fp64_error=fp64_error,
        default_errors=measured,
        phases=laps.seconds,
    )
