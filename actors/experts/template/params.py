"""Template parameters: the space evolution searches, and the header that carries them.

Parameters are per kernel kind (every elementwise kernel of a plan shares ``pw_*``, every row
kernel ``row_*``, every matrix-product kernel ``mm_*``, every convolution ``conv_*``), plus two
fusion switches. Every value in
the space renders a correct kernel; the space only changes speed (and, for ``mm_precision``,
which fp32-accurate dot algorithm runs: ``ieee`` or the three-pass ``tf32x3``; likewise
``conv_precision``, which also has ``fma``, a product summed without ``tl.dot``, and ``tf32``, one
TF32 pass: the precision of the reference's own cuDNN convolutions at PyTorch's defaults, which
precision parity admits, and only where the run's precision is ``reference``; ``mm_split_k``
also changes the order of the fp32 sums, towards more accurate).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from actors.experts.template.errors import InvalidParams

HEADER_PREFIX = "# kf-template: "
_HEADER = re.compile(r"^# kf-template: (\{.*\})\s*$", re.MULTILINE)

SPACE: dict[str, tuple[object, ...]] = {
    "pw_warps": (1, 2, 4, 8, 16),
    "pw_ept": (1, 2, 4, 8, 16),
    "row_warps": (1, 2, 4, 8, 16),
    "row_block_m": (1, 2, 4, 8, 16, 32),
    "row_block_r": (64, 128, 256, 512, 1024, 2048, 4096, 8192),
    "row_block_i": (8, 16, 32, 64, 128, 256),
    "row_one_pass": (True, False),
    "row_stages": (1, 2, 3, 4),
    "mm_block_m": (16, 32, 64, 128, 256),
    "mm_block_n": (16, 32, 64, 128, 256),
    "mm_block_k": (16, 32, 64, 128),
    "mm_group_m": (1, 2, 4, 8, 16),
    "mm_warps": (1, 2, 4, 8, 16),
    "mm_stages": (1, 2, 3, 4, 5),
    "mm_precision": ("ieee", "tf32x3"),
    "mm_split_k": (1, 2, 4, 8, 16, 32, 64, 128),
    "mm_persistent": (False, True),
    "mm_tma": (False, True),
    "mm_pad": (False, True),
    "conv_block_m": (16, 32, 64, 128, 256),
    "conv_block_n": (1, 2, 4, 8, 16, 32, 64, 128),
    "conv_block_k": (16, 32, 64),
    "conv_warps": (1, 2, 4, 8),
    "conv_stages": (1, 2, 3, 4),
    "conv_precision": ("ieee", "tf32x3", "tf32", "fma"),
    "conv_taps_outer": (False, True),
    "conv_a_transposed": (False, True),
    "conv_layout": ("nchw", "nhwc"),
    "conv_preround": (False, True),
    "attn_block_m": (16, 32, 64, 128),
    "attn_block_n": (16, 32, 64, 128),
    "attn_block_k": (16, 32, 64, 128),
    "attn_block_d": (16, 32, 64, 128, 256),
    "attn_warps": (1, 2, 4, 8),
    "attn_stages": (1, 2, 3),
    "attn_precision": ("ieee", "tf32x3"),
    "fuse_epilogue": (True, False),
    "fuse_prologue": (True, False),
    "share_sizes": (False, True),
}
"""Every parameter and its allowed values, in order (mutation steps between neighbours)."""

ONE_PASS_MAX_TILE = 32768
"""Largest row tile (elements) kept in registers by a one-pass row kernel."""
_SMEM_BUDGET = 196_608
_ACC_PER_THREAD = 256


@dataclass(frozen=True)
class TemplateParams:
    """One point of the parameter space; validated at construction."""

    pw_warps: int = 4
    """Warps per elementwise program."""
    pw_ept: int = 4
    """Elements per thread in an elementwise program (the vector width); BLOCK = 32 * warps * ept."""
    row_warps: int = 4
    """Warps per row program."""
    row_block_m: int = 1
    """Rows per program when the reduced dims are innermost."""
    row_block_r: int = 1024
    """Chunk of the reduced extent per loop step (multi-pass row kernels)."""
    row_block_i: int = 32
    """Inner (non-reduced, trailing) elements per program when the reduced dims are not innermost."""
    row_one_pass: bool = True
    """Keep the whole row in registers (one read) when it fits in ``ONE_PASS_MAX_TILE``."""
    row_stages: int = 1
    """Software-pipelining stages of the row loops."""
    mm_block_m: int = 64
    """Tile rows of a matrix-product program."""
    mm_block_n: int = 64
    """Tile columns of a matrix-product program."""
    mm_block_k: int = 32
    """Reduction chunk of a matrix-product program."""
    mm_group_m: int = 8
    """Row tiles per group in the swizzled launch order (L2 reuse)."""
    mm_warps: int = 4
    """Warps per matrix-product program."""
    mm_stages: int = 3
    """Software-pipelining stages of the K loop."""
    mm_precision: str = "ieee"
    """``tl.dot`` input precision for fp32: ``ieee`` or ``tf32x3`` (three TF32 passes)."""
    mm_split_k: int = 1
    """Slices of K, each a program's partial tile written to an fp32 work buffer, then summed as a
    tree in a fixed order by a second kernel that applies the epilogue (fills the machine when
    M x N is small, and shortens every sequential fp32 sum). Clamped where K or the buffer is small."""
    mm_persistent: bool = False
    """One program per SM looping over the tiles in the grouped order (else one program per tile)."""
    mm_tma: bool = False
    """Load A and B tiles through tensor descriptors (TMA) where Triton has them, the device is
    compute capability 9 or newer and the strides are 16-byte aligned; else plain loads."""
    mm_pad: bool = False
    """Copy A and B of a single product whose rows are not 16-byte aligned (K or N not a multiple
    of 4 fp32 elements) into zero-padded buffers (K to a multiple of ``mm_block_k``, N to one of
    ``mm_block_n``) before the product: aligned rows load in vectors and the K loop needs no
    mask. Costs one copy of each operand per call."""
    conv_block_m: int = 64
    """Output positions (batch x spatial) per convolution program."""
    conv_block_n: int = 32
    """Output channels (within a group) per convolution program (16 at least with ``tl.dot``)."""
    conv_block_k: int = 32
    """Chunk of the reduction (input channels x kernel taps) per loop step of a convolution."""
    conv_warps: int = 4
    """Warps per convolution program."""
    conv_stages: int = 2
    """Software-pipelining stages of the convolution's reduction loop."""
    conv_precision: str = "ieee"
    """How a convolution's products are summed: ``tl.dot`` in ``ieee`` fp32, ``tf32x3`` (three
    TF32 tensor-core passes) or ``tf32`` (one, as cuDNN under PyTorch's defaults), or ``fma``:
    outer products of a vector of inputs and a vector of weights, one input channel and tap at a
    time, in fp32 (a dot needs 16 output channels at least; a depthwise convolution has one per
    group, so 15 of 16 columns of every dot were masked out)."""
    conv_taps_outer: bool = False
    """The order of a convolution's ``tl.dot`` reduction: kernel taps outside and chunks of
    ``conv_block_k`` input channels inside, with each tap's input positions and padding masks
    worked out once per output row, the weights repacked per call as ``[groups, taps, cin, cout]``
    (else one flat index over input channels x taps, its arithmetic per tile element). ``fma``
    and convolutions of one input channel per group always walk taps outside."""
    conv_a_transposed: bool = False
    """Taps outside, load each input tile as ``[channels, rows]`` (consecutive output positions
    on consecutive threads) and transpose it for the dot, else as ``[rows, channels]``."""
    conv_layout: str = "nchw"
    """Where a convolution walked taps outside with ``tl.dot`` reads its input: ``nchw``, the
    model's own layout (a tile's input channels a plane apart), or ``nhwc``: the candidate first
    copies the input channels-last (one pass, counted in its time), so that a tile's input
    channels are contiguous (vector loads, the operand K-major as the tensor cores take it), and
    packs the weights with input channels contiguous too."""
    conv_preround: bool = False
    """In ``tf32``, round the operands to TF32 once, before the reduction (the weights where they
    are packed, the input in a copy pass, fused with the ``nhwc`` copy where there is one), instead
    of every tile in the loop: the loop's loads then go to the tensor cores untouched."""
    attn_block_m: int = 64
    """Query rows per attention program."""
    attn_block_n: int = 32
    """Keys per step of the attention's online softmax."""
    attn_block_k: int = 32
    """Chunk of the head dim per step of the scores' product."""
    attn_block_d: int = 64
    """Output (value) columns per attention program."""
    attn_warps: int = 4
    """Warps per attention program."""
    attn_stages: int = 1
    """Software-pipelining stages of the attention's key loop."""
    attn_precision: str = "ieee"
    """``tl.dot`` input precision of attention: ``ieee`` or ``tf32x3``."""
    fuse_epilogue: bool = True
    """Fuse elementwise ops after a matrix product into its kernel (else a separate kernel)."""
    fuse_prologue: bool = True
    """Fuse elementwise ops before a reduction into the row kernel (else a separate kernel)."""
    share_sizes: bool = False
    """Kernels that are the same code but for integer constants (sizes, strides, bounds: a model's
    layers of other widths) share one Triton function, the constants passed by each launch
    (``const_args.py``): fewer functions to compile before the first verdict, at some cost in
    speed where the compiler no longer knows a divisor or a bound. Else such kernels are functions
    of their own (kernels that are the same code share one either way)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = SPACE[f.name]
            if type(value) is not type(allowed[0]) or value not in allowed:
                raise InvalidParams(f.name, value, f"one of {list(allowed)}")
        smem = (self.mm_block_m + self.mm_block_n) * self.mm_block_k * 4 * max(1, self.mm_stages - 1)
        if smem > _SMEM_BUDGET:
            raise InvalidParams("mm_block_k", self.mm_block_k, f"tiles need {smem} B of shared memory")
        acc = self.mm_block_m * self.mm_block_n // (32 * self.mm_warps)
        if acc > _ACC_PER_THREAD or acc < 1:
            raise InvalidParams("mm_warps", self.mm_warps, f"{acc} accumulators per thread is outside 1..256")
        acc = self.conv_block_m * self.conv_block_n // (32 * self.conv_warps)
        if self.conv_precision != "fma" and self.conv_block_n < 16:
            raise InvalidParams("conv_block_n", self.conv_block_n, "tl.dot needs 16 columns at least (fma does not)")
        if acc > _ACC_PER_THREAD or acc < 1:
            raise InvalidParams("conv_warps", self.conv_warps, f"{acc} values per thread is outside 1..256")
        acc = self.attn_block_m * max(self.attn_block_d, self.attn_block_n) // (32 * self.attn_warps)
        if acc > _ACC_PER_THREAD or acc < 1:
            raise InvalidParams("attn_warps", self.attn_warps, f"{acc} accumulators per thread is outside 1..256")
        if self.pw_block > 16384:
            raise InvalidParams("pw_ept", self.pw_ept, "32 * pw_warps * pw_ept must be at most 16384")

    @property
    def pw_block(self) -> int:
        """Elements per elementwise program."""
        return 32 * self.pw_warps * self.pw_ept

    def as_dict(self) -> dict[str, int | float | str | bool]:
        """The parameters as a flat dict (``Proposal.params``). Every value is a scalar, so no
        deep copy (``dataclasses.asdict``) is needed: that copy was a sixth of the expert's CPU."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def with_changes(self, **changes: Any) -> TemplateParams:
        """A copy with some parameters changed (validated)."""
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TemplateParams:
        """Parameters from a dict; missing keys take defaults, unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidParams(unknown[0], values[unknown[0]], f"unknown parameter (known: {sorted(known)})")
        return cls(**values)


_FIELD_NAMES = tuple(f.name for f in fields(TemplateParams))


def header(template: str, params: TemplateParams) -> str:
    """The first line of every rendered source."""
    payload = json.dumps({"template": template, "params": params.as_dict()}, sort_keys=True, separators=(",", ":"))
    return HEADER_PREFIX + payload


def params_from_source(source: str) -> tuple[str, TemplateParams] | None:
    """Read the header of a rendered source back: (template name, parameters), or ``None``."""
    match = _HEADER.search(source)
    if match is None:
        return None
    try:
        data = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("template"), str):
        return None
    raw = data.get("params")
    if not isinstance(raw, dict):
        return None
    try:
        return data["template"], TemplateParams.from_dict(raw)
    except (InvalidParams, TypeError):
        return None
