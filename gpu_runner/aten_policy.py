"""Which aten ops a candidate's forward may dispatch outside its own kernels (worker side, no pydantic)."""

from __future__ import annotations

ALLOWED_ATEN_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
        "zero_", "fill_", "full", "full_like", "ones", "ones_like", "new_zeros", "new_ones", "new_full",
        "view", "_unsafe_view", "reshape", "as_strided", "permute", "transpose", "t", "expand", "clone",
        "copy_", "detach", "alias", "slice", "select", "unsqueeze", "squeeze", "flatten", "narrow", "split",
        "unbind", "chunk", "set_", "lift_fresh", "lift_fresh_copy", "resize_", "contiguous",
        "_local_scalar_dense", "is_contiguous", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
        "scalar_tensor", "_reshape_alias", "view_as", "expand_as", "unflatten", "movedim", "split_with_sizes",
        "record_stream", "is_pinned", "_has_compatible_shallow_copy_type", "_to_copy",
    }
)  # fmt: skip
"""Aten ops (overload stripped) a candidate's forward may dispatch outside its own kernels.

``_to_copy`` passes only when it keeps the dtype (a device move); a dtype change is a compute op.
"""
