"""Which confinement step breaks CUDA here, and whether each fix holds: one table, each row a forked child.

    python3 deploy/gpu/cuda_layers.py [--fit-only]   (about 1-2 minutes; as root and as a user)

Per variant: can the process name its threads through /proc/self/task (what the NVIDIA driver does
at cuInit), does CUDA start, does a Triton kernel compile (ptxas runs) and launch, does a torch
matmul run. Hypotheses tested separately:
  H1 the driver's thread-name write: Landlock and the read-only view refused /proc/self/task/*/comm
     (error 304); the fix grants write there only. Rows "view ro" vs "view ro + names",
     "landlock read /" vs "landlock read / + names".
  H2 a private /tmp itself (MPS pipes, driver sockets): row "tmpfs /tmp only" (no read-only root).
  H3 ptxas refused in a user namespace because its owner is not mapped (only "0 0 1" was):
     rows "user 0->0 only" vs "user identity map"; the header shows ptxas's owner and mode.
Then the evaluator's own fit (gpu_runner.cuda_fit): the plan CUDA workers get here.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_runner.confine import fsview, landlock, policy, seccomp
from gpu_runner.confine.namespaces import enter, maps_for

NAMES = ("/proc/self/task",)
COLUMNS = ("names", "ptxas", "cuda", "triton", "torch")
PARALLEL = 5


def _ptxas() -> str | None:
    spec = importlib.util.find_spec("triton")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "backends", "nvidia", "bin", "ptxas")
        if os.path.exists(path):
            return path
    return shutil.which("ptxas")


def _stat_chain(path: str) -> str:
    out = []
    for part in [Path(path), *Path(path).parents][:4]:
        st = part.stat()
        out.append(f"{part} uid={st.st_uid} gid={st.st_gid} mode={oct(st.st_mode & 0o7777)}")
    return "; ".join(out)


def _mount_of(path: str) -> str:
    best = ""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best.split(" ")[0]):
                best = f"{point} {fields[5]} {' '.join(fields[fields.index('-') + 1 :])}"
    return best


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip().replace("\n", " | ")[:200]
    except OSError as exc:
        return f"({exc.strerror})"


def header() -> None:
    print(f"kernel {platform.release()}  uid {os.getuid()}  Landlock ABI {landlock.abi()}", flush=True)
    print(f"driver: {_read('/proc/driver/nvidia/version')}")
    print(f"uid_map: {_read('/proc/self/uid_map')}   gid_map: {_read('/proc/self/gid_map')}")
    ptxas = _ptxas()
    print(f"ptxas: {ptxas}")
    if ptxas:
        print(f"  {_stat_chain(ptxas)}")
        print(f"  mount: {_mount_of(os.path.realpath(ptxas))}")
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    print(f"MPS pipe dir {mps}: {'present' if os.path.exists(mps) else 'absent'}; persistenced socket: "
          f"{'present' if glob.glob('/run/nvidia-persistenced/socket') else 'absent'}")  # fmt: skip
    print(f"/dev/nvidia*: {' '.join(sorted(glob.glob('/dev/nvidia*')))}")
    print(f"mount of /proc: {_mount_of('/proc')}   /tmp: {_mount_of('/tmp')}", flush=True)


def _names() -> str:
    """Name a new thread the way the driver does (O_RDWR on /proc/self/task/<tid>/comm)."""
    err: list[str] = []

    def run() -> None:
        try:
            fd = os.open(f"/proc/self/task/{threading.get_native_id()}/comm", os.O_RDWR)
            os.write(fd, b"kf-probe")
            os.close(fd)
        except OSError as exc:
            err.append(f"{exc.strerror}")

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return err[0] if err else "ok"


def _exec_ptxas() -> str:
    path = _ptxas()
    if not path:
        return "absent"
    try:
        subprocess.run([path, "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"[:120]
    return "ok"


def _measure(row: dict[str, str]) -> None:
    row["names"] = _names()
    row["ptxas"] = _exec_ptxas()
    try:
        import torch

        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        row["cuda"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the row shows the error
        row["cuda"] = f"{type(exc).__name__}: {exc}"[:160]
        return
    from gpu_runner.confine.cudacheck import _add_one_kernel, _triton_build, _triton_launch

    def triton_add() -> str:
        _triton_build(_add_one_kernel())
        return _triton_launch()

    def matmul() -> None:
        a = torch.randn(64, 64, device="cuda")
        (a @ a).sum().item()

    for name, fn in (("triton", triton_add), ("torch", matmul)):
        try:
            result = fn()
            row[name] = result if isinstance(result, str) else "ok"
        except BaseException as exc:  # noqa: BLE001
            row[name] = f"{type(exc).__name__}: {exc}"[:160]


def _start(setup: Callable[[str], None], work: str) -> tuple[int, int]:
    """Fork a child that runs ``setup`` then the measurements; its pid and the pipe its row comes on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(150)
        row: dict[str, str] = dict.fromkeys(COLUMNS, "not tried")
        try:
            os.environ.update({"HOME": work, "TRITON_CACHE_DIR": os.path.join(work, "triton"), "TMPDIR": work})
            tempfile.tempdir = work  # the parent may have fixed it to /tmp already
            setup(work)
            _measure(row)
        except BaseException as exc:  # noqa: BLE001
            row["setup"] = f"{type(exc).__name__}: {exc}"[:200]
        os.write(w, json.dumps(row).encode())
        os._exit(0)
    os.close(w)
    return pid, r


