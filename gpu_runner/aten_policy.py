"""Which aten ops a candidate's forward may dispatch outside its own kernels (worker side, no pydantic).

Under the ``forbid`` policy only :data:`ALLOWED_ATEN_OPS` (allocation, views, copies) pass. Under
``reference`` the compute ops the reference's own forward dispatches pass too: they are found by
running the reference once on the ``meta`` device (shapes only, no memory, no kernels), see
:func:`reference_aten_ops`.
"""

from __future__ import annotations

import functools
from typing import Any

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


class ReferenceTraceError(Exception):
    """The reference's forward could not be run on the meta device (its aten ops stay unknown)."""


def _meta(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, list | tuple):
        return type(value)(_meta(v) for v in value)
    return value


@functools.lru_cache(maxsize=32)
def reference_aten_ops(reference_source: str) -> frozenset[str]:
    """Compute aten ops (overload stripped, :data:`ALLOWED_ATEN_OPS` left out) that the reference's
    forward dispatches, found by one forward on the ``meta`` device.

    Raises :class:`ReferenceTraceError` when the reference cannot run there (a data-dependent op,
    an op without a meta kernel): the caller then admits nothing at run time (fail closed).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Record(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if getattr(func, "namespace", "aten") == "aten":
                self.ops.add(func.__name__.split(".", 1)[0])
            return func(*args, **(kwargs or {}))

    namespace: dict[str, Any] = {"__name__": "kf_reference_ops"}
    try:
        exec(compile(reference_source, "<reference>", "exec"), namespace)  # the user's own reference
        with torch.device("meta"):
            model = namespace["Model"](*namespace["get_init_inputs"]())
            inputs = _meta(list(namespace["get_inputs"]()))
        model = model.to("meta")
        recorder = _Record()
        with torch.no_grad(), recorder:
            model(*inputs)
    except Exception as exc:
        raise ReferenceTraceError(f"{type(exc).__name__}: {exc}"[:300]) from exc
    return frozenset(recorder.ops) - ALLOWED_ATEN_OPS
