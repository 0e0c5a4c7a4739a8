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


def warm_triton_key() -> None:
    """Compute Triton's cache key of its own installation (a hash of its sources and
    ``libtriton.so``: 0.3-0.9 s, once per process, inherited by forks) before any kernel needs it.
    Every compile and every cache lookup of a kernel starts with it, so a fork server pays it once
    instead of each single-use worker paying it on the critical path. Best effort: paid later otherwise."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001 - an older or newer Triton without it: paid at the first compile
        return
