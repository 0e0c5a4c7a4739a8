"""Whether CUDA, Triton and torch work inside one confinement plan: ``python -m gpu_runner.confine.cudacheck PLAN``.

Run by :mod:`gpu_runner.cuda_fit` as a throw-away worker: it enters the plan's namespaces, view
and Landlock domain exactly as a run worker does at spawn, starts CUDA, applies the candidate's
confinement (the user drop, no capabilities, the candidate's Landlock domain, seccomp), then
compiles and launches a Triton kernel (``ptxas`` runs) and a torch operation. Prints one JSON
object: per step ``ok`` or the error, and what each layer reported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpu_runner.confine.launch import spawn_confined

STEPS = ("cuda", "confine", "triton", "torch")


def _triton_add() -> str:
    """Compile (``ptxas``) and launch a Triton kernel; 'ok' or what went wrong."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def add_one(x_ptr, n, block: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * block + tl.arange(0, block)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    x = torch.zeros(1000, device="cuda")
    add_one[(4,)](x, 1000, block=256)
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

    def confine() -> None:
        from gpu_runner.sandboxed.candidate import confine as candidate_confine

        out["layers"] = candidate_confine({**plan["sandbox"], "strict": True})

    def torch_op() -> None:
        import torch

        a = torch.randn(64, 64, device="cuda")
        (a @ a).sum().item()

    for name, fn in (("cuda", cuda), ("confine", confine), ("triton", _triton_add), ("torch", torch_op)):
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
