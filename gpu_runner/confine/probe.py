"""Which confinement layers this kernel grants: ``python -m gpu_runner.confine.probe [--cuda]``.

Run once per evaluation service, as a subprocess with the workers' interpreter. It tries each
layer in a throw-away child exactly as a worker would enter it, and prints one JSON object:
per layer, ``ok`` or the error, plus the interpreter's paths (what workers must be able to read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gpu_runner.confine import landlock, seccomp
from gpu_runner.confine.namespaces import enter, maps_for


def _in_child(fn: Any) -> str:
    """Run ``fn`` in a forked child; 'ok' or the child's error text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn()
            msg = "ok"
        except BaseException as exc:  # noqa: BLE001 - the probe's answer is the error itself
            msg = f"{type(exc).__name__}: {exc}"
        os.write(w, msg.encode()[:2000])
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    return text or f"the probe child died (status {os.waitstatus_to_exitcode(status)})"


def _namespaces(user: bool, cuda: bool, keep: tuple[int, int] | None) -> str:
    plan: dict[str, Any] = {"user": user, "net": True, "ipc": True, "pid": True, "mount": True}
    if user:
        plan["maps"] = maps_for(os.getuid(), os.getgid(), *(keep or (None, None)))

    def attempt() -> None:
        done = enter(plan)
        from gpu_runner.confine import fsview

        if not cuda:  # with CUDA, the whole view is tried by gpu_runner.cuda_fit
            fsview.apply(fsview.View(hide=("/tmp",), expose=(), writable=()))
        if cuda:
            import torch

            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
        if keep is not None and os.getuid() == 0:
            os.setgroups([])
            os.setgid(keep[1])
            os.setuid(keep[0])
        if len(done) < 4:
            raise OSError(f"only {sorted(done)}")

    return _in_child(attempt)


def _landlock_cuda() -> None:
    """CUDA started under the most permissive Landlock domain a worker could get (everything
    readable, the GPU's device files and its own threads' names writable): if this fails, no worker
    domain can work."""
    import glob

    devices = (*sorted(glob.glob("/dev/nvidia*")), "/dev/null")
    grants = landlock.Grants(
        read=("/",), execute=("/",), write=("/dev/null",), devices=devices, write_files=("/proc/self/task",)
    )
    landlock.restrict(grants)
    import torch

    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_runner.confine.probe")
    parser.add_argument("--cuda", action="store_true", help="start CUDA inside the namespaces too")
    parser.add_argument("--keep-uid", type=int, default=None, help="(as root) the sandbox user to map")
    parser.add_argument("--keep-gid", type=int, default=None)
    args = parser.parse_args(argv)
    keep = (args.keep_uid, args.keep_gid) if args.keep_uid is not None and args.keep_gid is not None else None
    out: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid()}
    out["userns"] = _namespaces(True, args.cuda, keep)
    out["rootns"] = _namespaces(False, args.cuda, None) if os.getuid() == 0 and out["userns"] != "ok" else "not tried"
    out["landlock_abi"] = landlock.abi()
    out["landlock"] = _in_child(lambda: landlock.restrict(landlock.Grants(read=("/usr",))))
    if args.cuda and out["landlock"] == "ok":
        out["landlock_cuda"] = _in_child(_landlock_cuda)
    why = seccomp.supported()
    out["seccomp"] = why or _in_child(lambda: seccomp.install(seccomp.Profile.RUN))
    out["paths"] = sorted({p for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path] if p})
    for name in ("max_user_namespaces",):
        try:
            with open(f"/proc/sys/user/{name}") as fh:
                out[name] = int(fh.read())
        except OSError:
            out[name] = None
    for key, path in (
        ("userns_clone", "/proc/sys/kernel/unprivileged_userns_clone"),
        ("apparmor_userns", "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
    ):
        try:
            with open(path) as fh:
                out[key] = fh.read().strip()
        except OSError:
            out[key] = None
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
