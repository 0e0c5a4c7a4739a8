"""Compiler and runtime messages → diagnosis categories, with the lines they rest on.

Reads what a failed candidate left behind: nvcc / ptxas / g++ errors (also when wrapped by
ninja and ``torch.utils.cpp_extension.load_inline``), Triton compile errors (``CompilationError:
at L:C:`` with the kernel line and caret), Triton interpreter errors (``InterpreterError:
NameError(...)``), Python tracebacks, PyTorch shape/dtype/allocation errors, CUDA runtime errors
and crash reports (signals, ``faulthandler``). Every finding names its category from
``schemas.DiagnosisCategory``, the tool that produced the message, the evidence lines, where in
the source it points, and a specific hint where the message says more than its category.

Kernel-language errors (a Triton shape or type clash, an undefined name inside a kernel) are
compile errors even when the Triton interpreter raises them at run time: on a GPU the same
kernel fails to compile. The messages recognised here were captured from real tools; see
``tests/diagnosis/data/manifest.json``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from schemas import DiagnosisCategory as C

_MAX_LINE = 300


class LogSource(StrEnum):
    """The tool whose message a finding rests on."""

    NVCC = "nvcc"
    PTXAS = "ptxas"
    CXX = "c++"
    NINJA = "ninja"
    TRITON = "triton"
    PYTHON = "python"
    TORCH = "torch"
    CUDA = "cuda"
    PROCESS = "process"


@dataclass(frozen=True)
class LogFinding:
    """One recognised message."""

    category: C
    """Category of the cause."""
    source: LogSource
    """Tool that produced the message."""
    message: str
    """The message itself, one line."""
    evidence: tuple[str, ...]
    """The lines it rests on (message, location, offending source line)."""
    specificity: int
    """How specific the match is; the most specific finding explains the failure best."""
    location: str | None = None
    """Where it points: ``file:line`` or ``kernel line L:C``."""
    hint: str | None = None
    """Advice specific to this message, beyond what its category implies."""


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    category: C
    source: LogSource
    specificity: int
    hint: str | None = None


def _r(pattern: str, category: C, source: LogSource, specificity: int = 30, hint: str | None = None) -> _Rule:
    return _Rule(re.compile(pattern), category, source, specificity, hint)


S = LogSource
_SMEM_HINT = "Reduce BLOCK sizes or num_stages (or the static __shared__ array) so the kernel fits."
_RULES: tuple[_Rule, ...] = (
    # nvcc front end
    _r(r'error: identifier "[^"]+" is undefined', C.COMPILE_TYPE, S.NVCC),
    _r(
        r'error: namespace "cub" has no member "(?:Max|Min|Sum)"',
        C.COMPILE_TYPE,
        S.NVCC,
        32,
        "CUDA 13 removed cub::Max/cub::Min/cub::Sum: use cuda::maximum<>(), cuda::minimum<>(), "
        "cuda::std::plus<>() from <cuda/functional>.",
    ),
    _r(r'error: (?:namespace|class|struct|union) "[^"]+" has no member', C.COMPILE_TYPE, S.NVCC),
    _r(r"error: no instance of (?:overloaded )?function", C.COMPILE_TYPE, S.NVCC),
    _r(r"error: a value of type .* cannot be (?:used to initialize|assigned)", C.COMPILE_TYPE, S.NVCC),
    _r(r"error: argument of type .* is incompatible with", C.COMPILE_TYPE, S.NVCC),
    _r(r"error: no suitable (?:conversion|constructor)", C.COMPILE_TYPE, S.NVCC),
    _r(r'error: expected an? (?:"|identifier|expression|declaration|type)', C.COMPILE_SYNTAX, S.NVCC),
    _r(r"cannot open source file", C.COMPILE_IMPORT, S.NVCC),
    # host compiler (g++, also behind nvcc and ninja)
    _r(r"error: expected .* before", C.COMPILE_SYNTAX, S.CXX),
    _r(r"error: expected (?:primary-expression|unqualified-id|initializer)", C.COMPILE_SYNTAX, S.CXX),
    _r(r"error: .* was not declared in this scope", C.COMPILE_TYPE, S.CXX),
    _r(r"error: use of undeclared identifier", C.COMPILE_TYPE, S.CXX),
    _r(r"error: .* is not a member of", C.COMPILE_TYPE, S.CXX),
    _r(r"error: (?:no matching function|invalid conversion|cannot convert)", C.COMPILE_TYPE, S.CXX),
    _r(r"fatal error: .*: No such file or directory", C.COMPILE_IMPORT, S.CXX),
    _r(r"undefined reference to|undefined symbol:", C.COMPILE_IMPORT, S.CXX),
    # ptxas
    _r(r"uses too much (?:shared|local) data", C.COMPILE_RESOURCES, S.PTXAS, 30, _SMEM_HINT),
    _r(r"uses too many registers|Entry function .* uses too many", C.COMPILE_RESOURCES, S.PTXAS),
    _r(r"not supported on \.target", C.COMPILE_UNSUPPORTED, S.PTXAS),
    _r(r"[Uu]nsupported gpu architecture|requires compute capability", C.COMPILE_UNSUPPORTED, S.NVCC),
    # Triton front end and interpreter
    _r(
        r"arange's range must be a power of 2",
        C.COMPILE_UNSUPPORTED,
        S.TRITON,
        30,
        "tl.arange needs a power-of-two length: round the block up with triton.next_power_of_2 and mask the tail.",
    ),
    _r(
        r"numel \(\d+\) exceeds triton maximum tensor numel",
        C.COMPILE_RESOURCES,
        S.TRITON,
        30,
        "A Triton block may hold at most 2**20 elements: loop over the dimension in smaller blocks.",
    ),
    _r(r"out of resource: shared memory", C.COMPILE_RESOURCES, S.TRITON, 30, _SMEM_HINT),
    _r(r"out of resource: (?:registers|threads)", C.COMPILE_RESOURCES, S.TRITON),
    _r(r"Cannot make_shape_compatible|incompatible dimensions at index", C.COMPILE_TYPE, S.TRITON),
    _r(r"must have equal ranks|Both inputs must be either 2D or 3D", C.COMPILE_TYPE, S.TRITON),
    _r(
        r"Unsupported ptr type",
        C.COMPILE_TYPE,
        S.TRITON,
        30,
        "A tl.load/tl.store got a value that is not a pointer: pass tensors, not Python numbers, "
        "for pointer arguments.",
    ),
    _r(r"unsupported AST node type|is not supported in triton|Unsupported language", C.COMPILE_UNSUPPORTED, S.TRITON),
    _r(r"Pointer argument \(at \d+\) cannot be accessed from Triton", C.RUNTIME_DTYPE, S.TRITON),
    # CUDA runtime
    _r(r"illegal memory access", C.RUNTIME_ILLEGAL_ACCESS, S.CUDA),
    _r(r"misaligned address", C.RUNTIME_ILLEGAL_ACCESS, S.CUDA),
    _r(r"device-side assert triggered", C.RUNTIME_ILLEGAL_ACCESS, S.CUDA),
    _r(r"index out of bounds\"?` failed", C.RUNTIME_ILLEGAL_ACCESS, S.CUDA, 31),
    _r(r"CUDA out of memory|OutOfMemoryError", C.RUNTIME_OOM, S.CUDA),
    _r(
        r"too many resources requested for launch",
        C.RUNTIME_LAUNCH,
        S.CUDA,
        30,
        "Fewer threads per block (num_warps) or fewer registers per thread (smaller tiles).",
    ),
    _r(r"invalid configuration argument", C.RUNTIME_LAUNCH, S.CUDA),
    _r(
        r"no kernel image is available|invalid device function",
        C.RUNTIME_LAUNCH,
        S.CUDA,
        30,
        "The binary was not built for this GPU's architecture (TORCH_CUDA_ARCH_LIST / -arch).",
    ),
    _r(r"unspecified launch failure", C.RUNTIME_CRASH, S.CUDA),
    # host memory
    _r(r"can't allocate memory|Cannot allocate memory|std::bad_alloc", C.RUNTIME_OOM, S.TORCH),
    # PyTorch shape and dtype errors
    _r(r"The size of tensor a \(\d+\) must match the size of tensor b", C.RUNTIME_SHAPE, S.TORCH),
    _r(r"shape '\[[^\]]*\]' is invalid for input of size", C.RUNTIME_SHAPE, S.TORCH),
    _r(r"mat1 and mat2 shapes cannot be multiplied", C.RUNTIME_SHAPE, S.TORCH),
    _r(r"Sizes of tensors must match|size mismatch|view size is not compatible", C.RUNTIME_SHAPE, S.TORCH),
    _r(r"index -?\d+ is out of bounds for dimension|Dimension out of range|too many indices", C.RUNTIME_SHAPE, S.TORCH),
    _r(r"expected scalar type \w+ but found \w+", C.RUNTIME_DTYPE, S.TORCH),
    _r(
        r"to have the same dtype|not implemented for '\w+'|can't be cast to the desired output type",
        C.RUNTIME_DTYPE,
        S.TORCH,
    ),
    _r(r"Expected all tensors to be on the same device", C.RUNTIME_DTYPE, S.TORCH),
    # processes that died
    _r(r"Segmentation fault|SIGSEGV|SIGBUS|\(core dumped\)|Fatal Python error", C.RUNTIME_CRASH, S.PROCESS, 25),
    _r(r"killed by (?:signal|SIG\w+)|terminated by signal|SIGABRT|^Aborted", C.RUNTIME_CRASH, S.PROCESS, 25),
    _r(r"process exited with (?:status|code) -?\d+", C.RUNTIME_CRASH, S.PROCESS, 12),
    # wrappers and generic compiler errors: the least specific
    _r(r"^\S+\(\d+\): error: ", C.COMPILE_OTHER, S.NVCC, 20),
    _r(r"^\S+:\d+:\d+: (?:fatal )?error: ", C.COMPILE_OTHER, S.CXX, 20),
    _r(r"^ptxas (?:fatal|error)", C.COMPILE_OTHER, S.PTXAS, 20),
    _r(r"Error building extension|ninja: build stopped", C.COMPILE_OTHER, S.NINJA, 15),
)

_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|OutOfResources))(?::\s*(.*))?$")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:,? in (.+))?$')
_NVCC_LOC = re.compile(r"^(\S+)\((\d+)\): ")
_CXX_LOC = re.compile(r"^(\S+?):(\d+):(\d+): ")
_TRITON_AT = re.compile(r"CompilationError: at (\d+):(\d+):")
_REPR = re.compile(r"""^(\w+)\((['"])(.*)\2\)$""")
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python3\.\d+/|^<frozen|^<string>")

_EXC_TYPES: dict[str, tuple[C, int]] = {
    "SyntaxError": (C.COMPILE_SYNTAX, 20),
    "IndentationError": (C.COMPILE_SYNTAX, 20),
    "TabError": (C.COMPILE_SYNTAX, 20),
    "ModuleNotFoundError": (C.COMPILE_IMPORT, 20),
    "ImportError": (C.COMPILE_IMPORT, 20),
    "MemoryError": (C.RUNTIME_OOM, 20),
    "OutOfMemoryError": (C.RUNTIME_OOM, 20),
}
_KERNEL_EXC_TYPES = frozenset({"NameError", "TypeError", "AttributeError", "AssertionError", "UnboundLocalError"})


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 1] + "…"


def _match_rules(text: str) -> _Rule | None:
    best: _Rule | None = None
    for rule in _RULES:
        if rule.pattern.search(text) and (best is None or rule.specificity > best.specificity):
            best = rule
    return best


def _code_after(lines: list[str], i: int) -> str | None:
    """The source line a compiler prints under its message (skipping gcc's ``7 |`` gutter)."""
    if i + 1 >= len(lines):
        return None
    nxt = lines[i + 1]
    if not nxt.strip() or _NVCC_LOC.match(nxt) or _CXX_LOC.match(nxt) or set(nxt.strip()) <= {"^", "~", "|"}:
        return None
    code = nxt.split("|", 1)[1] if re.match(r"^\s*\d+\s*\|", nxt) else nxt
    return _clip(code) or None


def _line_findings(lines: list[str]) -> list[tuple[int, LogFinding]]:
    found: list[tuple[int, LogFinding]] = []
    for i, line in enumerate(lines):
        rule = _match_rules(line)
        if rule is None:
            continue
        evidence = [_clip(line)]
        location: str | None = None
        if (m := _NVCC_LOC.match(line)) or (m := _CXX_LOC.match(line)):
            location = f"{m.group(1)}:{m.group(2)}"
        if location is not None and (code := _code_after(lines, i)):
            evidence.append(code)
        elif (exc := _EXC_LINE.match(line.strip())) is not None and not line.startswith((" ", "\t")):
            frame = _frame_for(lines, i, exc.group(1).rsplit(".", 1)[-1])
            _with_frame(evidence, frame)
            location = frame[0] if frame else None
        found.append(
            (
                i,
                LogFinding(
                    rule.category, rule.source, _clip(line), tuple(evidence), rule.specificity, location, rule.hint
                ),
            )
        )
    return found


def _user_frame(lines: list[str], before: int) -> tuple[str, str | None] | None:
    """The innermost traceback frame above ``before`` that is not library code, with its code line."""
    for j in range(before - 1, -1, -1):
        m = _FRAME.match(lines[j])
        if m and not _LIBRARY.search(m.group(1)):
            code = lines[j + 1].strip() if j + 1 < len(lines) and not _FRAME.match(lines[j + 1]) else None
            where = f"{m.group(1)}:{m.group(2)}" + (f" in {m.group(3).strip()}" if m.group(3) else "")
            return where, (_clip(code) if code else None)
    return None


def _frame_for(lines: list[str], i: int, exc: str) -> tuple[str, str | None] | None:
    """The frame an exception at line ``i`` points at.

    The Triton interpreter re-raises a kernel's error from its own frames; the kernel line is in
    the chained traceback printed above ``The above exception was the direct cause``.
    """
    if exc == "InterpreterError":
        for j in range(i - 1, -1, -1):
            if lines[j].startswith("The above exception was the direct cause"):
                inner = _user_frame(lines, j)
                if inner is not None:
                    return inner
                break
    return _user_frame(lines, i)


def _with_frame(evidence: list[str], frame: tuple[str, str | None] | None) -> None:
    if frame is not None:
        evidence.append(f"at {frame[0]}")
        if frame[1]:
            evidence.append(frame[1])


def _kernel_error(exc: str, message: str) -> tuple[C, int, str | None]:
    """Category of an error raised inside a Triton kernel (compile time or interpreter)."""
    inner_type, inner_msg = exc, message
    if m := _REPR.match(message.strip()):
        inner_type, inner_msg = m.group(1), m.group(3)
    rule = _match_rules(inner_msg)
    if rule is not None and rule.specificity >= 30:
        return rule.category, rule.specificity + 1, rule.hint
    if inner_type in _KERNEL_EXC_TYPES:
        return C.COMPILE_TYPE, 28, None
    return C.COMPILE_OTHER, 22, None


def _triton_compile_findings(lines: list[str]) -> list[tuple[int, LogFinding]]:
    found: list[tuple[int, LogFinding]] = []
    for i, line in enumerate(lines):
        m = _TRITON_AT.search(line)
        if m is None:
            continue
        block: list[str] = []
        for nxt in lines[i + 1 :]:
            if not nxt.strip() or nxt.startswith(("Traceback", "The above exception", "During handling")):
                break
            block.append(nxt)
        if not block:
            continue
        message = block[-1].strip()
        carets = [k for k, b in enumerate(block) if set(b.strip()) == {"^"}]
        code = block[carets[-1] - 1].strip() if carets and carets[-1] > 0 else None
        category, spec, hint = _kernel_error("CompilationError", message)
        where = f"kernel line {m.group(1)}:{m.group(2)}"
        evidence = tuple(x for x in (_clip(message), f"Triton CompilationError at {where}", _clip(code or "")) if x)
        found.append((i, LogFinding(category, S.TRITON, _clip(message), evidence, spec, where, hint)))
    return found


def _exception_findings(lines: list[str]) -> list[tuple[int, LogFinding]]:
    found: list[tuple[int, LogFinding]] = []
    for i, line in enumerate(lines):
        m = _EXC_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if m is None:
            continue
        qualified, message = m.group(1), (m.group(2) or "").strip()
        exc = qualified.rsplit(".", 1)[-1]
        frame = _frame_for(lines, i, exc)
        location = frame[0] if frame else None
        evidence = [_clip(line)]
        _with_frame(evidence, frame)
        hint: str | None = None
        if exc == "InterpreterError" or qualified.startswith("triton.compiler"):
            category, spec, hint = _kernel_error(exc, message)
            source = S.TRITON
        elif exc in _EXC_TYPES:
            category, spec = _EXC_TYPES[exc]
            source = S.PYTHON
        else:
            category, spec, source = C.RUNTIME_EXCEPTION, 10, S.PYTHON
        found.append((i, LogFinding(category, source, _clip(line), tuple(evidence), spec, location, hint)))
    return found


def parse_log(text: str | None) -> tuple[LogFinding, ...]:
    """Every recognised message in ``text``, the one that best explains the failure first.

    Ties in specificity go to the earliest message: a compiler's first error is usually the cause
    of the ones after it.
    """
    if not text:
        return ()
    lines = text.splitlines()
    found = _line_findings(lines) + _triton_compile_findings(lines) + _exception_findings(lines)
    found.sort(key=lambda item: (-item[1].specificity, item[0]))
    return tuple(finding for _, finding in found)


def classify_log(text: str | None) -> LogFinding | None:
    """The finding that best explains the failure, or ``None`` when nothing is recognised."""
    findings = parse_log(text)
    return findings[0] if findings else None
