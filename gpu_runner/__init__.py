"""Honest, sandboxed, fast evaluation of candidate kernels against KernelBench references.

Layers: a static gate (:mod:`gpu_runner.gate`), a compile stage in CPU-only sandboxed processes
behind a content-hash cache (:mod:`gpu_runner.compiler`), execution in pre-warmed single-use
sandboxed workers (:mod:`gpu_runner.pool`, :mod:`gpu_runner.sandboxed.worker`), and a trusted verdict in
the parent (:mod:`gpu_runner.compare`, :mod:`gpu_runner.assemble`). Entry points:
:class:`gpu_runner.service.EvaluationService` and ``python -m gpu_runner`` (:mod:`gpu_runner.cli`).

This package's ``__init__`` imports nothing heavy: the worker process imports only what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_runner.config import EvalJob, RunnerConfig
    from gpu_runner.service import EvaluationService

__all__ = ["EvalJob", "EvaluationService", "RunnerConfig"]


def __getattr__(name: str) -> Any:
    if name in ("EvalJob", "RunnerConfig"):
        from gpu_runner import config

        return getattr(config, name)
    if name == "EvaluationService":
        from gpu_runner.service import EvaluationService

        return EvaluationService
    raise AttributeError(f"module 'gpu_runner' has no attribute {name!r}")
