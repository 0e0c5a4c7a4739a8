"""The evaluator's side of confinement: probe the layers once, then plan each worker's sandbox.

:func:`probe` runs :mod:`gpu_runner.confine.probe` with the workers' interpreter and turns its
answer into :class:`Layers`: per layer, what holds or why not and how to enable it. The plan
functions build the plain dictionaries a worker receives: its namespaces (at spawn), its
Landlock grants (at spawn, narrowed again before the candidate), its filesystem view and its
seccomp profile (before the candidate).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_runner.confine.namespaces import maps_for

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpu_runner", "schemas")
"""The project's packages a worker imports (the rest of the project stays out of reach)."""
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt")
ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "passwd", "group", "nsswitch.conf",
    "host.conf", "hosts", "os-release", "alternatives", "gai.conf", "mime.types", "protocols", "services",
)  # fmt: skip
THREAD_NAMES = ("/proc/self/task",)
"""Writable for a CUDA worker (its own threads' ``comm``): the NVIDIA driver names its threads at
``cuInit`` and fails with error 304 (``cudaErrorOperatingSystem``) where that write is refused."""
NVIDIA_READ = ("/etc/nvidia", "/run/nvidia-persistenced", "/var/run/nvidia-persistenced")
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
ENABLE_USERNS = (
    "enable unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu "
    "kernels), `sysctl -w user.max_user_namespaces=15000`, and on Ubuntu 23.10+ "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile with `userns,`)"
)
LAYERS = ("user_namespace", "network_isolation", "pid_namespace", "ipc_namespace", "mount_view", "landlock", "seccomp")
"""Every confinement layer, as its check is named in a verdict."""


@dataclass(frozen=True)
class Layers:
    """What the probe found: per layer a note (``skipped: ...`` when it does not hold)."""

    notes: dict[str, str]
    userns: bool = False
    namespaces: bool = False
    landlock: bool = False
    seccomp: bool = False
    paths: tuple[str, ...] = ()
    maps: dict[str, str] = field(default_factory=dict)
    keep_tmp: bool = False
    """``/tmp`` stays in the workers' view (read-only) instead of being hidden; the evaluator's own
    folders there are hidden one by one. Set where CUDA does not start with a private ``/tmp``
    (:mod:`gpu_runner.cuda_fit` finds out)."""

    def missing(self) -> list[str]:
        """The layers that do not hold here."""
        return [k for k, v in self.notes.items() if v.startswith("skipped")]


def probe(
    python: str, env: dict[str, str], cuda: bool, keep: tuple[int, int] | None, wanted: dict[str, bool]
) -> Layers:
    """Try every layer once (blocking: call it in a thread)."""
    cmd = [python, "-m", "gpu_runner.confine.probe", *(["--cuda"] if cuda else [])]
    if keep is not None:
        cmd += ["--keep-uid", str(keep[0]), "--keep-gid", str(keep[1])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd="/", check=False)
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        found = {"userns": f"the probe failed: {exc}", "rootns": "not tried", "landlock": "not tried",
                 "seccomp": "not tried", "paths": []}  # fmt: skip
    notes: dict[str, str] = {}
    userns = found.get("userns") == "ok"
    rootns = found.get("rootns") == "ok"
    ns_ok = userns or rootns
    why_ns = f"skipped: {found.get('userns')}" + ("" if os.getuid() == 0 else f"; {ENABLE_USERNS}")
    notes["user_namespace"] = (
        "own user namespace (ids mapped: evaluator's uid is 0 inside, no privilege outside)" if userns else why_ns
    )
    for layer, detail in (
        ("network_isolation", "own network namespace: no interfaces"),
        ("pid_namespace", "own PID namespace, private /proc: no process outside is visible"),
        ("ipc_namespace", "own IPC namespace: no shared memory or queues with other workers"),
        ("mount_view", "own mount namespace: read-only root, homes and project hidden, private folder writable"),
    ):
        key = {"network_isolation": "network", "pid_namespace": "pids", "ipc_namespace": "ipc", "mount_view": "mount"}
        if not wanted.get(key[layer], True):
            notes[layer] = "skipped: disabled by config"
        else:
            notes[layer] = detail if ns_ok else why_ns
    abi = int(found.get("landlock_abi") or 0)
    if cuda and found.get("landlock") == "ok" and found.get("landlock_cuda", "ok") != "ok":
        found["landlock"] = f"CUDA does not start under Landlock here ({str(found['landlock_cuda'])[:160]})"
    landlock = found.get("landlock") == "ok" and wanted.get("landlock", True)
    if landlock:
        notes["landlock"] = f"Landlock ABI {abi}: only the interpreter, toolchains and the private folder reachable"
    elif not wanted.get("landlock", True):
        notes["landlock"] = "skipped: disabled by config"
    else:
        notes["landlock"] = (
            f"skipped: {found.get('landlock')} (ABI {abi}); enable Landlock: kernel >= 5.13 with "
            "CONFIG_SECURITY_LANDLOCK=y and `landlock` in the `lsm=` boot parameter"
        )
    seccomp = found.get("seccomp") == "ok" and wanted.get("seccomp", True)
    if seccomp:
        notes["seccomp"] = "seccomp filter: no network sockets, ptrace, namespaces, mounts, keyring, exec"
    elif not wanted.get("seccomp", True):
        notes["seccomp"] = "skipped: disabled by config"
    else:
        notes["seccomp"] = f"skipped: {found.get('seccomp')}; needs a kernel with CONFIG_SECCOMP_FILTER=y on x86_64"
    maps = maps_for(os.getuid(), os.getgid(), *(keep or (None, None))) if userns else {}
    paths = tuple(p for p in found.get("paths", []) if p.startswith("/"))
    return Layers(notes, userns, ns_ok, landlock, seccomp, paths, maps)


