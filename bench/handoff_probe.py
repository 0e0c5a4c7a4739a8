"""Probe: does device memory exported as a file descriptor outlive the process that made it?

    python bench/handoff_probe.py [--gib 6]

One process (no CUDA in this one) holds the descriptors. A child makes a shareable allocation
(:mod:`gpu_runner.devshare`), copies a pattern into it device to device, sends the descriptor over
a Unix socket and exits. A second child imports the descriptor after the first is gone and checks
the pattern on the GPU. Prints the times and the device memory in use at each step
(``nvidia-smi``), and whether the memory is freed once the last descriptor is closed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return int(out.stdout.strip().splitlines()[0]) if out.returncode == 0 and out.stdout.strip() else -1


def export(sock_fd: int, nbytes: int) -> None:
    import torch

    from gpu_runner import devshare

    torch.zeros(1, device="cuda")
    src = torch.arange(nbytes // 4, device="cuda", dtype=torch.int32)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    mapping, fd = devshare.create(nbytes, 0)
    made = time.perf_counter() - t0
    view = mapping.tensor(torch.int32, (nbytes // 4,))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    view.copy_(src)
    torch.cuda.synchronize()
    copied = time.perf_counter() - t0
    sock = socket.socket(fileno=sock_fd)
    socket.send_fds(sock, [json.dumps({"size": mapping.size}).encode()], [fd])
    print(json.dumps({"role": "export", "create_s": made, "d2d_copy_s": copied, "size": mapping.size}), flush=True)
    # exits without closing anything: the driver tears the context down


def import_(fd: int, size: int, nbytes: int) -> None:
    import torch

    from gpu_runner import devshare

    torch.zeros(1, device="cuda")
    torch.zeros(1, device="cuda")
    t0 = time.perf_counter()
    mapping = devshare.open_shared(fd, size, 0)
    opened = time.perf_counter() - t0
    view = mapping.tensor(torch.int32, (nbytes // 4,))
    t0 = time.perf_counter()
    ok = bool(torch.equal(view, torch.arange(nbytes // 4, device="cuda", dtype=torch.int32)))
    torch.cuda.synchronize()
    checked = time.perf_counter() - t0
    del view
    mapping.close()
    print(json.dumps({"role": "import", "open_s": opened, "check_s": checked, "pattern_ok": ok}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=6.0)
    ap.add_argument("--role", choices=["export", "import"], help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    if args.role == "export":
        export(args.fd, nbytes)
        return 0
    if args.role == "import":
        import_(args.fd, args.size, nbytes)
        return 0
    me = [sys.executable, str(Path(__file__).resolve()), "--gib", str(args.gib)]
    rows: list[tuple[str, str]] = [("device memory used before (MiB)", str(used_mib()))]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    t0 = time.perf_counter()
    exporter = subprocess.run(
        [*me, "--role", "export", "--fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    theirs.close()
    rows.append(("exporter exit code, wall (s)", f"{exporter.returncode}, {time.perf_counter() - t0:.2f}"))
    if exporter.returncode != 0:
        print(exporter.stdout + exporter.stderr[-3000:])
        return 1
    rows.append(("exporter", exporter.stdout.strip()))
    data, fds, _, _ = socket.recv_fds(ours, 4096, 1)
    size = json.loads(data)["size"]
    time.sleep(1.0)
    rows.append(("device memory used, exporter gone, fd held (MiB)", str(used_mib())))
    t0 = time.perf_counter()
    importer = subprocess.run(
        [*me, "--role", "import", "--fd", str(fds[0]), "--size", str(size)], pass_fds=(fds[0],),
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    rows.append(("importer exit code, wall (s)", f"{importer.returncode}, {time.perf_counter() - t0:.2f}"))
    rows.append(("importer", (importer.stdout.strip() or importer.stderr[-2000:])))
    rows.append(("device memory used, importer gone, fd held (MiB)", str(used_mib())))
    import os

    os.close(fds[0])
    time.sleep(1.0)
    rows.append(("device memory used, fd closed (MiB)", str(used_mib())))
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0 if importer.returncode == 0 and '"pattern_ok": true' in importer.stdout else 1


if __name__ == "__main__":
    sys.exit(main())
