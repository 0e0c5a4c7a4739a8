"""Launch evidence, installed from the trusted side before the candidate is imported.

* Triton: ``JITFunction.run`` (and the interpreter's ``InterpretedFunction.run``) are wrapped at
  class level, so every launch of a kernel whose Python function lives in the candidate's module
  is counted, whatever path (autotuner, heuristics, helper) led to it. In compile mode the same
  wrapper turns launches into compile-only ``warmup`` calls.
* C++/CUDA: ``torch.utils.cpp_extension.load_inline`` is replaced: compile mode builds into the
  compile stage's directory and records the ``.so``; run mode loads that ``.so`` (or falls back to
  building privately) and hands back a module whose functions count their calls.
* Timing: with a :class:`LaunchTimer` on the log, each of the candidate's own launches (Triton's
  and extension functions') is timed alone, for one forward after the timed calls (CUDA events
  around it on the current stream, or the host clock on the CPU).
* A ``TorchDispatchMode`` records every aten op the forward dispatches outside the candidate's
  own launches: a compute op there means the PyTorch op, not a kernel, did the work. Custom ops
  (any namespace torch does not own) are recorded apart, by name: the parent counts one as the
  candidate's own launch only when its native sources register that namespace, and as PyTorch
  compute otherwise (an op registered from Python runs whatever torch code its implementation holds).

All of it runs in the candidate's process, so a candidate that reaches these objects can rewrite
what they record: it is evidence for the diagnosis and a filter for honest mistakes, not a wall.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpu_runner.aten_policy import ALLOWED_ATEN_OPS
from gpu_runner.frames import KERNEL_NAME_CHARS, KERNEL_TIMES_KEPT, KernelTimer

CANDIDATE_MODULE = "kf_candidate"
BUILTIN_OP_NAMESPACES = frozenset(
    {
        "aten",
        "prims",
        "quantized",
        "_quantized",
        "mkldnn",
        "torchvision",
        "_c10d_functional",
        "c10d",
        "profiler",
        "inductor",
        "quantized_decomposed",
        "rngprims",
        "debugprims",
        "higher_order",
    }
)
"""Op namespaces that belong to torch itself (anything else was registered by the candidate)."""


class LaunchTimer:
    """Times each of the candidate's own launches alone, for one forward: CUDA events recorded on
    the current stream just before and after it (read after one synchronisation, in
    :meth:`summary`), or the host clock around it on the CPU. A launch made inside one being timed
    (an extension function that launches a Triton kernel) is the outer one's time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = KernelTimer.CUDA if self.cuda else KernelTimer.CPU
        self._events: list[tuple[str, Any, Any]] = []
        self._host: list[tuple[str, float]] = []
        self._inside = False

    def call(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, timed as one launch of ``name``."""
        if self._inside:
            return fn(*args, **kwargs)
        self._inside = True
        try:
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                out = fn(*args, **kwargs)
                end.record()
                self._events.append((name, start, end))
            else:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self._host.append((name, (time.perf_counter() - t0) * 1e6))
        finally:
            self._inside = False
        return out

    def summary(self) -> list[dict[str, Any]]:
        """Per kernel name (cut to :data:`KERNEL_NAME_CHARS`): launches and microseconds, all
        launches together; largest first, at most :data:`KERNEL_TIMES_KEPT` (the ``kernel_times``
        of the ``done`` frame). On CUDA it waits for the device first."""
        timed = self._host
        if self.cuda:
            torch.cuda.synchronize(self.device)
            timed = [(name, float(start.elapsed_time(end)) * 1e3) for name, start, end in self._events]
        totals: dict[str, tuple[int, float]] = {}
        for name, us in timed:
            key = name[:KERNEL_NAME_CHARS]
            launches, total = totals.get(key, (0, 0.0))
            totals[key] = (launches + 1, total + max(0.0, us))
        ranked = sorted(totals.items(), key=lambda kv: kv[1][1], reverse=True)[:KERNEL_TIMES_KEPT]
        return [{"name": name, "launches": n, "time_us": us} for name, (n, us) in ranked]


@dataclass
class LaunchLog:
    """Counts of the candidate's own launches and of foreign aten ops, per forward."""

    own_launches: int = 0
    own_names: dict[str, None] = field(default_factory=dict)
    """The names launched, in first-launch order (a dict: a launch's check is one hash, not a scan
    of every name before it, which a whole model's 150 kernels made a cost of each timed call)."""
    ext_calls: int = 0
    foreign_ops: dict[str, int] = field(default_factory=dict)
    custom_ops: dict[str, int] = field(default_factory=dict)
    """Calls of custom ops (``namespace::name``), whose namespace the parent judges."""
    suspended: int = 0
    recording: bool = False
    jit_fallback: list[str] = field(default_factory=list)
    ext_loaded: list[str] = field(default_factory=list)
    timer: LaunchTimer | None = None
    """Times each own launch while set (one forward after the timed calls; nothing is counted then)."""

    def reset(self) -> None:
        self.own_launches = 0
        self.own_names = {}
        self.ext_calls = 0
        self.foreign_ops = {}
        self.custom_ops = {}

    def launched(self, name: str) -> None:
        if self.recording:
            self.own_launches += 1
            self.own_names.setdefault(name)


def ext_key(name: str, kwargs: dict[str, Any]) -> str:
    """Content key of one ``load_inline`` call: the same in the compile and the run process."""
    parts: dict[str, Any] = {"name": name}
    for key in (
        "cpp_sources",
        "cuda_sources",
        "functions",
        "extra_cflags",
        "extra_cuda_cflags",
        "extra_ldflags",
        "with_cuda",
        "with_pytorch_error_handling",
    ):
        value = kwargs.get(key)
        parts[key] = [value] if isinstance(value, str) else value
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _kernel_module(kernel: Any) -> str | None:
    fn = getattr(kernel, "fn", None)
    return getattr(fn, "__module__", None)


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", None)
    return str(getattr(fn, "__name__", getattr(kernel, "__name__", "?")))


@dataclass
class CompileShare:
    """Which of a compile-only forward's launches this process compiles: those whose order
    (counted from zero) is ``index`` modulo ``of`` (``gpu_runner.sandboxed.compiling``: processes
    forked to compile a candidate's kernels side by side); ``of = 1`` compiles every one."""

    index: int = 0
    of: int = 1
    seen: int = 0

    def mine(self) -> bool:
        """Whether the next launch is this process's to compile (and count it)."""
        turn = self.seen
        self.seen += 1
        return turn % self.of == self.index

    def mine_for(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this process compiles the launch of ``fn`` with these arguments: by what Triton
        specialises on (:func:`launch_key`), so that every launch site of one kernel goes to one
        process. By launch order (:meth:`mine`) the sites of a kernel shared by many (the template's
        repeated layers, ``actors.experts.template.share``) were spread over the processes, and each
        compiled it again. Launch order where the key cannot be made."""
        if self.of == 1:  # the stage's own full pass: every launch, no key to make
            self.seen += 1
            return True
        try:
            key = launch_key(fn, args, kwargs)
        except Exception:  # noqa: BLE001 - an unusual kernel object: the order still shares the work
            return self.mine()
        self.seen += 1
        return zlib.crc32(key.encode()) % self.of == self.index


def launch_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A launch as Triton specialises its compile: the function, the value of each ``constexpr``,
    and for the other arguments what specialisation looks at (an integer's being 1 or a multiple
    of 16, a tensor's type and 16-byte alignment). Launches of one compiled kernel share a key;
    two kernels may too (then one process compiles both)."""
    names = list(fn.arg_names)
    constexpr = {param.name for param in fn.params if param.is_constexpr}
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    parts = [f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', '')}"]
    for name in names:
        if name not in bound:
            continue
        value = bound[name]
        if name in constexpr:
            parts.append(f"{name}={value!r}")
        elif isinstance(value, bool) or value is None:
            parts.append(f"{name}:{value}")
        elif isinstance(value, int):
            parts.append(f"{name}:i{int(value == 1)}{int(value % 16 == 0)}")
        elif hasattr(value, "data_ptr") and hasattr(value, "dtype"):
            parts.append(f"{name}:{value.dtype}{int(value.data_ptr() % 16 == 0)}")
        else:
            parts.append(f"{name}:{type(value).__name__}")
    return "|".join(parts)


def _count_at_launchers(log: LaunchLog) -> bool:
    """Count the candidate's launches where every compiled Triton kernel's launch passes: the
    ``run`` property of its ``CompiledKernel`` that hands out the launcher (through
    ``triton.jit``, a compiled kernel's own ``kernel[grid](...)``, or a launch site that keeps
    the compiled kernel and calls its launcher, as the template's ``_KfLaunch`` and Inductor
    do). False where this Triton has no such property (``triton.jit`` launches are counted
    there instead)."""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    prop = CompiledKernel.__dict__.get("run")
    if not isinstance(prop, property) or prop.fget is None:
        return False
    getter = prop.fget

    def run(self: Any) -> Any:
        launcher = getter(self)
        timer = log.timer
        if log.recording or timer is not None:
            own = self.__dict__.get("_kf_own")
            if own is None:
                own = _kernel_module(getattr(self, "src", None)) == CANDIDATE_MODULE
                self._kf_own = own
            if own:
                name = str(getattr(self, "name", "?"))
                log.launched(name)
                if timer is not None:
                    return functools.partial(timer.call, name, launcher)
        return launcher

    CompiledKernel.run = property(run)
    return True


def install_triton_hooks(
    log: LaunchLog, compile_only: bool, compiled: list[Any] | None = None, share: CompileShare | None = None
) -> None:
    """Wrap Triton's launch entry points (count launches; or make them compile-only, compiling
    only ``share``'s launches where one is given)."""
    import triton.runtime.jit as jit

    classes: list[type] = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    at_launcher = not compile_only and _count_at_launchers(log)
    for cls in classes:
        original = cls.run  # type: ignore[attr-defined]
        counts = not (at_launcher and cls is jit.JITFunction)  # else its kernel's launcher counts it

        def run(
            self: Any,
            *args: Any,
            grid: Any,
            warmup: bool,
            _orig: Callable[..., Any] = original,
            _counts: bool = counts,
            **kwargs: Any,
        ) -> Any:
            own = _counts and _kernel_module(self) == CANDIDATE_MODULE
            if compile_only:
                if share is not None and not share.mine_for(self, args, kwargs):
                    return None
                kernel = _orig(self, *args, grid=grid, warmup=True, **kwargs)
                if compiled is not None and kernel is not None:
                    compiled.append(kernel)
                return kernel
            timer = log.timer if own and not warmup else None
            if own and not warmup:
                log.launched(_kernel_name(self))
            log.suspended += 1
            try:
                if timer is not None:
                    return timer.call(_kernel_name(self), _orig, self, *args, grid=grid, warmup=warmup, **kwargs)
                return _orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                log.suspended -= 1

        cls.run = run  # type: ignore[attr-defined]
    if compile_only:
        from triton.runtime.autotuner import Autotuner

        def tune(self: Any, *args: Any, **kwargs: Any) -> Any:
            kwargs.pop("warmup", None)
            return self.warmup(*args, **kwargs)

        Autotuner.run = tune


class _CountingModule:
    """Stands for a built extension module; each public function counts its calls."""

    def __init__(self, module: Any, log: LaunchLog) -> None:
        self._module = module
        for attr in dir(module):
            value = getattr(module, attr)
            if not attr.startswith("_") and callable(value):
                setattr(self, attr, self._wrap(attr, value, log))

    @staticmethod
    def _wrap(name: str, fn: Callable[..., Any], log: LaunchLog) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if log.recording:
                log.ext_calls += 1
                log.launched(name)
            if log.timer is not None:
                return log.timer.call(name, fn, *args, **kwargs)
            return fn(*args, **kwargs)

        call.__name__ = name
        return call

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._module, attr)


def _import_so(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_ext_loader(
    log: LaunchLog, mode: str, manifest: dict[str, str], build_root: Path, built: list[dict[str, str]]
) -> None:
    """Replace ``load_inline``: build and record (``compile``), or load the prebuilt ``.so`` (``run``)."""
    import torch.utils.cpp_extension as cpp

    real_load_inline = cpp.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, functions: Any = None, **kwargs: Any) -> Any:
        call = {"cpp_sources": cpp_sources, "cuda_sources": cuda_sources, "functions": functions, **kwargs}
        key = ext_key(name, call)
        kwargs.pop("build_directory", None)
        kwargs.setdefault("verbose", mode == "compile")
        if mode == "run" and key in manifest:
            module = _import_so(name, manifest[key])
            log.ext_loaded.append(name)
        else:
            build_dir = build_root / key
            build_dir.mkdir(parents=True, exist_ok=True)
            module = real_load_inline(  # type: ignore[no-untyped-call]
                name,
                cpp_sources,
                cuda_sources=cuda_sources,
                functions=functions,
                build_directory=str(build_dir),
                **kwargs,
            )
            so_path = getattr(module, "__file__", None) or str(build_dir / f"{name}.so")
            built.append({"key": key, "name": name, "so": so_path})
            if mode == "run":
                log.jit_fallback.append(f"extension {name}")
        return _CountingModule(module, log) if mode == "run" else module

    cpp.load_inline = load_inline  # type: ignore[assignment]


class DispatchRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records aten ops dispatched outside the candidate's own launches while ``log.recording``."""

    def __init__(self, log: LaunchLog) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.log.recording and not self.log.suspended:
            name = func.__name__.split(".", 1)[0]
            namespace = getattr(func, "namespace", "aten")
            if namespace not in BUILTIN_OP_NAMESPACES:
                key = f"{namespace}::{name}"  # a custom op the candidate registered: the parent judges it
                self.log.custom_ops[key] = self.log.custom_ops.get(key, 0) + 1
                return func(*args, **kwargs)
            allowed = name in ALLOWED_ATEN_OPS
            if name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
                dtype = kwargs.get("dtype")
                allowed = dtype is None or dtype == args[0].dtype
            if not allowed:
                self.log.foreign_ops[name] = self.log.foreign_ops.get(name, 0) + 1
        return func(*args, **kwargs)