def namespace_plan(layers: Layers, wanted: dict[str, bool]) -> dict[str, Any]:
    """The namespaces a worker enters at spawn."""
    if not layers.namespaces:
        return {}
    return {
        "user": layers.userns,
        "maps": layers.maps,
        "net": wanted.get("network", True),
        "pid": wanted.get("pids", True),
        "ipc": wanted.get("ipc", True),
        "mount": wanted.get("mount", True),
    }


def _cuda_roots() -> list[str]:
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parents[1]))
    return [r for r in roots if r and os.path.isdir(r)]


def grants(layers: Layers, writable: list[str], compile_mode: bool) -> dict[str, list[str]]:
    """Landlock grants of a worker: the system, the interpreter, the project's packages, its folders."""
    read = [f"/etc/{name}" for name in ETC] + ["/proc", "/sys", *DEV_FILES[3:]]
    tools = [*SYSTEM, *layers.paths, *_cuda_roots(), *(str(PROJECT_ROOT / p) for p in PACKAGES)]
    # A path entry that holds the project, a home or the evaluator's folder would let all of it in.
    private = [PROJECT_ROOT, Path(os.path.expanduser("~")).resolve(), Path.cwd().resolve()]
    tools = [p for p in tools if p in SYSTEM or not any(q.is_relative_to(Path(p).resolve()) for q in private)]
    devices = [*sorted(glob.glob("/dev/nvidia*")), "/dev/dri"]
    gpu = not compile_mode and any(d.startswith("/dev/nvidia") for d in devices)
    return {
        "read": [*read, *(NVIDIA_READ if gpu else ())],
        "execute": tools,
        "list_only": [str(PROJECT_ROOT)],
        "write": [*writable, *DEV_FILES[:3]],
        "devices": devices if not compile_mode else [],
        "write_files": list(THREAD_NAMES) if gpu else [],
    }


def _mps_pipes() -> list[str]:
    """Where CUDA clients find an MPS control daemon (kept in a worker's view of ``/tmp``)."""
    return [os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")]


def view(layers: Layers, writable: list[str], hidden: list[str]) -> dict[str, list[str]]:
    """The mount view of a worker: what to hide, keep and keep writable."""
    g = grants(layers, writable, compile_mode=False)
    keep = [p for p in g["execute"] if p not in SYSTEM] + (_mps_pipes() if g["write_files"] else [])
    home = os.path.expanduser("~")
    wanted = ["/home", "/root", "/var/tmp", "/dev/shm", "/run/user", "/mnt", "/media", "/srv", home]
    if not layers.keep_tmp:
        wanted.append("/tmp")
    wanted += [str(PROJECT_ROOT), os.getcwd(), os.environ.get("KFOUNDRY_HOME", ""), *hidden]
    protected = [*SYSTEM, "/etc", "/proc", "/sys", "/dev"]
    hide = [
        h for h in wanted if h and not any(p == h or p.startswith(h.rstrip("/") + "/") or h == "/" for p in protected)
    ]
    return {"hide": hide, "expose": keep, "writable": writable, "write_files": g["write_files"]}