def _collect(pid: int, r: int) -> dict[str, str]:
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    row: dict[str, str] = json.loads(data) if data else {"setup": f"child died ({os.waitstatus_to_exitcode(status)})"}
    return row


def ns(narrow: bool = False, **plan: Any) -> Callable[[str], None]:
    def setup(work: str) -> None:
        if plan.get("user"):
            plan["maps"] = maps_for(os.getuid(), os.getgid())
            if narrow and os.getuid() == 0:
                plan["maps"] = {"uid_map": "0 0 1\n", "gid_map": "0 0 1\n", "setgroups": "allow"}
        enter(plan)

    return setup


def view(names: bool, hide: tuple[str, ...] = ("/tmp",), ro: bool = True, user: bool = False) -> Callable[[str], None]:
    def setup(work: str) -> None:
        plan: dict[str, Any] = {"mount": True, "pid": True, "user": user}
        if user:
            plan["maps"] = maps_for(os.getuid(), os.getgid())
        enter(plan)
        if not ro:
            from gpu_runner.confine.syscalls import MS_NODEV, MS_NOSUID, mount

            for h in hide:
                mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
            os.makedirs(work, exist_ok=True)
            return
        fsview.apply(fsview.View(hide=hide, expose=(work,), writable=(work,), write_files=NAMES if names else ()))

    return setup


def worker_view(work: str) -> None:
    layers = policy.Layers(notes={}, paths=tuple(p for p in sys.path if p.startswith("/")))
    v = policy.view(layers, [work], [])
    enter({"mount": True, "pid": True, "net": True, "ipc": True})
    fsview.apply(fsview.View(**{k: tuple(x) for k, x in v.items()}))


def lock(names: bool, everything: bool = False) -> Callable[[str], None]:
    def setup(work: str) -> None:
        if everything:
            devices = (*sorted(glob.glob("/dev/nvidia*")), "/dev/null")
            g = landlock.Grants(read=("/",), execute=("/",), write=(work, "/dev/null"), devices=devices,
                                write_files=NAMES if names else ())  # fmt: skip
        else:
            layers = policy.Layers(notes={}, landlock=True, paths=tuple(p for p in sys.path if p.startswith("/")))
            d = policy.grants(layers, [work], compile_mode=False)
            if not names:
                d["write_files"] = []
            g = landlock.Grants(**{k: tuple(x) for k, x in d.items()})
        landlock.restrict(g)

    return setup


def everything(work: str) -> None:
    layers = policy.Layers(notes={}, landlock=True, paths=tuple(p for p in sys.path if p.startswith("/")))
    v = policy.view(layers, [work], [])
    enter({"user": True, "maps": maps_for(os.getuid(), os.getgid()), "net": True, "ipc": True, "pid": True,
           "mount": True})  # fmt: skip
    fsview.apply(fsview.View(**{k: tuple(x) for k, x in v.items()}))
    d = policy.grants(layers, [work], compile_mode=False)
    landlock.restrict(landlock.Grants(**{k: tuple(x) for k, x in d.items()}))
    seccomp.install(seccomp.Profile.RUN_EXEC)


