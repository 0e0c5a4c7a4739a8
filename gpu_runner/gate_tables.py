"""Tables of the static gate: which imports, names, calls and source patterns break which rule.

Kept apart from the AST walk in :mod:`gpu_runner.gate` so the policy reads as data. Names are
fully qualified after alias resolution (``F.relu`` is ``torch.nn.functional.relu``).
"""

from __future__ import annotations

import re

from schemas import CheatRule

R = CheatRule

ALLOWED_IMPORT_ROOTS = frozenset(
    {
        "torch", "triton", "math", "typing", "typing_extensions", "functools", "itertools",
        "operator", "dataclasses", "enum", "collections", "numbers", "abc", "__future__", "numpy",
    }
)  # fmt: skip
"""Top-level modules a candidate may import; finer rules below still apply to their parts."""

IMPORT_RULES: dict[str, CheatRule] = {
    **dict.fromkeys(["threading", "_thread", "concurrent", "asyncio", "queue", "sched"], R.THREADS),
    **dict.fromkeys(["subprocess", "multiprocessing", "pty", "pexpect", "torch.multiprocessing"], R.PROCESSES),
    **dict.fromkeys(["ctypes", "_ctypes", "cffi", "mmap"], R.CTYPES),
    **dict.fromkeys(
        ["gc", "inspect", "sys", "importlib", "builtins", "traceback", "weakref", "types", "dis", "code",
         "codeop", "__main__", "runpy", "ast", "torch._C", "site", "linecache"],
        R.INTROSPECTION,
    ),
    **dict.fromkeys(["pickle", "marshal", "copyreg", "base64", "binascii", "zlib", "codecs", "dill"],
                    R.DYNAMIC_CODE),
    **dict.fromkeys(
        ["os", "pathlib", "shutil", "tempfile", "io", "glob", "fcntl", "sqlite3", "h5py", "zipfile", "tarfile",
         "fileinput", "torch.utils.cpp_extension.load"],
        R.FILE_ACCESS,
    ),
    **dict.fromkeys(["socket", "urllib", "http", "requests", "httpx", "ssl", "ftplib", "smtplib", "aiohttp",
                     "torch.hub", "torch.distributed"], R.NETWORK),
    **dict.fromkeys(["time", "timeit", "datetime", "triton.testing", "torch.utils.benchmark"], R.TIMER_TAMPERING),
    **dict.fromkeys(["torch._dynamo", "torch._inductor", "torch.compiler", "torch.jit", "torch.export",
                     "torch.fx", "torch._export"], R.TORCH_COMPILE),
    **dict.fromkeys(["torch.overrides", "torch.utils._python_dispatch", "torch._subclasses"], R.TENSOR_SUBCLASS),
    **dict.fromkeys(["random", "secrets", "torch.random", "numpy.random"], R.RNG_TAMPERING),
    **dict.fromkeys(["signal", "resource", "atexit", "faulthandler"], R.PROCESS_CONTROL),
    **dict.fromkeys(["torch.library", "unittest"], R.MONKEYPATCH),
}  # fmt: skip
"""Module (or a prefix of it) -> the rule its import breaks. The longest matching prefix wins."""

BUILTIN_RULES: dict[str, CheatRule] = {
    "exec": R.DYNAMIC_CODE, "eval": R.DYNAMIC_CODE, "compile": R.DYNAMIC_CODE, "__import__": R.DYNAMIC_CODE,
    "open": R.FILE_ACCESS, "globals": R.INTROSPECTION, "locals": R.INTROSPECTION, "vars": R.INTROSPECTION,
    "setattr": R.MONKEYPATCH, "delattr": R.MONKEYPATCH, "exit": R.PROCESS_CONTROL, "quit": R.PROCESS_CONTROL,
    "breakpoint": R.PROCESS_CONTROL, "input": R.PROCESS_CONTROL, "memoryview": R.INTROSPECTION,
}  # fmt: skip
"""Builtins a candidate may not call."""

DUNDER_ATTRS = frozenset(
    {
        "__globals__", "__code__", "__closure__", "__subclasses__", "__bases__", "__mro__", "__dict__",
        "__getattribute__", "__reduce__", "__reduce_ex__", "__loader__", "__spec__", "__builtins__",
        "__import__", "__self__", "__func__", "__wrapped__", "f_back", "f_globals", "f_locals", "f_code",
        "f_builtins", "gi_frame", "cr_frame", "ag_frame", "tb_frame", "tb_next", "__traceback__",
    }
)  # fmt: skip
"""Attribute names that walk the interpreter's objects (frames, globals, subclasses)."""

