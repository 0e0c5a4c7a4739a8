"""Build Triton's per-process pieces (its CUDA driver module, the backend hash) before a sandbox starts.

Both need to start programs: the driver module is compiled by the host C compiler on first use and
the backend's hash (part of every kernel's cache key) runs ``ptxas --version`` once per process. A
run worker's candidate sandbox forbids starting programs, so both must happen before it, in the
run worker and in the CUDA confinement check (:mod:`gpu_runner.confine.cudacheck`) alike.
"""

from __future__ import annotations


def warm_triton_driver() -> None:
    """Load (building if needed) Triton's active driver and compute its backend hash; raises on failure."""
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    target = driver.active.get_current_target()
    getattr(driver.active, "utils", None)
    make_backend(target).hash()
