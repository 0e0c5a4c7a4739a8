"""Per-worker cost of each confinement layer, warm: ``python bench/sandbox_bench.py [--reps N]``.

Forks children from a process that imported torch (as the fork server does) and times, per
child, the steps a worker takes: at spawn (namespaces, the filesystem view, the worker's Landlock
domain) and before the candidate (capabilities, the candidate's Landlock domain, seccomp). Each
row is the median over ``--reps`` children of the time until the child reports back, minus
nothing: the first row (a bare fork) is the floor the others add to. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_runner.confine import caps, fsview, landlock, policy, seccomp
from gpu_runner.confine.namespaces import enter, maps_for
from gpu_runner.sandbox import probe_isolation


def _time_child(steps: Callable[[], None]) -> float:
    """Seconds from fork until the child has done ``steps`` (measured in the child, sent back)."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            steps()
            os.write(w, f"{time.perf_counter() - t0:.9f}".encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(w, f"error {type(exc).__name__}: {exc}".encode())
        os._exit(0)
    os.close(w)
    text = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    if text.startswith("error"):
        raise RuntimeError(text)
    return float(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    import torch  # noqa: F401 - the fork server's state: a large process is what forks

    iso = probe_isolation(True, True, None)
    assert iso.layers is not None
    base = Path(tempfile.mkdtemp(prefix="kf-sandbox-bench-"))
    home, bulk = base / "w", base / "bulk"
    home.mkdir()
    bulk.mkdir()
    writable = [str(home), str(bulk)]
    plan = {"user": iso.layers.userns, "maps": maps_for(os.getuid(), os.getgid()), "net": True, "ipc": True,
            "pid": True, "mount": True}  # fmt: skip
    view = policy.view(iso.layers, writable, [str(base)])
    grants = policy.grants(iso.layers, writable, compile_mode=False)
    narrow = dict(grants)
    narrow["read"] = grants["read"] + grants["execute"]
    narrow["execute"] = []

    def g(d: dict[str, list[str]]) -> landlock.Grants:
        return landlock.Grants(**{k: tuple(v) for k, v in d.items()})

    def spawn() -> None:
        enter(plan)
        fsview.apply(fsview.View(**{k: tuple(v) for k, v in view.items()}))
        os.chdir(home)
        landlock.restrict(g(grants))

    def namespaces_only() -> None:
        enter(plan)

    def with_view() -> None:
        enter(plan)
        fsview.apply(fsview.View(**{k: tuple(v) for k, v in view.items()}))

    rows: list[tuple[str, Callable[[], None]]] = [
        ("fork (floor)", lambda: None),
        ("+ user/net/ipc/pid/mount namespaces", namespaces_only),
        ("+ filesystem view", with_view),
        ("+ worker Landlock domain (spawn total)", spawn),
    ]
    print(f"{'step':44s} {'median ms':>10s} {'p90 ms':>8s} {'added ms':>9s}")
    floor = None
    for name, steps in rows:
        times = sorted(_time_child(steps) * 1e3 for _ in range(args.reps))
        med, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
        floor = med if floor is None else floor
        print(f"{name:44s} {med:10.2f} {p90:8.2f} {med - floor:9.2f}")
    print()
    print("before the candidate (on its critical path), in a spawned worker:")
    steps_at_job = [
        ("capabilities dropped", caps.drop_all),
        ("candidate Landlock domain", lambda: landlock.restrict(g(narrow))),
        ("seccomp filter (TSYNC)", lambda: seccomp.install(seccomp.Profile.RUN)),
    ]
    per: dict[str, list[float]] = {name: [] for name, _ in steps_at_job}
    for _ in range(args.reps):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            spawn()
            out = []
            for _name, fn in steps_at_job:
                t = time.perf_counter()
                fn()
                out.append(f"{time.perf_counter() - t:.9f}")
            os.write(w, " ".join(out).encode())
            os._exit(0)
        os.close(w)
        values = os.read(r, 4096).decode().split()
        os.close(r)
        os.waitpid(pid, 0)
        for (name, _), v in zip(steps_at_job, values, strict=True):
            per[name].append(float(v) * 1e3)
    for name, times in per.items():
        print(f"{name:44s} {statistics.median(times):10.3f} {sorted(times)[int(0.9 * (len(times) - 1))]:8.3f}")
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
