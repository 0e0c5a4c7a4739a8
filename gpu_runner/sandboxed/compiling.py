"""The worker's compile mode: a CPU-only, sandboxed, single-use process per candidate.

* ``load_inline`` extensions are built here (into the stage's private directory) and recorded,
  so the run process only loads the ``.so``.
* Triton kernels are compiled ahead of time without a GPU: Triton's active driver is replaced by
  one that names a fixed target (e.g. ``GPUTarget("cuda", 90, 32)``), launches are turned into
  compile-only ``warmup`` calls, and the candidate's forward runs once on CPU tensors shaped by
  the reference. The cubins land in the stage's ``TRITON_CACHE_DIR``, which the run process
  receives, so it loads instead of compiling. Where that cannot work (the forward needs a real
  device), the stage says so and the run process compiles just in time.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_runner.config import compile_processes
from gpu_runner.errors import REFERENCE_FILENAME
from gpu_runner.frames import CompileOp, Report
from gpu_runner.memplan import ON_DEVICE_BYTES
from gpu_runner.sandboxed import common
from gpu_runner.sandboxed.candidate import enter_sandbox, import_candidate
from gpu_runner.sandboxed.common import Channel, Laps, describe_exception
from gpu_runner.sandboxed.held_out import sized
from gpu_runner.sandboxed.hooks import CompileShare, LaunchLog, install_ext_loader, install_triton_hooks
from gpu_runner.sandboxed.measure import measured_sizes
from gpu_runner.sandboxed.reference import build_model, load_module, make_inputs


class _CompileOnlyDriver:
    """Stands in for Triton's GPU driver in a process that has no GPU: it only names the target."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        del device
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"compile-only driver: {name} needs a GPU")


def _is_compile_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources"})


SHARE_WAIT_FACTOR = 3.0
"""The compile stage waits for its helpers this many times as long as its own share took (20 s
at least), then kills those left: what a helper did not compile, the stage compiles itself."""


def _compile_in_shares(forward: Any, share: CompileShare, processes: int, kernels: list[Any]) -> str:
    """Compile the forward's kernels in ``processes`` processes side by side: ``processes - 1``
    forked helpers and this one each run the compile-only forward and compile every
    ``processes``-th launch into the shared Triton cache, and build those kernels' host launchers
    there too; afterwards this process's own full pass finds them there (and compiles and builds
    what a helper did not, so a helper that failed or was killed costs time, never a verdict).
    The launchers had been built after the full pass, one after another: on an H100 host (16
    cores) that was 3.9-5.0 s of KernelBench L3-22's 9.3 s compile stage. Says how the helpers
    ended."""
    helpers: list[int] = []
    for index in range(1, processes):
        pid = os.fork()
        if pid == 0:  # the helper: one thread (OpenMP is not fork-safe), its share, nothing else
            code = 1
            try:
                torch.set_num_threads(1)
                share.index, share.of, share.seen = index, processes, 0
                with torch.no_grad():
                    forward()
                _build_launchers(kernels)
                code = 0
            except BaseException:  # noqa: BLE001 - the stage's own pass compiles and reports it
                code = 1
            finally:
                os._exit(code)
        helpers.append(pid)
    share.index, share.of, share.seen = 0, processes, 0
    started = time.monotonic()
    try:
        with torch.no_grad():
            forward()
        _build_launchers(kernels)
    except BaseException:  # noqa: BLE001 - the full pass below meets it again and reports it
        pass
    deadline = time.monotonic() + max(20.0, SHARE_WAIT_FACTOR * (time.monotonic() - started))
    ok = 0
    for pid in helpers:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ok += int(os.waitstatus_to_exitcode(status) == 0)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    share.index, share.of, share.seen = 0, 1, 0
    kernels.clear()  # the full pass lists each kernel once
    return f"compiled in {processes} processes, {ok} of {processes - 1} helpers finished"


