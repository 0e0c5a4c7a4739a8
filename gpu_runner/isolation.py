"""What isolation this machine grants a worker, and what each worker is given to enter.

:func:`probe_isolation` runs once per service (the confinement layers of
:mod:`gpu_runner.confine`, and the drop to an unprivileged user where the evaluator is root);
:class:`Isolation` holds the answer. :func:`_spawn_spec` is what a worker enters at spawn,
:func:`confinement` what it applies before a candidate runs, and :func:`isolation_refusal` what
``strict`` isolation says when a layer is missing.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpu_runner.config import IsolationMode, RunnerConfig
from gpu_runner.confine import policy
from gpu_runner.confine.policy import Layers
from gpu_runner.frames import SandboxSettings

logger = structlog.get_logger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Isolation:
    """What the OS allows here, probed once per service."""

    prefix: tuple[str, ...]
    network: str
    pids: str
    uid: int | None
    gid: int | None
    user: str
    layers: Layers | None = None
    """The confinement layers the probe found (None: confinement not probed)."""
    wanted: dict[str, bool] = field(default_factory=dict)
    """Which namespaces the config asks for (network, pids, ipc, mount)."""
    hidden: tuple[str, ...] = ()
    """Folders of the evaluator's own that workers must not see (cache, work folders)."""

    def namespaces(self) -> dict[str, Any]:
        """The namespaces a worker enters at spawn."""
        return policy.namespace_plan(self.layers, self.wanted) if self.layers is not None else {}

    def notes(self) -> dict[str, str]:
        """Per layer, what holds or why not (the verdict's isolation checks)."""
        out = dict(self.layers.notes) if self.layers is not None else {}
        out.setdefault("network_isolation", self.network)
        out.setdefault("pid_namespace", self.pids)
        out["sandbox_user"] = self.user
        return out


def _readable_by_others(paths: list[str]) -> str | None:
    """The first path the sandbox user could not read, if any."""
    for entry in paths:
        path = Path(entry)
        if not path.exists():
            continue
        for part in [path, *path.parents]:
            mode = part.stat().st_mode
            if not mode & 0o001 or (part == path and path.is_dir() and not mode & 0o004):
                return str(part)
    return None


def unreachable_by_others(path: Path) -> str | None:
    """The first folder on the way to ``path`` that other users cannot traverse, if any."""
    for part in [path, *path.parents]:
        if part.exists() and not part.stat().st_mode & 0o001:
            return str(part)
    return None


def without_user(iso: Isolation, reason: str) -> Isolation:
    """The same isolation with the drop to an unprivileged user turned off, saying why."""
    return dataclasses.replace(iso, uid=None, gid=None, user=f"skipped: {reason}")


def _works_as(uid: int, gid: int, python: str, cuda: bool) -> bool:
    """Whether the interpreter imports torch and Triton (and starts CUDA) as that user."""
    code = "import torch, triton, triton.language" + (
        "; torch.cuda.init(); torch.zeros(1, device='cuda')" if cuda else ""
    )

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    try:
        done = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            timeout=120,
            check=False,
            preexec_fn=drop,
            cwd="/",
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": "/tmp",
                "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
            },
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def probe_isolation(
    network: bool,
    pids: bool,
    user: str | None,
    python: str = sys.executable,
    cuda: bool = False,
    confine: dict[str, bool] | None = None,
) -> Isolation:
    """Find the strongest isolation this machine grants (blocking; call it in a thread).

    ``confine`` switches layers of :mod:`gpu_runner.confine` off by name (``ipc``, ``mount``,
    ``landlock``, ``seccomp``); network and PID namespaces follow ``network`` and ``pids``.
    """
    uid = gid = None
    user_note = "skipped: disabled by config"
    candidate: pwd.struct_passwd | None = None
    """The sandbox user to try: whether torch starts as it is asked beside the layers' probe."""
    if user is not None:
        if os.geteuid() != 0:
            user_note = f"skipped: the evaluator is not root (uid {os.geteuid()}); its own user namespace instead"
        else:
            try:
                entry = pwd.getpwnam(user)
                blocked = _readable_by_others([p for p in sys.path if p] + [str(PROJECT_ROOT)])
                if blocked:
                    user_note = f"skipped: {user} cannot read {blocked}"
                else:
                    candidate = entry
            except KeyError:
                user_note = f"skipped: no user {user!r}"
    wanted = {"network": network, "pids": pids, **(confine or {})}
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME"):
        if name in os.environ:
            env[name] = os.environ[name]
    if cuda:
        env["HOME"] = tempfile.mkdtemp(prefix="kf-probe-")
    try:
        if candidate is None:
            layers = policy.probe(python, env, cuda, None, wanted)
        else:
            # Both start an interpreter that imports torch (and starts CUDA on a GPU). One after
            # the other, they were most of the 9.7 s before an evaluator had started on an H200
            # host; side by side, probing took 3.7-4.3 s on an H100 host. The layers are probed
            # for the user at once; should torch not start as that user (rare), they are probed
            # again for the evaluator's own.
            with ThreadPoolExecutor(1, thread_name_prefix="kf-works-as") as pool:
                works = pool.submit(_works_as, candidate.pw_uid, candidate.pw_gid, python, cuda)
                layers = policy.probe(python, env, cuda, (candidate.pw_uid, candidate.pw_gid), wanted)
                if works.result():
                    uid, gid, user_note = candidate.pw_uid, candidate.pw_gid, f"{user} (uid {candidate.pw_uid})"
                else:
                    user_note = f"skipped: torch/triton do not start as {user} here"
                    layers = policy.probe(python, env, cuda, None, wanted)
    finally:
        if cuda:
            shutil.rmtree(env["HOME"], ignore_errors=True)
    notes = layers.notes
    return Isolation(
        prefix=(),
        network=notes["network_isolation"],
        pids=notes["pid_namespace"],
        uid=uid,
        gid=gid,
        user=user_note,
        layers=layers,
        wanted=wanted,
    )


