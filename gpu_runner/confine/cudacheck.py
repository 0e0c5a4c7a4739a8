"""Whether CUDA, Triton and torch work inside one confinement plan: ``python -m gpu_runner.confine.cudacheck PLAN``.

Run by :mod:`gpu_runner.cuda_fit` as a throw-away worker: it enters the plan's namespaces, view
and Landlock domain exactly as a run worker does at spawn, starts CUDA, builds what a run worker
builds before its sandbox (Triton's driver module, its backend hash) and what the compile stage
builds for it (a Triton kernel and its launcher, into the cache: ``ptxas`` and the C compiler
run), applies the candidate's confinement (the user drop, no capabilities, the candidate's Landlock
domain, seccomp), then launches that kernel from the cache and runs a torch operation. Prints one
JSON object: per step ``ok`` or the error, and what each layer reported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpu_runner.confine.launch import spawn_confined

STEPS = ("cuda", "confine", "triton", "torch")


def _add_one_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def add_one(x_ptr, n, block: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * block + tl.arange(0, block)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    return add_one


def _triton_build(kernel: Any) -> None:
    """What a run worker does before its candidate's sandbox: Triton's driver module and backend
    hash (:func:`gpu_runner.sandboxed.triton_warm.warm_triton_driver`); and what the compile stage does for
    it in another process: the kernel and its host launcher built into the cache (``ptxas`` and the
    C compiler run). A first launch here does both."""
    import torch

    from gpu_runner.sandboxed.triton_warm import warm_triton_driver

    warm_triton_driver()
    x = torch.zeros(1000, device="cuda")
    kernel[(4,)](x, 1000, block=256)
    torch.cuda.synchronize()


def _triton_launch() -> str:
    """A kernel of the same source as a fresh function, as the candidate's module defines it in a
    run worker: its cubin and launcher come from the cache on disk (nothing is compiled), its
    module loads and it runs, all under the candidate's confinement."""
    import torch

    x = torch.zeros(1000, device="cuda")
    _add_one_kernel()[(4,)](x, 1000, block=256)
    torch.cuda.synchronize()
    return "ok" if float(x.sum()) == 1000.0 else f"wrong result {float(x.sum())}"


def _attempt(name: str, fn: Any, out: dict[str, Any]) -> bool:
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - the check's answer is the error itself
        out[name] = f"{type(exc).__name__}: {exc}"[:600]
        return False
    text = result if isinstance(result, str) else "ok"
    out[name] = text
    return text == "ok"


def check(plan: dict[str, Any]) -> dict[str, Any]:
    """Every step of ``plan`` (``spawn``: the spawn spec, ``sandbox``: the candidate's), in order;
    a step is not tried once one before it failed."""
    out: dict[str, Any] = dict.fromkeys(STEPS, "not tried")
    home = plan["home"]
    if not _attempt("spawn", lambda: spawn_confined(plan["spawn"], home), out):
        return out

    def cuda() -> None:
        import torch

        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        _triton_build(_add_one_kernel())

    def confine() -> None:
        from gpu_runner.sandboxed.candidate import confine as candidate_confine

        out["layers"] = candidate_confine({**plan["sandbox"], "strict": True})

    def torch_op() -> None:
        import torch

        a = torch.randn(64, 64, device="cuda")
        (a @ a).sum().item()

    for name, fn in (("cuda", cuda), ("confine", confine), ("triton", _triton_launch), ("torch", torch_op)):
        if not _attempt(name, fn, out):
            break
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m gpu_runner.confine.cudacheck PLAN_JSON\n")
        return 2
    plan = json.loads(args[0])
    os.chdir(plan["home"])
    out = check(plan)
    sys.stdout.write("KF_CUDACHECK " + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