CALL_PREFIX_RULES: tuple[tuple[str, CheatRule], ...] = (
    ("torch.compile", R.TORCH_COMPILE),
    ("torch.cuda.graph", R.TORCH_COMPILE),
    ("torch.cuda.CUDAGraph", R.TORCH_COMPILE),
    ("torch.cuda.make_graphed_callables", R.TORCH_COMPILE),
    ("torch.cuda.graphs", R.TORCH_COMPILE),
    ("torch.manual_seed", R.RNG_TAMPERING),
    ("torch.seed", R.RNG_TAMPERING),
    ("torch.set_rng_state", R.RNG_TAMPERING),
    ("torch.get_rng_state", R.RNG_TAMPERING),
    ("torch.cuda.manual_seed", R.RNG_TAMPERING),
    ("torch.cuda.seed", R.RNG_TAMPERING),
    ("torch.cuda.set_rng_state", R.RNG_TAMPERING),
    ("torch.cuda.get_rng_state", R.RNG_TAMPERING),
    ("torch.Generator", R.RNG_TAMPERING),
    ("torch.set_float32_matmul_precision", R.PRECISION_FLAGS),
    ("torch.set_default_dtype", R.PRECISION_FLAGS),
    ("torch.set_default_tensor_type", R.PRECISION_FLAGS),
    ("torch.set_flush_denormal", R.PRECISION_FLAGS),
    ("torch.backends", R.PRECISION_FLAGS),
    ("torch.save", R.FILE_ACCESS),
    ("torch.load", R.FILE_ACCESS),
    ("torch.from_file", R.FILE_ACCESS),
    ("numpy.load", R.FILE_ACCESS),
    ("numpy.save", R.FILE_ACCESS),
    ("numpy.fromfile", R.FILE_ACCESS),
    ("numpy.memmap", R.FILE_ACCESS),
    ("torch.cuda.Event", R.TIMER_TAMPERING),
    ("torch.cuda.Stream", R.DEFERRED_WORK),
    ("torch.cuda.stream", R.DEFERRED_WORK),
    ("torch.cuda.ExternalStream", R.DEFERRED_WORK),
    ("torch.cuda.set_stream", R.DEFERRED_WORK),
    ("torch.cuda.set_per_process_memory_fraction", R.PROCESS_CONTROL),
    ("torch.cuda.memory", R.PROCESS_CONTROL),
    ("torch.cuda.empty_cache", R.PROCESS_CONTROL),
    ("torch.cuda.set_device", R.PROCESS_CONTROL),
    ("torch.Tensor._make_subclass", R.TENSOR_SUBCLASS),
    ("torch.Tensor._make_wrapper_subclass", R.TENSOR_SUBCLASS),
    ("torch.ops.aten", R.TORCH_COMPUTE),
    ("torch.ops.prims", R.TORCH_COMPUTE),
)
"""Qualified call prefixes and the rule they break, wherever they are called."""

ALLOWED_TORCH_CALLS = frozenset(
    {
        "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like",
        "torch.full", "torch.full_like", "torch.ones", "torch.ones_like", "torch.tensor", "torch.as_tensor",
        "torch.is_tensor", "torch.is_floating_point", "torch.numel", "torch.device", "torch.Size",
        "torch.finfo", "torch.iinfo", "torch.get_default_dtype", "torch.promote_types", "torch.result_type",
        "torch.broadcast_shapes", "torch.no_grad", "torch.inference_mode", "torch.enable_grad",
        "torch.cuda.current_stream", "torch.cuda.current_device", "torch.cuda.device",
        "torch.cuda.get_device_properties", "torch.cuda.get_device_capability", "torch.cuda.is_available",
        "torch.cuda.synchronize", "torch.cuda.device_count", "torch.cuda.get_device_name",
        "torch.cuda.default_stream", "torch.autograd.Function", "torch.nn.Parameter",
    }
)  # fmt: skip
"""Torch calls allowed on the forward path: allocation, metadata and device queries."""