def confinement(iso: Isolation, home: Path, bulk: Path | None, mode: str, exec_ok: bool) -> dict[str, Any]:
    """What a worker applies before a candidate runs: its Landlock grants (narrower than the
    worker's) and seccomp profile (the entries of the job's ``sandbox`` settings)."""
    layers = iso.layers
    if layers is None:
        return {}
    writable = [str(home)] + ([str(bulk)] if bulk is not None else [])
    out: dict[str, Any] = {"strict": bool(iso.wanted.get("strict"))}
    if layers.landlock:
        grants = policy.grants(layers, writable, compile_mode=mode == "compile")
        if mode == "run" and not exec_ok:
            grants["read"] += grants.pop("execute")
        out["landlock"] = grants
    if layers.seccomp:
        out["seccomp"] = "compile" if mode == "compile" else "run_exec" if exec_ok else "run"
    return out


def sandbox_settings(
    cfg: RunnerConfig, iso: Isolation, home: Path, bulk: Path | None, mode: str, exec_ok: bool
) -> SandboxSettings:
    """The ``sandbox`` a compile (``mode="compile"``) or run worker enters before a candidate:
    its folder, resource limits, user, device memory share (run only) and confinement."""
    settings = SandboxSettings(
        cwd=str(home),
        data_bytes=cfg.host_memory_limit_bytes,
        fsize_bytes=cfg.max_file_bytes,
        nproc=cfg.max_processes,
        uid=iso.uid,
        gid=iso.gid,
    )
    if mode == "run":
        settings["mem_fraction"] = cfg.device_memory_fraction
    settings.update(confinement(iso, home, bulk, mode, exec_ok))  # type: ignore[typeddict-item]
    return settings


def jit_exec(device: str, compile_outcome: Any) -> bool:
    """Whether a run worker may still start programs (``ptxas`` for Triton kernels the compile stage
    could not build ahead of time, on a GPU); everywhere else it may not."""
    aot = str(getattr(compile_outcome, "aot", "") or "")
    return device == "cuda" and aot.startswith("partial")


def isolation_refusal(iso: Isolation, mode: IsolationMode) -> str | None:
    """Why ``strict`` isolation refuses to run candidates here (None: it does not, or best-effort)."""
    missing = iso.layers.missing() if iso.layers is not None else list(policy.LAYERS)
    if os.geteuid() == 0 and iso.layers is not None and iso.layers.namespaces:
        missing = [m for m in missing if m != "user_namespace"]  # root has the other namespaces without one
    missing = [m for m in missing if not iso.notes().get(m, "").endswith("disabled by config")]
    if not missing:
        return None
    notes = iso.notes()
    if mode is IsolationMode.BEST_EFFORT:
        logger.warning("isolation_incomplete", missing=missing, notes={m: notes.get(m) for m in missing})
        return None
    said = "; ".join(f"{m}: {notes.get(m, 'not probed').removeprefix('skipped: ')}" for m in missing)
    return (
        f"isolation is strict and {', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not hold here, so no "
        f"candidate will run ({said}); enable {'it' if len(missing) == 1 else 'them'} as said, or pass "
        "--isolation best-effort to run candidates with the layers that hold (every verdict names them)"
    )


def _spawn_spec(iso: Isolation, home: Path, bulk: Path, extra_rw: list[str], mode: str) -> dict[str, Any]:
    """What a worker enters at spawn: its namespaces, its filesystem view, and a Landlock domain
    for all its threads (a Landlock domain covers only threads started after it)."""
    spec: dict[str, Any] = {"namespaces": iso.namespaces()}
    writable = [str(home), str(bulk), *extra_rw]
    if spec["namespaces"].get("mount"):
        spec["view"] = policy.view(iso.layers, writable, list(iso.hidden)) if iso.layers is not None else {}
    if iso.layers is not None and iso.layers.landlock:
        spec["landlock"] = policy.grants(iso.layers, writable, compile_mode=mode == "compile")
    return spec


def cuda_compatible(iso: Isolation, reason: str) -> Isolation:
    """The fallback for CUDA workers: network, PID and IPC namespaces (as root) and seccomp.

    Used where :func:`gpu_runner.cuda_fit.fit_cuda` finds no lighter plan that CUDA works under,
    or when asked for (``reason``). Measured on an H200 machine before the thread-name fix: these
    layers left CUDA and Triton working there. Each layer given up is named in every verdict.
    """
    layers = iso.layers
    if layers is None:
        return iso
    given_up = f"skipped: CUDA workers use the fallback plan ({reason})"
    notes = {**layers.notes, **dict.fromkeys(("user_namespace", "mount_view", "landlock"), given_up)}
    namespaces = layers.namespaces and os.geteuid() == 0
    if not namespaces:
        for name in ("network_isolation", "pid_namespace", "ipc_namespace"):
            if not notes.get(name, "").startswith("skipped"):
                notes[name] = "skipped: without a user namespace only root can enter it"
    changed = dataclasses.replace(layers, notes=notes, userns=False, namespaces=namespaces, landlock=False, maps={})
    return dataclasses.replace(
        iso,
        layers=changed,
        wanted={**iso.wanted, "mount": False},
        network=notes.get("network_isolation", iso.network),
        pids=notes.get("pid_namespace", iso.pids),
    )
