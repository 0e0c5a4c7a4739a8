"""Which confinement layers CUDA workers can enter on this machine, found by trying them.

:func:`fit_cuda` runs the full plan a CUDA run worker would get (namespaces, read-only view with a
private ``/tmp``, Landlock, then the candidate's user drop, capabilities, Landlock and seccomp) in a
throw-away worker (:mod:`gpu_runner.confine.cudacheck`) that starts CUDA, compiles and launches a
Triton kernel and runs a torch operation. Where that fails, it gives up one layer at a time (a
private ``/tmp``, Landlock, the mount view, root's user namespace) until the check passes, then
tries each given-up layer again on its own, so only the ones that break CUDA here are dropped.
Each layer dropped is named, with the error it caused, in the notes every verdict carries. Where
nothing passes, :func:`gpu_runner.isolation.cuda_compatible` is the fallback.

``KFOUNDRY_CUDA_CONFINE=compatible`` skips the trial and uses that fallback directly. A fit found
by a trial is remembered in ``memo`` (the evaluator's cache folder), keyed by everything the trial
depended on (the plan asked for, the kernel, the NVIDIA driver and GPUs, torch, Triton and the
interpreter), so later evaluators on the same machine start without the trial (about 5 s and a
CUDA process on an H100); ``KFOUNDRY_CUDA_CONFINE=retry`` tries again and renews it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gpu_runner.isolation import Isolation, _spawn_spec, confinement, cuda_compatible

logger = structlog.get_logger(__name__)
CHECK_TIMEOUT_S = 150
ENV_SWITCH = "KFOUNDRY_CUDA_CONFINE"
_FITTED: dict[str, Isolation] = {}
"""Fits already found by this process, by what was probed (services of one evaluator share them)."""

Drop = Callable[[Isolation], Isolation]


def _layers(iso: Isolation, **changes: Any) -> Isolation:
    assert iso.layers is not None
    return dataclasses.replace(iso, layers=dataclasses.replace(iso.layers, **changes))


def _note(iso: Isolation, layer: str, text: str) -> Isolation:
    assert iso.layers is not None
    return _layers(iso, notes={**iso.layers.notes, layer: text})


def _keep_tmp(iso: Isolation) -> Isolation:
    return _layers(iso, keep_tmp=True)


def _no_landlock(iso: Isolation) -> Isolation:
    return _layers(iso, landlock=False)


def _no_view(iso: Isolation) -> Isolation:
    return dataclasses.replace(iso, wanted={**iso.wanted, "mount": False})


def _no_userns(iso: Isolation) -> Isolation:
    return _layers(iso, userns=False, maps={})


def _ladder(iso: Isolation) -> list[tuple[str, Drop]]:
    """What can be given up, weakest loss first (only layers that hold now)."""
    layers = iso.layers
    assert layers is not None
    steps: list[tuple[str, Drop]] = []
    view = layers.namespaces and iso.wanted.get("mount", True)
    if view and not layers.keep_tmp:
        steps.append(("private /tmp", _keep_tmp))
    if layers.landlock:
        steps.append(("landlock", _no_landlock))
    if view:
        steps.append(("mount_view", _no_view))
    if layers.userns and os.geteuid() == 0:  # root keeps the other namespaces without one
        steps.append(("user_namespace", _no_userns))
    return steps


def check(iso: Isolation, python: str) -> dict[str, Any]:
    """One trial of ``iso``'s plan for a CUDA run worker (blocking): per step 'ok' or the error."""
    from gpu_runner.sandbox import worker_env  # the same environment a worker gets

    home = Path(tempfile.mkdtemp(prefix="kf-cudacheck-"))
    try:
        os.chmod(home, 0o711)
        (home / "tmp").mkdir()
        bulk = home / "bulk"
        bulk.mkdir()
        if iso.uid is not None and iso.gid is not None:
            for path in (home, home / "tmp", bulk):
                os.chown(path, iso.uid, iso.gid)
        env = worker_env({"TRITON_CACHE_DIR": str(home / "triton")}, home)
        plan = {
            "home": str(home),
            "spawn": _spawn_spec(iso, home, bulk, [], "run"),
            "sandbox": {"uid": iso.uid, "gid": iso.gid, **confinement(iso, home, bulk, "run", True)},
        }
        cmd = [python, "-m", "gpu_runner.confine.cudacheck", json.dumps(plan)]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env, cwd=str(home), check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return {"spawn": f"the check could not run: {exc}"}
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("KF_CUDACHECK "):
                found: dict[str, Any] = json.loads(line.split(" ", 1)[1])
                return found
        return {"spawn": f"the check died (exit {done.returncode}): {done.stderr.strip()[-600:]}"}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def failure(found: dict[str, Any]) -> str | None:
    """The first step of a check that failed, with its error (None: every step passed)."""
    for step in ("spawn", "cuda", "confine", "triton", "torch"):
        value = found.get(step, "ok")
        if value != "ok":
            return f"{step}: {value}"
    return None


