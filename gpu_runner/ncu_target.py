"""The program Nsight Compute profiles: one forward of a candidate on the reference's inputs.

``python -m gpu_runner.ncu_target REFERENCE.py CANDIDATE.py``, started only by
:func:`gpu_runner.ncu.profile_counters` inside the worker's confinement (it executes the
candidate). Two warm-up forwards compile and cache the kernels; the third runs between
``cudaProfilerStart`` and ``cudaProfilerStop``, so ``ncu --profile-from-start off`` sees only it.
"""

from __future__ import annotations

import sys
from typing import Any


def _load(path: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    with open(path, encoding="utf-8") as fh:
        exec(compile(fh.read(), path, "exec"), namespace)
    return namespace


def _build(candidate: dict[str, Any], reference: dict[str, Any], init: list[Any], device: Any) -> tuple[Any, list[Any]]:
    """The candidate and the reference's inputs, created on ``device``."""
    import torch

    with torch.device(device):
        torch.manual_seed(0)
        model = candidate["ModelNew"](*init)
        torch.manual_seed(1)
        inputs = list(reference["get_inputs"]())
    return model, inputs


def main(argv: list[str] | None = None) -> int:
    """Run the forwards; exit 2 on a usage error, 1 without CUDA."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m gpu_runner.ncu_target REFERENCE.py CANDIDATE.py\n")
        return 2
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("ncu_target: no CUDA device\n")
        return 1
    reference, candidate = _load(args[0], "kf_ncu_reference"), _load(args[1], "kf_ncu_candidate")
    torch.manual_seed(0)
    init = list(reference["get_init_inputs"]())
    try:  # built on the GPU: the values do not matter here, and 8 GB of weights or inputs take seconds on the CPU
        model, inputs = _build(candidate, reference, init, torch.device("cuda"))
    except Exception:  # noqa: BLE001 - a constructor that needs the host (e.g. .numpy()): as the evaluator does
        model, inputs = _build(candidate, reference, init, torch.device("cpu"))
    model = model.cuda() if isinstance(model, torch.nn.Module) else model
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        for _ in range(2):
            model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # type: ignore[no-untyped-call]
        model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
