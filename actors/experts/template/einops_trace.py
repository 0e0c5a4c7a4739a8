"""``einops`` calls on traced tensors, recorded as the ordinary tensor ops they stand for.

einops picks a backend by the type of the tensor it is given: it walks the subclasses of its
``AbstractBackend`` whose ``framework_name`` is an imported module and keeps the first whose
``is_appropriate_type`` accepts the tensor. :class:`ProxyBackend` accepts ``torch.fx`` proxies,
so while ``forward`` is traced (``trace.py``) ``rearrange(x, "b (c l) h -> b c l h", l=4)``
records ``x.reshape(...)`` and ``x.permute(...)`` (data movement); ``repeat`` records
``unsqueeze`` and ``expand``; ``reduce`` the tensor's own reduction (``sum``, ``amax``, ...;
``prod``, ``any`` and ``all`` one dim at a time); ``einops.einsum`` a ``torch.einsum``. What these
become is then the lowerer's business, as if the reference had written them. Real tensors are
left to einops' own torch backend. The sizes come from the proxy's meta value (the shape-aware
tracer's); a proxy of the plain tracer has none, so einops on it fails the trace with that reason.

Importing this module registers the backend (einops finds it by subclass); ``trace.py`` imports
it when einops is installed.
"""

from __future__ import annotations

from typing import Any

import torch
from einops._backends import AbstractBackend
from torch import fx

_REDUCTIONS = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}
"""einops reductions -> the tensor method that takes several dims at once."""


def meta_of(x: object) -> torch.Tensor | None:
    """The meta tensor a shape-aware tracer's proxy carries (``None`` for any other value)."""
    meta = getattr(x, "_tensor_meta", None) if isinstance(x, fx.Proxy) else None
    return meta if isinstance(meta, torch.Tensor) else None


class ProxyBackend(AbstractBackend):
    """einops on ``torch.fx`` proxies with meta values: each step one recorded tensor op."""

    framework_name = "torch.fx"  # found once ``torch.fx`` is imported (always, with torch)

    def is_appropriate_type(self, tensor: object) -> bool:
        return isinstance(tensor, fx.Proxy)

    def shape(self, x: fx.Proxy) -> tuple[int, ...]:
        meta = meta_of(x)
        if meta is None:
            raise NotImplementedError("einops on a traced tensor of unknown shape (the plain fx tracer's)")
        return tuple(int(n) for n in meta.shape)

    def reshape(self, x: fx.Proxy, shape: tuple[int, ...]) -> Any:
        return x.reshape(*shape)

    def transpose(self, x: fx.Proxy, axes: tuple[int, ...]) -> Any:
        return x.permute(*axes)

    def reduce(self, x: fx.Proxy, operation: str, axes: tuple[int, ...]) -> Any:
        method = _REDUCTIONS.get(operation)
        if method is not None:
            return getattr(x, method)(dim=axes)
        result: Any = x
        for axis in sorted(axes, reverse=True):  # ``prod``, ``any``, ``all``: one dim at a time
            result = getattr(result, operation)(dim=axis)
        return result

    def add_axis(self, x: fx.Proxy, new_position: int) -> Any:
        return x.unsqueeze(new_position)

    def add_axes(self, x: fx.Proxy, n_axes: int, pos2len: dict[int, int]) -> Any:
        sizes = [-1] * n_axes
        for position, length in pos2len.items():
            x = self.add_axis(x, position)
            sizes[position] = length
        return x.expand(*sizes)

    def stack_on_zeroth_dimension(self, tensors: list[Any]) -> Any:
        return torch.stack(tensors)  # recorded: a proxy's ``__torch_function__``

    def concat(self, tensors: list[Any], axis: int) -> Any:
        return torch.cat(tensors, dim=axis)

    def is_float_type(self, x: fx.Proxy) -> bool:
        meta = meta_of(x)
        return meta is not None and meta.is_floating_point()

    def einsum(self, pattern: str, *x: fx.Proxy) -> Any:
        return torch.einsum(pattern, *x)