VARIANTS: dict[str, Callable[[str], None]] = {
    "plain": lambda work: None,
    "net": ns(net=True),
    "ipc": ns(ipc=True),
    "pid (+ own /proc)": ns(pid=True),
    "mount ns only": ns(mount=True),
    "user 0->0 only (H3 old)": ns(narrow=True, user=True),
    "user identity map (H3 fix)": ns(user=True),
    "user+net+ipc+pid": ns(user=True, net=True, ipc=True, pid=True),
    "tmpfs /tmp only (H2)": view(False, ro=False),
    "view ro, no names (H1 old)": view(False),
    "view ro + names (H1 fix)": view(True),
    "view ro + names, /tmp kept": view(True, hide=()),
    "view ro + names in userns": view(True, user=True),
    "worker view (policy)": worker_view,
    "landlock read / (H1 old)": lock(False, everything=True),
    "landlock read / + names (H1 fix)": lock(True, everything=True),
    "landlock worker grants, no names": lock(False),
    "landlock worker grants (policy)": lock(True),
    "seccomp run_exec": lambda work: (seccomp.install(seccomp.Profile.RUN_EXEC), None)[1],
    "all layers (userns, view, landlock, seccomp)": everything,
}


def fit() -> None:
    """The evaluator's own answer: the full worker plan tried, and what it keeps."""
    try:
        from gpu_runner.cuda_fit import check, failure, fit_cuda
        from gpu_runner.isolation import probe_isolation
    except ImportError as exc:
        print(f"fit: not tried ({exc})")
        return
    iso = probe_isolation(True, True, None, sys.executable, cuda=True)
    started = time.monotonic()
    found = check(iso, sys.executable)
    took = time.monotonic() - started
    print(f"\nfull worker plan (cuda_fit.check, {took:.1f} s): {failure(found) or 'every step ok'}")
    print(f"  steps: {json.dumps({k: v for k, v in found.items() if k != 'layers'})[:3000]}")
    print(f"  layers reported: {json.dumps(found.get('layers', {}))[:1500]}")
    started = time.monotonic()
    fitted = fit_cuda(iso, sys.executable)
    print(f"  fit_cuda took {time.monotonic() - started:.1f} s")
    assert fitted.layers is not None
    for name, note in sorted(fitted.layers.notes.items()):
        print(f"  {name}: {note[:200]}")


def main() -> int:
    header()
    if "--fit-only" in sys.argv[1:]:
        fit()
        return 0
    base = tempfile.mkdtemp(prefix="kf-cuda-layers-")
    os.chmod(base, 0o755)
    width = max(len(k) for k in VARIANTS) + 2
    print("\n" + "variant".ljust(width) + "".join(c.ljust(10) for c in COLUMNS), flush=True)
    details: list[str] = []
    names = list(VARIANTS)
    rows: dict[str, dict[str, str]] = {}
    for first in range(0, len(names), PARALLEL):  # a few at once: each child is mostly torch's import
        started = []
        for i, name in enumerate(names[first : first + PARALLEL], start=first):
            work = os.path.join(base, f"v{i}")
            os.makedirs(work, exist_ok=True)
            started.append((name, *_start(VARIANTS[name], work)))
        for name, pid, r in started:
            rows[name] = _collect(pid, r)
    for name in names:
        row = rows[name]
        cells = ["ok" if row.get(c) == "ok" else "-" if row.get(c) == "not tried" else "FAIL" for c in COLUMNS]
        print(name.ljust(width) + "".join(c.ljust(10) for c in cells), flush=True)
        errs = {k: v for k, v in row.items() if v not in ("ok", "not tried")}
        if errs:
            details.append(f"{name}: {errs}")
    print("\nerrors:\n  " + "\n  ".join(details) if details else "\nno errors")
    shutil.rmtree(base, ignore_errors=True)
    fit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