def _build_launchers(kernels: list[Any]) -> str:
    """Build each kernel's host launcher into the cache too (Triton versions that make one per signature)."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:
        return ""
    built = 0
    for kernel in {id(k): k for k in kernels}.values():  # a kernel launched at several sites: once
        try:
            CudaLauncher(kernel.src, kernel.metadata)
            built += 1
        except Exception as exc:  # noqa: BLE001 - launchers that need a GPU here are built at the first launch
            why = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            return f"; launchers: built at the first launch ({why})"
    return f"; launchers: {built} prebuilt" if built else ""


@dataclass
class Shaped:
    """What the compile-only forward runs on."""

    reference: dict[str, Any]
    inputs: list[Any]
    """Inputs of the reference's real shapes (allocated, never written)."""
    extra_bytes: int
    """How much the stage's data limit must grow to hold them, the parameters and the outputs."""
    empty_params: bool
    """Build the candidate with uninitialised parameters: the reference's are at least
    :data:`gpu_runner.memplan.ON_DEVICE_BYTES` (8 GB of weights took 11 s of CPU to initialise),
    and the compile-only forward never reads them."""


def _shaped_inputs(reference_source: str) -> Shaped:
    """The reference and inputs of its real shapes for the compile-only forward.

    The inputs are allocated, never written: the forward only compiles (Triton launches are
    warm-ups), so an 8 GB input costs address space, not memory. Their sizes come from the
    ``meta`` device; where the reference cannot run there, real inputs are drawn on the CPU."""
    ref = load_module(reference_source, REFERENCE_FILENAME, "kf_reference")
    try:
        sizes, shapes, _ = measured_sizes(ref, "meta")
        inputs = [
            torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v
            for v in shapes
        ]
    except Exception:  # noqa: BLE001 - a reference that needs real data gets real inputs
        inputs = make_inputs(ref, 0, torch.device("cpu"))
        sizes = {"input_bytes": sum(v.numel() * v.element_size() for v in inputs if isinstance(v, torch.Tensor))}
        sizes["output_bytes"] = sizes["largest_tensor_bytes"] = sizes["input_bytes"]
    params = int(sizes.get("param_bytes") or 0)
    empty = params >= ON_DEVICE_BYTES
    extra = int(sizes["input_bytes"]) + 2 * int(sizes["output_bytes"]) + int(sizes["largest_tensor_bytes"])
    return Shaped(ref, inputs, extra + (params if empty else 0), empty)


def _build_candidate(factory: Any, init_args: list[Any], empty_params: bool) -> Any:
    """The candidate for the compile-only forward: on the CPU, initialised as usual, or with its
    parameters and buffers allocated and left uninitialised (built on ``meta``, then ``to_empty``)."""
    model = build_model(factory, init_args, 0, torch.device("meta" if empty_params else "cpu"), empty_params)
    return model.to_empty(device="cpu") if empty_params and isinstance(model, torch.nn.Module) else model


def _at_variant(cand: Any, reference: dict[str, Any], overrides: dict[str, int]) -> None:
    """The compile-only forward at one held-out shape (the reference's module-level sizes set to
    ``overrides`` while its inputs are drawn on the ``meta`` device)."""
    with sized(reference, overrides):
        _, shapes, _ = measured_sizes(reference, "meta")
    inputs = [
        torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v for v in shapes
    ]
    with torch.no_grad():
        cand(*inputs)


def _everywhere(cand: Any, inputs: list[Any], reference: dict[str, Any], variants: list[dict[str, int]]) -> None:
    """The compile-only forward at the task's shape, then at each held-out shape: what the compile
    stage's helpers share out (:func:`_compile_in_shares`). A level-3 model's copies for the
    held-out shapes were compiled one after another in the stage's own process (three shapes of
    ~250 kernels each for KernelBench L3-22): its candidates had no verdict in 90 s on an H100.
    A shape where the forward raises only ends that shape (the full pass reports it)."""
    with torch.no_grad():
        cand(*inputs)
    for overrides in variants:
        try:
            _at_variant(cand, reference, overrides)
        except Exception:  # noqa: BLE001 - the candidate's answer there: compile_at_variants reports it
            continue


def compile_at_variants(cand: Any, reference: dict[str, Any], variants: list[dict[str, int]]) -> str:
    """Run the compile-only forward at each held-out shape (:func:`_at_variant`): kernels the
    candidate launches only at other shapes are compiled too (where the helpers of
    :func:`_compile_in_shares` compiled them already, found in the cache). A forward that raises
    there is the candidate's own answer at that shape (a specialised kernel refusing it), which
    the run stage reports; only a Triton compile error is noted. Returns a note for the ``aot`` line."""
    if not variants:
        return ""
    ran, refused, failed = 0, 0, []
    for overrides in variants:
        try:
            _at_variant(cand, reference, overrides)
            ran += 1
        except Exception as exc:  # noqa: BLE001 - the candidate's refusal is its answer; the run stage reports it
            if _is_compile_error(exc):
                failed.append(f"{overrides}: {type(exc).__name__}")
            else:
                refused += 1
    note = f"; at {ran} of {len(variants)} held-out shapes too"
    if refused:
        note += f" ({refused} raised in the forward)"
    if failed:
        note += f" (compile errors at {', '.join(failed)[:300]})"
    return note