COMPUTE_METHODS = frozenset(
    {
        "add", "sub", "mul", "div", "true_divide", "floor_divide", "matmul", "mm", "bmm", "addmm", "baddbmm",
        "addmv", "mv", "dot", "outer", "einsum", "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax",
        "argmin", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "pow", "abs", "neg", "relu",
        "relu_", "sigmoid", "tanh", "softmax", "log_softmax", "clamp", "clamp_", "clip", "where", "masked_fill",
        "cumsum", "cumprod", "sort", "topk", "var", "std", "norm", "round", "floor", "ceil", "sign", "erf",
        "sin", "cos", "reciprocal", "square", "index_select", "gather", "scatter", "scatter_add", "add_",
        "mul_", "sub_", "div_", "pow_", "exp_", "logsumexp",
        "conv2d", "conv1d", "conv3d", "linear", "maximum", "minimum", "lerp", "addcmul", "addcdiv", "all",
        "any", "flip", "roll", "tril", "triu", "cross", "diag", "trace", "kthvalue", "median", "mode",
        "unfold", "repeat", "repeat_interleave", "tile", "nan_to_num", "sigmoid_", "tanh_",
    }
)  # fmt: skip
"""Tensor methods that compute (a candidate's forward must leave compute to its own kernels)."""

# C++/CUDA source patterns (inside load_inline strings): (regex, rule, severity-is-review).
CPP_PATTERNS: tuple[tuple[re.Pattern[str], CheatRule, bool, str], ...] = (
    (re.compile(r"\b(?:torch|at)::(?:matmul|mm|bmm|addmm|baddbmm|conv\w*|relu|softmax|log_softmax|sum|mean|"
                r"amax|max|min|exp|log|tanh|sigmoid|linear|layer_norm|batch_norm|group_norm|gelu|einsum|add|"
                r"mul|sub|div|where|clamp|pow|sqrt|rsqrt|norm|cumsum|matrix_power|dot|silu|mish|var|std)\s*\("),
     R.TORCH_COMPUTE, False, "calls a torch/ATen compute op from C++"),
    (re.compile(r"\.\s*(?:matmul|mm|bmm|addmm|softmax|log_softmax|relu|sigmoid|tanh|exp|sum|mean|amax|"
                r"clamp|pow|sqrt|cumsum|norm)\s*\("),
     R.TORCH_COMPUTE, False, "calls a tensor compute method from C++"),
    (re.compile(r"\bcublas\w*|\bcudnn\w*|\bcutlass::"), R.TORCH_COMPUTE, True,
     "calls a vendor library (cuBLAS/cuDNN/CUTLASS) rather than its own kernel"),
    (re.compile(r"std::thread|pthread_create|std::async|#\s*include\s*<thread>"), R.THREADS, False,
     "starts threads from C++"),
    (re.compile(r"\bfork\s*\(|\bsystem\s*\(|\bpopen\s*\(|\bexec[lv]p?e?\s*\("), R.PROCESSES, False,
     "starts processes from C++"),
    (re.compile(r"\bdlopen\b|\bdlsym\b"), R.CTYPES, False, "loads native code at run time"),
    (re.compile(r"\bfopen\b|std::[io]?fstream|#\s*include\s*<fstream>|\bunlink\s*\("), R.FILE_ACCESS, False,
     "touches files from C++"),
    (re.compile(r"\bgetenv\b|\bsetenv\b|\benviron\b"), R.ENVIRONMENT, False, "reads the environment from C++"),
    (re.compile(r"\bsocket\s*\(|\bconnect\s*\(|#\s*include\s*<sys/socket"), R.NETWORK, False,
     "opens network connections from C++"),
    (re.compile(r"cudaStreamCreate\w*|cudaLaunchHostFunc|cudaStreamAddCallback"), R.DEFERRED_WORK, False,
     "creates side streams or deferred host work"),
    (re.compile(r"cudaEvent(?:Record|ElapsedTime|Synchronize)|\bclock_gettime\b|std::chrono"),
     R.TIMER_TAMPERING, False, "uses timers"),
    (re.compile(r"\bkill\s*\(|\bexit\s*\(|\babort\s*\(|\bsignal\s*\("), R.PROCESS_CONTROL, False,
     "controls the process from C++"),
)  # fmt: skip

CUDA_KERNEL_RE = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")
"""Names of ``__global__`` kernels in CUDA sources."""

TORCH_LIBRARY_RE = re.compile(r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,")
"""Custom-op namespaces a native source registers (their ops run its own compiled code)."""

TRITON_DECORATORS = frozenset(
    {"triton.jit", "triton.autotune", "triton.heuristics", "triton.language.jit", "triton.runtime.jit.jit"}
)
"""Decorators that make a function a Triton kernel."""
