"""Which single confinement step breaks CUDA initialisation here: each tried in a forked child.

python3 deploy/gpu/cuda_layers.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_runner.confine import fsview, landlock, policy
from gpu_runner.confine.namespaces import enter, maps_for
from gpu_runner.confine.probe import _in_child


def cuda() -> None:
    import torch

    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()


def ns(**plan: Any) -> Any:
    def attempt() -> None:
        if plan.get("user"):
            plan["maps"] = maps_for(os.getuid(), os.getgid(), None, None)
        enter(plan)
        if plan.pop("hide_tmp", False):
            fsview.apply(fsview.View(hide=("/tmp",), expose=(), writable=()))
        cuda()

    return attempt


def lock(extra_write: tuple[str, ...] = (), extra_read: tuple[str, ...] = ()) -> Any:
    def attempt() -> None:
        layers = policy.Layers(notes={}, landlock=True, paths=tuple(p for p in sys.path if p.startswith("/")))
        g = policy.grants(layers, ["/tmp/kf-cuda-probe", *extra_write], compile_mode=False)
        g["read"] = [*g["read"], *extra_read]
        landlock.restrict(landlock.Grants(**{k: tuple(v) for k, v in g.items()}))
        cuda()

    return attempt


def main() -> int:
    os.makedirs("/tmp/kf-cuda-probe", exist_ok=True)
    tries = {
        "plain": cuda,
        "net": ns(net=True),
        "ipc": ns(ipc=True),
        "pid": ns(pid=True),
        "mount": ns(mount=True),
        "mount+hide/tmp": ns(mount=True, hide_tmp=True),
        "net+pid": ns(net=True, pid=True),
        "user": ns(user=True),
        "user+net+pid": ns(user=True, net=True, pid=True),
        "landlock (worker grants)": lock(),
        "landlock + write /dev/shm": lock(("/dev/shm",)),
        "landlock + write /dev": lock(("/dev",)),
        "landlock + read /": lock((), ("/",)),
    }
    for name, fn in tries.items():
        print(f"{name}: {_in_child(fn)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
