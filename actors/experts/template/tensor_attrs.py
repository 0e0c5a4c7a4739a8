"""Plain tensor attributes of the reference's module: tensors ``__init__`` assigns to ``self``
(``self.hidden = torch.randn(...)``) that are neither parameters nor buffers.

``ModelNew`` is built by the reference's own ``__init__`` (``carry.py``) under the same seed, so
it holds the same attribute with the same values, drawn at construction as the parameters are; a
read of one before ``forward`` writes it is a ``PARAM`` node with ``op`` :data:`~.ir.TENSOR_ATTR`,
which the rendered ``forward`` reads from its own attribute, moved to the kernels' device
(``.to(device)`` moves parameters and buffers, not plain attributes). A 0-dim attribute with a
value (built on the CPU) is that number, as any scalar constant.

What ``forward`` writes into an attribute is tracked by the attribute, not by the FX node: every
read of ``self.hidden`` is its own ``get_attr`` node. ``self.hidden.copy_(src)`` overwrites it
whole, so later reads see ``src`` (of the attribute's shape and dtype: ``families/overwrite.py``);
an in-place op on an attribute this call already wrote computes on what it wrote. Rebinding
(``self.hidden = <value>``) needs nothing here: later reads in the same trace are of the value.

Not reproduced: the state ``forward`` leaves on the module (the reference's ``self.hidden``
after a call); ``ModelNew.forward`` changes none of its attributes. So where an output could
depend on that state, the reference is declined: an attribute ``forward`` writes or rebinds and
reads (other than as the target of a whole overwrite) before it does, and an in-place op that
updates an attribute from the value an earlier call left.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import fx

from actors.experts.template.errors import UnsupportedGraph
from actors.experts.template.ir import HALF, TENSOR_ATTR, NodeKind, NodeRef
from actors.experts.template.lowering import LowerContext
from actors.experts.template.trace import Traced

_FX_CONSTANT = re.compile(r"_tensor_constant\d+$")
"""The attributes ``torch.fx`` adds for tensors it meets while tracing (not the reference's own)."""

OVERWRITES = frozenset({"copy_"})
"""Tensor methods that write every element of their tensor without reading it."""


def plain_tensor_attrs(root: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Path -> tensor of every plain tensor attribute of ``root`` and its submodules."""
    found: dict[str, torch.Tensor] = {}
    for name, module in root.named_modules():
        for key, value in vars(module).items():
            plain = isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
            if plain and not _FX_CONSTANT.match(key):
                found[f"{name}.{key}" if name else key] = value
    return found


def overwrites(fxn: fx.Node) -> bool:
    """Whether ``fxn`` writes the whole of its first argument without reading it (``x.copy_(y)``)."""
    return fxn.op == "call_method" and fxn.target in OVERWRITES


class TensorAttrs:
    """The plain tensor attributes one lowering reads and writes, and the check that no output
    depends on state from an earlier call."""

    def __init__(self, traced: Traced) -> None:
        self.traced = traced
        self.tensors = plain_tensor_attrs(traced.root)
        self._by_id = {id(t): path for path, t in self.tensors.items()}
        self.values: dict[str, Any] = {}
        """Path -> what ``forward`` last wrote into the attribute (as lowered)."""
        self.first_reads: dict[str, list[fx.Node]] = {}
        """Path -> the ``get_attr`` nodes that read the attribute before ``forward`` wrote it."""
        self._nodes: dict[str, NodeRef] = {}

    def path_of(self, fxn: object) -> str | None:
        """The attribute a ``get_attr`` node reads (by name, or by identity where the tracer
        stored it as a constant), or None for anything else."""
        if not isinstance(fxn, fx.Node) or fxn.op != "get_attr":
            return None
        target = str(fxn.target)
        if target in self.tensors:
            return target
        try:
            value = getattr(self.traced.graph_module, target)
        except AttributeError:
            return None
        return self._by_id.get(id(value)) if isinstance(value, torch.Tensor) else None

    def read(self, lw: LowerContext, fxn: fx.Node, path: str) -> Any:
        """What ``fxn``, a read of the attribute at ``path``, gives: what ``forward`` last wrote into
        it, else the attribute as ``ModelNew`` holds it."""
        if path in self.values:
            return self.values[path]
        self.first_reads.setdefault(path, []).append(fxn)
        tensor = self.tensors[path]
        if tensor.dim() == 0 and not tensor.is_meta and tensor.dtype in (torch.float32, torch.float64):
            return float(tensor.item())
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in ("float32", *HALF):
            raise UnsupportedGraph(
                f"forward reads the tensor attribute {path!r} of {tensor.dtype}; only float32, float16 and "
                "bfloat16 attributes are covered"
            )
        if path not in self._nodes:
            self._nodes[path] = lw.add(NodeKind.PARAM, tuple(tensor.shape), path=path, dtype=dtype, op=TENSOR_ATTR)
        return self._nodes[path]

    def check_write(self, fxn: fx.Node, path: str) -> None:
        """``fxn`` writes the attribute at ``path`` in place: covered where it overwrites it whole
        or where this call wrote it already; else it updates the state an earlier call left."""
        if overwrites(fxn) or path in self.values:
            return
        raise UnsupportedGraph(
            f"{fxn.target} updates the tensor attribute {path!r} in place from the value an earlier call "
            "left: its result depends on the module's state, which ModelNew does not keep"
        )

    def wrote(self, target: fx.Node, value: Any) -> None:
        """Record that an in-place op wrote ``value`` into ``target`` (if it reads an attribute)."""
        path = self.path_of(target)
        if path is not None:
            self.values[path] = value

    def check_state(self) -> None:
        """Decline where ``forward`` writes or rebinds an attribute it read before: the output of a
        call would depend on what the call before left there."""
        for path in sorted({*self.values, *self.traced.rebound}):
            for fxn in self.first_reads.get(path, ()):
                if any(not (overwrites(user) and user.args[0] is fxn) for user in fxn.users):
                    raise UnsupportedGraph(
                        f"forward reads the tensor attribute {path!r} before it "
                        + ("writes" if path in self.values else "rebinds")
                        + " it: an output would depend on the state an earlier call left, which ModelNew "
                        "does not keep"
                    )