def _key(iso: Isolation, python: str) -> str:
    layers = iso.layers
    assert layers is not None
    return json.dumps([python, iso.uid, sorted(iso.wanted.items()), sorted(layers.notes.items())])


def _machine() -> dict[str, str]:
    """What a fit depends on besides the plan: the kernel, the driver, the GPUs, torch and Triton."""
    facts = {"kernel": platform.release(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    try:
        with open("/proc/driver/nvidia/version") as f:
            facts["driver"] = f.readline().strip()
    except OSError:
        facts["driver"] = "unknown"
    gpus = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        with contextlib.suppress(OSError), open(info) as f:
            gpus += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model:")]
    facts["gpus"] = ",".join(gpus)
    for dist in ("torch", "triton"):
        try:
            facts[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            facts[dist] = "absent"
    return facts


def _memo_path(memo: Path, iso: Isolation, python: str) -> Path:
    digest = hashlib.sha256(json.dumps([_key(iso, python), _machine()], sort_keys=True).encode()).hexdigest()
    return memo / f"{digest[:32]}.json"


def _remember(path: Path, iso: Isolation, fitted: Isolation, fallback: str | None) -> None:
    layers = fitted.layers
    assert layers is not None
    record = {
        "fallback": fallback,
        "keep_tmp": layers.keep_tmp,
        "landlock": layers.landlock,
        "mount": fitted.wanted.get("mount", True),
        "userns": layers.userns,
        "notes": layers.notes,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError as exc:  # the next evaluator tries again; nothing else depends on it
        logger.warning("cuda_fit_not_remembered", path=str(path), error=str(exc))


def _recall(path: Path, iso: Isolation) -> Isolation | None:
    try:
        record = json.loads(path.read_text())
        if record["fallback"] is not None:
            return cuda_compatible(iso, str(record["fallback"]))
        fitted = _layers(
            iso,
            keep_tmp=bool(record["keep_tmp"]),
            landlock=bool(record["landlock"]),
            notes={str(k): str(v) for k, v in dict(record["notes"]).items()},
        )
        if not record["userns"]:
            fitted = _no_userns(fitted)
        if not record["mount"]:
            fitted = _no_view(fitted)
        return fitted
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: the trial decides


def fit_cuda(
    iso: Isolation,
    python: str,
    trial: Callable[[Isolation], dict[str, Any]] | None = None,
    memo: Path | None = None,
) -> Isolation:
    """The strongest confinement under which CUDA, Triton and torch work here (blocking)."""
    if iso.layers is None:
        return iso
    switch = os.environ.get(ENV_SWITCH, "probe")
    if switch == "compatible":
        return cuda_compatible(iso, f"{ENV_SWITCH}=compatible")
    key = _key(iso, python)
    if key in _FITTED:
        return _FITTED[key]
    path = _memo_path(memo, iso, python) if memo is not None else None
    if path is not None and switch != "retry":
        recalled = _recall(path, iso)
        if recalled is not None:
            logger.info("cuda_confinement_recalled", path=str(path))
            _FITTED[key] = recalled
            return recalled
    fitted, fallback = _fit(iso, trial or (lambda candidate: check(candidate, python)))
    if path is not None:
        _remember(path, iso, fitted, fallback)
    _FITTED[key] = fitted
    return fitted


def _fit(iso: Isolation, attempt: Callable[[Isolation], dict[str, Any]]) -> tuple[Isolation, str | None]:
    """The trials: the fitted plan, and the fallback's reason where nothing lighter worked."""
    current, why = iso, failure(attempt(iso))
    dropped: list[tuple[str, Drop, str]] = []
    for name, drop in _ladder(iso):
        if why is None:
            break
        dropped.append((name, drop, why))
        current = drop(current)
        why = failure(attempt(current))
    if why is not None:
        logger.warning("cuda_confinement_fallback", error=why)
        reason = f"CUDA failed under every lighter plan tried here (last: {why[:200]})"
        return cuda_compatible(iso, reason), reason
    # Only the layer dropped last is known to matter alone; each earlier one is tried again.
    kept: list[str] = []
    for name, _, _ in dropped[:-1]:
        undone = [d for n, d, _ in dropped if n != name and n not in kept]
        candidate = iso
        for d in undone:
            candidate = d(candidate)
        if failure(attempt(candidate)) is None:
            kept.append(name)
            current = candidate
    for name, _, err in dropped:
        if name in kept:
            continue
        reason = f"CUDA did not work under it on this machine ({err[:240]})"
        if name == "private /tmp":
            layers = current.layers
            assert layers is not None
            base = layers.notes.get("mount_view", "")
            current = _note(current, "mount_view", f"{base}; /tmp kept visible read-only: {reason}")
        else:
            current = _note(current, name, f"skipped: {reason}")
    if dropped:
        logger.warning("cuda_confinement_reduced", dropped=[n for n, _, _ in dropped if n not in kept])
    return current, None