def warm() -> None:
    """Import, once in a fork server, what the first operation of a reference on the ``meta``
    device imports (``torch._dynamo`` and PyTorch's reference implementations: about 1 s of every
    compile process's critical path before). Best effort: what fails here is paid later, as before."""
    try:
        import torch._dynamo

        x = torch.empty(4, 4, device="meta")
        torch.relu(x).sum(dim=1)
        torch.softmax(x @ x, dim=-1)
    except Exception as exc:  # noqa: BLE001 - paid at the first compile instead
        common.log(f"compile warm-up failed: {type(exc).__name__}: {exc}")


def compile_job(msg: CompileOp, channel: Channel) -> None:
    """Build the candidate's extensions and (with a target) its Triton kernels; report what happened."""
    started = time.perf_counter()
    laps = Laps()
    log = LaunchLog()
    built: list[dict[str, str]] = []
    kernels: list[Any] = []
    target = msg.get("target")
    share = CompileShare()
    if target:
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver

        driver.set_active(_CompileOnlyDriver(GPUTarget(target["backend"], int(target["arch"]), int(target["warp"]))))
        install_triton_hooks(log, compile_only=True, compiled=kernels, share=share)
    install_ext_loader(log, "compile", {}, Path(msg["build_root"]), built)
    sandbox: dict[str, Any] = dict(msg["sandbox"])
    shaped: Shaped | None = None
    aot = "not attempted: no Triton kernels or no GPU target"
    if target and msg.get("triton_kernels"):
        try:
            shaped = _shaped_inputs(msg["reference_source"])
            sandbox["data_bytes"] = int(sandbox["data_bytes"]) + shaped.extra_bytes
        except Exception as exc:  # noqa: BLE001 - the run process compiles instead; the reference's own fault shows there
            aot = f"partial: no inputs for the reference here ({type(exc).__name__}); the run process compiles"
        laps.lap("shaped_inputs_s")
    enter_sandbox(sandbox, torch.device("cpu"))
    laps.lap("sandbox_s")

    def failed(stage: str, aot: str, exc: BaseException) -> None:
        channel.send(
            Report.COMPILED,
            ok=False,
            stage=stage,
            built=built,
            aot=aot,
            compile_error=True,
            elapsed_s=time.perf_counter() - started,
            phases=laps.seconds,
            **describe_exception(exc),
        )

    try:
        ns = import_candidate(msg["candidate_path"])
    except BaseException as exc:  # noqa: BLE001 - a failing import is the compile verdict
        failed("import", "import failed", exc)
        return
    laps.lap("import_s")
    if shaped is not None:
        try:
            init_args = list(shaped.reference["get_init_inputs"]())
            cand = _build_candidate(ns["ModelNew"], init_args, shaped.empty_params)
            inputs = shaped.inputs
            variants = msg.get("variants") or []
            processes = compile_processes(int(msg.get("jobs") or 1), len(msg.get("triton_kernels") or ()))
            if processes > 1:
                aot_shares = _compile_in_shares(
                    lambda: _everywhere(cand, inputs, shaped.reference, variants), share, processes, kernels
                )
                laps.lap("shares_s")
            with torch.no_grad():
                cand(*inputs)
            laps.lap("forward_s")
            aot = "complete: every kernel the forward launches was compiled ahead of time"
            if processes > 1:
                aot += f" ({aot_shares})"
            aot += compile_at_variants(cand, shaped.reference, variants)
            laps.lap("variants_s")
            aot += _build_launchers(kernels)
            laps.lap("launchers_s")
        except BaseException as exc:  # noqa: BLE001 - a Triton compile error is a verdict; others mean JIT later
            if _is_compile_error(exc):
                failed("triton", "compile error", exc)
                return
            aot = f"partial: the forward needs a device ({type(exc).__name__}); the run process compiles the rest"
    channel.send(
        Report.COMPILED, ok=True, built=built, aot=aot, elapsed_s=time.perf_counter() - started, phases=laps.seconds
    )
