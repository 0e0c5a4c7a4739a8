"""The directive library that meta-prompt sections are seeded from and mutate with.

Each role has nine directives (three seed sections of three); ``SHARED_DIRECTIVES`` may enter
any role's sections by mutation. Directives are short imperative sentences an LLM can act on.
"""

from __future__ import annotations

from schemas import Role

DIRECTIVES: dict[Role, tuple[str, ...]] = {
    Role.MEMORY: (
        "Read every input element exactly once and write every output element exactly once.",
        "Make consecutive threads touch consecutive addresses; transpose through shared memory if needed.",
        "Load and store with the widest vector width the alignment allows.",
        "Keep intermediates in registers instead of writing them to global memory between steps.",
        "Process several rows per program when rows are short, so each program moves enough bytes.",
        "Prefer contiguous inputs: call .contiguous() once on the host rather than gathering in the kernel.",
        "Cache values reused across a reduction in registers rather than re-reading them.",
        "Count the bytes the kernel moves and compare with the minimum the task needs; remove the excess.",
        "Avoid materialising broadcast tensors; index the smaller operand directly.",
    ),
    Role.FUSION: (
        "Fuse the whole elementwise chain into one kernel; never launch a kernel per op.",
        "Fold bias, activation, scaling and residual into the epilogue of the main kernel.",
        "Compute a reduction and the elementwise work that consumes it in the same program.",
        "Count kernel launches per forward and aim for one where the data dependencies allow.",
        "Fuse the normalisation statistics pass with the normalise-and-scale pass when a row fits on chip.",
        "Fuse ops with different parallel layouts only if that costs less than a round trip to memory.",
        "Apply activations in float32 and cast once, at the final store.",
        "Merge consecutive reshapes and views into index arithmetic inside the kernel.",
        "Precompute constant transforms of parameters once in __init__, not per forward.",
    ),
    Role.TILING: (
        "Choose block sizes that divide the common problem sizes and mask the remainder.",
        "Use num_warps 4 for small tiles and 8 for tiles of 128x128 and above.",
        "Use num_stages 3 or 4 to pipeline loads in loops over K.",
        "Launch enough programs to fill every SM at least twice.",
        "Give each program a whole row when a row fits in one block; otherwise loop over the row.",
        "Group program ids along M so neighbouring programs reuse the same tiles of B from L2.",
        "Use tl.dot with float32 accumulation and tiles that are multiples of 16.",
        "For a few long reductions, split each across programs and combine them in a second pass.",
        "Pick BLOCK as the next power of two of the row length when rows hold a few thousand elements.",
    ),
    Role.ALGORITHM: (
        "Use an online (single-pass) softmax or logsumexp: running max and rescaled running sum.",
        "Compute mean and variance in one pass with Welford's update instead of two passes.",
        "Reassociate scalings and additions so they happen on the smaller tensor.",
        "Exploit structure in the reference (broadcasts, repeated reductions) to skip redundant work.",
        "Replace a sequence of reductions over the same axis with one pass computing all of them.",
        "Use numerically stable forms: subtract the max before exp, use log1p and expm1 where they help.",
        "Move work that does not depend on the input out of forward.",
        "Turn a matmul with a tiny inner dimension into fused multiply-adds in one elementwise kernel.",
        "Keep accuracy at float32 rounding: never accumulate in half precision.",
    ),
    Role.REPAIR: (
        "Find the root cause in the evidence before changing anything; quote the failing line to yourself.",
        "Check every mask: offsets < n on loads and stores, other= values neutral for the reduction.",
        "Check index arithmetic against the strides of the actual tensors, including batch dimensions.",
        "Check that output shape and dtype match the reference exactly, including keepdim behaviour.",
        "Use tl.constexpr only for values known at compile time; pass sizes as runtime arguments.",
        "If a value overflows int32 indexing, cast offsets to int64.",
        "Remove anything the static gate rejects and do that work inside the kernel instead.",
        "When results are off by small amounts, accumulate in float32 and compare the order of operations.",
        "Keep the parts of the candidate that work; change the smallest thing that fixes the failure.",
    ),
    Role.GENERAL: (
        "State which resource limits this kernel (bandwidth, compute, launches) and optimise for that.",
        "Fuse what the reference runs as separate ops into as few kernels as possible.",
        "Mask every edge: the problem sizes are often not powers of two.",
        "Accumulate in float32 and match the reference to float32 rounding.",
        "Choose tile sizes from the problem shapes, not from habit.",
        "Learn from the experiences shown: repeat what improved fitness, avoid what failed.",
        "Prefer one simple correct kernel to an ambitious one that may be wrong.",
        "Keep the host-side code minimal: allocate outputs, launch, return.",
        "Use the diagnosis hints as the first thing to try.",
    ),
}
"""Directives per role."""

SHARED_DIRECTIVES: tuple[str, ...] = (
    "Double-check boundary masks before anything else.",
    "Explain in one sentence why the new version should be faster.",
    "Do not change what already works unless it is the bottleneck.",
)
"""Directives any role's sections may take up by mutation."""
