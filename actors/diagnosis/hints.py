"""Advice per diagnosis category, and the expert role best placed to act on it.

Plain language an expert (an LLM role prompt or the template expert's mutation operator) can act
on. The rule diagnoser adds message-specific advice from the log parser and measured numbers on
top of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from schemas import CheatRule, DiagnosisCategory, Role

C = DiagnosisCategory

_FAMILY_ROLE: Mapping[str, Role] = MappingProxyType(
    {"compile": Role.REPAIR, "runtime": Role.REPAIR, "incorrect": Role.REPAIR, "rejected": Role.REPAIR}
)
_ROLE: Mapping[C, Role] = MappingProxyType(
    {
        C.COMPILE_RESOURCES: Role.TILING,
        C.RUNTIME_LAUNCH: Role.TILING,
        C.RUNTIME_OOM: Role.MEMORY,
        C.SLOW_LAUNCH_BOUND: Role.FUSION,
        C.SLOW_MEMORY_BOUND: Role.MEMORY,
        C.SLOW_COMPUTE_BOUND: Role.TILING,
        C.SLOW_LATENCY_BOUND: Role.TILING,
        C.SLOW_FAR_FROM_SOL: Role.ALGORITHM,
        C.AT_SOL: Role.TILING,
    }
)


def suggested_role(category: C) -> Role:
    """The expert role best placed to act on ``category``."""
    return _ROLE.get(category) or _FAMILY_ROLE.get(category.family, Role.GENERAL)


_HINTS: Mapping[C, tuple[str, ...]] = MappingProxyType(
    {
        C.EVALUATOR_FAULT: (
            "The evaluator could not judge this candidate (its own fault, not the kernel's); nothing is "
            "known about it yet.",
        ),
        C.COMPILE_SYNTAX: ("Fix the syntax at the line shown; keep the file a complete, importable module.",),
        C.COMPILE_IMPORT: (
            "Import only torch, triton, triton.language, math and the standard library; define every "
            "helper in the file itself.",
        ),
        C.COMPILE_TYPE: (
            "A name, type or block shape does not match at the line shown: declare the name, make the "
            "operand shapes agree (broadcast explicitly with [:, None] / [None, :]) and cast where needed.",
        ),
        C.COMPILE_RESOURCES: (
            "The kernel asks for more shared memory or registers than the GPU has: use smaller BLOCK "
            "sizes, fewer num_stages or fewer warps.",
        ),
        C.COMPILE_UNSUPPORTED: (
            "The construct is not available in this Triton/CUDA version or on this architecture: use "
            "the supported equivalent (power-of-two blocks with masks, plain loops).",
        ),
        C.COMPILE_TIMEOUT: (
            "Compilation took too long: fewer unrolled loops (tl.static_range), smaller constexpr "
            "blocks, fewer autotune configurations.",
        ),
        C.COMPILE_OTHER: ("Read the first compiler error shown and fix it before anything else.",),
        C.RUNTIME_OOM: (
            "Allocate only the output and small scratch buffers; never materialise an intermediate "
            "larger than the inputs.",
        ),
        C.RUNTIME_ILLEGAL_ACCESS: (
            "A kernel reads or writes outside its tensors: mask every tl.load/tl.store with "
            "offs < n, check row/column strides and the grid size, use int64 offsets for large tensors.",
        ),
        C.RUNTIME_LAUNCH: (
            "The launch configuration is invalid for this GPU: grid dimensions within limits, fewer "
            "threads per block, smaller tiles.",
        ),
        C.RUNTIME_SHAPE: (
            "Tensor shapes disagree at the line shown: derive every size from the inputs' .shape and "
            "return the reference's output shape.",
        ),
        C.RUNTIME_DTYPE: (
            "Argument dtypes or devices disagree: keep the reference's dtypes, allocate outputs with "
            "torch.empty(..., dtype=x.dtype, device=x.device) and pass tensors (not numbers) as pointers.",
        ),
        C.RUNTIME_CRASH: (
            "The process died (segfault or abort): look for out-of-bounds pointer arithmetic and "
            "unchecked indices in the kernel.",
        ),
        C.RUNTIME_TIMEOUT: (
            "The forward did not finish in time: check loop bounds and termination, the grid size, and "
            "per-element Python loops.",
        ),
        C.RUNTIME_EXCEPTION: ("Fix the exception at the frame shown; forward must run with the reference's inputs.",),
        C.INCORRECT_SHAPE: ("Return exactly the reference's output shape and dtype.",),
        C.INCORRECT_NAN_INF: (
            "NaN/Inf appear: subtract the row maximum before exp, guard divisions and sqrt/log of "
            "non-positive values, and use other=0 (or -inf for max) on masked loads.",
            "If whole regions are NaN the kernel never wrote them (outputs start as garbage): make the "
            "grid cover every element (triton.cdiv(n, BLOCK)) and check the store mask.",
        ),
        C.INCORRECT_BOUNDARY: (
            "Errors sit at the edges: mask the tail block (offs < n) in both loads and stores, round "
            "block counts up with triton.cdiv, and use neutral fill values for masked lanes.",
        ),
        C.INCORRECT_INDEXING: (
            "Most outputs are wrong: check the offsets and strides (row * stride_row + col), the "
            "program-id mapping and any transposition.",
        ),
        C.INCORRECT_PRECISION: (
            "Errors are small but above the bar: accumulate in float32, pass input_precision='ieee' to "
            "tl.dot for fp32, and avoid lower-precision intermediates.",
        ),
        C.INCORRECT_RACE: (
            "Results change between runs on the same inputs: remove unsynchronised writes to the same "
            "location, use atomics or a separate reduction pass, and never read uninitialised memory.",
        ),
        C.INCORRECT_HELD_OUT: (
            "Correct at the reference's shapes only: take every size from the inputs at run time "
            "(x.shape, x.stride()) and pass it to the kernel, size grids with triton.cdiv of it, mask "
            "every edge (an odd batch, a last partial tile, a batch of one); never hard-code a size. "
            "Raising a clear error for a shape the kernel cannot take is allowed; wrong outputs are not.",
        ),
        C.INCORRECT_OTHER: ("Compare the kernel's formula with the reference's forward step by step.",),
        C.SLOW_LAUNCH_BOUND: (
            "Launch overhead dominates: fuse the kernels into one (elementwise epilogues into the "
            "producer), and give each program more work.",
        ),
        C.SLOW_MEMORY_BOUND: (
            "Memory traffic limits speed: read each input once, fuse passes, use contiguous vectorised "
            "loads with larger BLOCK and enough warps to cover latency.",
        ),
        C.SLOW_COMPUTE_BOUND: (
            "Arithmetic limits speed: tile for reuse (BLOCK_M/N/K), tune num_warps and num_stages, "
            "group programs (GROUP_M) for cache reuse.",
        ),
        C.SLOW_LATENCY_BOUND: (
            "Warps wait and neither DRAM nor the SMs are busy: put more work in flight (more programs: "
            "smaller tiles or split-K; more pipelining stages; fewer registers per thread for occupancy) "
            "and shorten dependency chains (long_scoreboard: loads; barrier: fewer synchronisations).",
        ),
        C.SLOW_FAR_FROM_SOL: (
            "Far from the bound: change the algorithm (one pass instead of several, a blocked "
            "reduction, fewer intermediate tensors) before tuning constants.",
        ),
        C.AT_SOL: ("At the bound: only small tuning (num_warps, BLOCK) is left; prefer robustness.",),
    }
)

_RULE_HINTS: Mapping[CheatRule, str] = MappingProxyType(
    {
        CheatRule.TORCH_COMPUTE: "Do the computation in your own kernel; torch may only allocate and reshape.",
        CheatRule.TORCH_FALLBACK: "Remove the try/except fallback to PyTorch; the kernel must always run.",
        CheatRule.NO_KERNEL_LAUNCHED: "forward must launch the candidate's own kernels for the real work.",
        CheatRule.INPUT_MUTATED: "Never write into the inputs; allocate a fresh output.",
        CheatRule.OUTPUT_ALIASES_INPUT: "Return a new tensor, not an input or a view of one.",
        CheatRule.TORCH_COMPILE: "Write the kernel yourself; torch.compile and CUDA graphs are not allowed.",
        CheatRule.PRECISION_FLAGS: "Do not change global precision flags; keep the reference's precision.",
        CheatRule.DEFERRED_WORK: "Finish all work inside forward on the current stream; no side streams or threads.",
        CheatRule.IMPLAUSIBLE_SPEED: "The timing is faster than physics allows: make sure all the work is done.",
        CheatRule.TIMER_TAMPERING: "Do every call's work inside forward, never synchronise with the device "
        "there (.item(), .cpu(), printing tensors) and never touch timers or what the process reports: the "
        "evaluator's own clock saw time outside the timed call.",
        CheatRule.OUTPUT_LAYOUT: "Return outputs in the reference's layout (contiguous where it is contiguous).",
    }
)


def hints_for(category: C) -> tuple[str, ...]:
    """General advice for ``category``."""
    if category in _HINTS:
        return _HINTS[category]
    return ("Remove the construct the anti-cheat gate refused and compute the result honestly in a kernel.",)


def rule_hint(rule: CheatRule) -> str | None:
    """Advice for one anti-cheat rule, where there is more to say than the rule's name."""
    return _RULE_HINTS.get(rule)
