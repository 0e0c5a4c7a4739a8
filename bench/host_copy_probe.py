"""Probe of the host copies a large-output evaluation makes, on the GPU machine: what each way costs.

    python bench/host_copy_probe.py --gib 6

A candidate's trial outputs of gigabytes go from the device into tmpfs files (the judge reads them
back after the candidate's process tree is gone). This times, for one float32 tensor of ``--gib``:
the device-to-host copy into a fresh file mapping (pages faulted in by the copy), into a mapping
whose pages ``posix_fallocate`` or ``MAP_POPULATE`` made resident first (and what that costs), and
through small page-locked staging buffers; then the judge's host-to-device read of such a file,
faulting or populated. Prints one table (GB/s and seconds per way).
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=6.0, help="tensor size in GiB (default 6)")
    parser.add_argument("--dir", default="/dev/shm", help="tmpfs folder for the files (default /dev/shm)")
    parser.add_argument("--chunk-mib", type=int, default=256, help="staging buffer size (default 256 MiB)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("host_copy_probe: no CUDA device here; run it on the GPU machine")
        return 2
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    numel = nbytes // 4
    dev = torch.device("cuda")
    src = torch.rand(numel, device=dev)
    torch.cuda.synchronize()
    folder = tempfile.mkdtemp(prefix="kf-probe-", dir=args.dir)
    rows: list[tuple[str, float]] = []

    def timed(name: str, fn: Callable[[], object]) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        rows.append((name, time.perf_counter() - t0))
        print(f"{name}: {rows[-1][1]:.3f} s", flush=True)

    def mapping(name: str, *, allocate: bool = False, populate: bool = False) -> torch.Tensor:
        fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            if allocate:
                os.posix_fallocate(fd, 0, nbytes)
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
            mm = mmap.mmap(fd, nbytes, flags=flags)
        finally:
            os.close(fd)
        return torch.frombuffer(mm, dtype=torch.float32, count=numel)

    def staged(dst: torch.Tensor) -> None:
        step = (args.chunk_mib << 20) // 4
        bufs = [torch.empty(step, dtype=torch.float32, pin_memory=True) for _ in range(2)]
        events = [torch.cuda.Event(), torch.cuda.Event()]  # type: ignore[no-untyped-call]
        pending: list[tuple[int, int, int]] = []
        for k, lo in enumerate(range(0, numel, step)):
            hi = min(lo + step, numel)
            b = k % 2
            if len(pending) == 2:
                plo, phi, pb = pending.pop(0)
                events[pb].synchronize()
                dst[plo:phi].copy_(bufs[pb][: phi - plo])
            bufs[b][: hi - lo].copy_(src[lo:hi], non_blocking=True)
            events[b].record()
            pending.append((lo, hi, b))
        for plo, phi, pb in pending:
            events[pb].synchronize()
            dst[plo:phi].copy_(bufs[pb][: phi - plo])

    def written(name: str, threads: int) -> None:
        """Each thread: its share of the tensor through its own page-locked buffer, ``os.pwrite`` to the file."""
        from concurrent.futures import ThreadPoolExecutor

        fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        step = (args.chunk_mib << 20) // 4
        share = -(-numel // threads)

        def part(k: int) -> None:
            buf = torch.empty(step, dtype=torch.float32, pin_memory=True)
            view = buf.numpy().data.cast("B")
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            with torch.cuda.stream(stream):
                for lo in range(k * share, min((k + 1) * share, numel), step):
                    hi = min(lo + step, (k + 1) * share, numel)
                    buf[: hi - lo].copy_(src[lo:hi], non_blocking=True)
                    stream.synchronize()
                    os.pwrite(fd, view[: (hi - lo) * 4], lo * 4)

        try:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(part, range(threads)))
        finally:
            os.close(fd)

    for knob in ("enabled", "shmem_enabled"):
        with contextlib.suppress(OSError):
            value = Path("/sys/kernel/mm/transparent_hugepage", knob).read_text().strip()
            print(f"transparent_hugepage/{knob}: {value}")
    try:
        fresh = mapping("fresh")
        timed("d2h into a fresh mapping (faults in the copy)", lambda: fresh.copy_(src))
        box: dict[str, torch.Tensor] = {}
        timed("posix_fallocate", lambda: box.setdefault("alloc", mapping("alloc", allocate=True)))
        timed("d2h into the fallocated mapping", lambda: box["alloc"].copy_(src))
        timed("mmap MAP_POPULATE", lambda: box.setdefault("pop", mapping("pop", populate=True)))
        timed("d2h into the populated mapping", lambda: box["pop"].copy_(src))
        timed("fallocate + MAP_POPULATE", lambda: box.setdefault("both", mapping("both", allocate=True, populate=True)))
        timed("d2h into fallocated+populated", lambda: box["both"].copy_(src))
        timed("d2h through pinned staging (fallocated+populated)", lambda: staged(box["both"]))
        timed("d2h through pinned staging + pwrite (no mapping)", lambda: written("pw", 1))
        timed("d2h through pinned staging + pwrite, 4 threads", lambda: written("pw4", 4))
        if hasattr(mmap, "MADV_HUGEPAGE"):

            def huge() -> None:
                t = mapping("huge")
                mm_t = t  # the tensor keeps the mapping alive
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                rc = libc.madvise(ctypes.c_void_p(mm_t.data_ptr()), ctypes.c_size_t(nbytes), mmap.MADV_HUGEPAGE)
                print(f"madvise(MADV_HUGEPAGE) rc={rc} errno={ctypes.get_errno()}")
                mm_t.copy_(src)

            timed("d2h into a fresh mapping after MADV_HUGEPAGE", huge)
        dst = torch.empty_like(src)
        chunk = 1 << 26

        def read(t: torch.Tensor) -> None:
            for lo in range(0, numel, chunk):
                dst[lo : lo + chunk].copy_(t[lo : lo + chunk])

        def reader(name: str, populate: bool) -> torch.Tensor:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
                mm = mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.frombuffer(mm, dtype=torch.float32, count=numel)

        timed("h2d chunked from a new read mapping (faults)", lambda: read(reader("alloc", False)))
        timed("h2d: open with MAP_POPULATE", lambda: box.setdefault("rp", reader("pop", True)))
        timed("h2d chunked from the populated mapping", lambda: read(box["rp"]))

        def pread() -> None:
            step = (args.chunk_mib << 20) // 4
            bufs = [torch.empty(step, dtype=torch.float32, pin_memory=True) for _ in range(2)]
            done = [torch.cuda.Event(), torch.cuda.Event()]  # type: ignore[no-untyped-call]
            fd = os.open(os.path.join(folder, "pw"), os.O_RDONLY)
            try:
                for k, lo in enumerate(range(0, numel, step)):
                    hi = min(lo + step, numel)
                    b = bufs[k % 2]
                    if k >= 2:
                        done[k % 2].synchronize()  # this buffer's previous copy has landed
                    os.preadv(fd, [b.numpy().data.cast("B")[: (hi - lo) * 4]], lo * 4)
                    dst[lo:hi].copy_(b[: hi - lo], non_blocking=True)
                    done[k % 2].record()
            finally:
                os.close(fd)

        dst.zero_()
        timed("h2d: preadv into pinned staging + copy", pread)
        print(f"pread back equal: {bool(torch.equal(dst, src))}")
        ok = bool(torch.equal(dst, src))
        print(f"read back equal: {ok}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gb = nbytes / 1e9
    print(f"\n| step ({args.gib:g} GiB) | s | GB/s |\n|---|---:|---:|")
    for name, s in rows:
        print(f"| {name} | {s:.3f} | {gb / s:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
