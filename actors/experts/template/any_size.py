"""Elementwise models at any input shape (issue 38 item 1, its first family).

The template's kernels are written for the reference's input shapes: every size is a constant,
which is what makes them fast there. For a model that is elementwise from end to end (every op of
its plan an elementwise op of same-shape tensors: activations and their chains), ``render`` also
writes each kernel once more with the element count as a run-time argument (``n``, 64-bit
offsets, the same block and warps), and ``forward`` keeps its specialised path for the reference's
shapes and calls the run-time-sized kernels for any other shape: the same elements in the same
order, so the same results at every shape. Inputs of different shapes (broadcasting), another
dtype, or a model that is not elementwise throughout are refused as before, naming what differs.
"""

from __future__ import annotations

import textwrap

from actors.experts.template.emit import Launch, PointwiseWriter, Scope
from actors.experts.template.fuse import KernelKind, Schedule, base_of
from actors.experts.template.ir import FLOAT_ARG, GATHER_OPS, NodeKind, Plan
from actors.experts.template.params import TemplateParams

METHOD = "_kf_any_size"
"""The ``ModelNew`` method that runs the run-time-sized kernels."""
SUFFIX = "_any"


class AnySizePointwiseWriter(PointwiseWriter):
    """The elementwise template with the element count as a run-time argument ``n``."""

    def write(self) -> Launch:
        self.wide = True  # any size: offsets in 64 bits
        top = Scope(indent="    ")
        body_start = len(self.lines)
        self.emit(top, f"offs = {self.pid()} * BLOCK + tl.arange(0, BLOCK)")
        self.emit(top, "mask = offs < n")
        for nid in self.kernel.exports:
            self.store(top, nid, row=False)
        body = self.lines[body_start:]
        ptrs = [f"p{b}" for b in self.pointers]
        name = self.kernel.name + SUFFIX
        src = ["@triton.jit", f"def {name}({', '.join([*ptrs, 'n', 'BLOCK: tl.constexpr'])}):", *body]
        return Launch(
            source="\n".join(src),
            name=name,
            pointers=self.pointers,
            grid=(),
            constexprs={"BLOCK": self.params.pw_block},
            num_warps=self.params.pw_warps,
            num_stages=1,
        )


def eligible(plan: Plan, sched: Schedule, launches: list[Launch | None]) -> bool:
    """Whether the model is elementwise throughout on same-shape tensor inputs, one output."""
    inputs = plan.inputs
    if not inputs or any(node.path == FLOAT_ARG for node in inputs):
        return False
    shape = tuple(inputs[0].shape)
    if plan.extra_outputs or plan.returns is not None or not shape or any(plan.output_strides):
        return False
    for node in plan.nodes:
        if node.kind not in (NodeKind.INPUT, NodeKind.EW) or tuple(node.shape) != shape or node.op in GATHER_OPS:
            return False
    if any(kernel.kind is not KernelKind.PW for kernel in sched.kernels):
        return False
    return all(
        launch is not None
        and not (launch.pre or launch.setup or launch.work or launch.lead_args or launch.tail_args or launch.grid_exprs)
        and set(launch.constexprs) == {"BLOCK"}
        for launch in launches
    )


def kernels(plan: Plan, sched: Schedule, params: TemplateParams, used: set[str]) -> list[Launch]:
    """The run-time-sized kernels, in the schedule's order."""
    return [AnySizePointwiseWriter(sched, kernel, params, used).write() for kernel in sched.kernels]


def method(plan: Plan, sched: Schedule, launches: list[Launch]) -> str:
    """``ModelNew._kf_any_size``: the inputs' checks, buffers and launches at any shape."""
    names = plan.arg_names
    inputs = plan.inputs
    first = names[inputs[0].index]
    lines = [f"def {METHOD}(self, {', '.join(names)}):"]
    body = [f"shape = tuple({first}.shape)"]
    for node in inputs:
        name = names[node.index]
        body.append(
            f"if not isinstance({name}, torch.Tensor) or {name}.dtype != torch.{node.dtype} "
            f"or tuple({name}.shape) != shape:\n"
            f'    raise _kf_refuse("{name}", {name}, shape, "{node.dtype}", any_shape=True)'
        )
    made: set[int] = set()
    for node in inputs:
        body.append(f"_b{node.id} = {names[node.index]}.contiguous()")
        made.add(node.id)
    body.append(f"_kfdev = _b{inputs[0].id}.device")
    body.append(f"n = _b{inputs[0].id}.numel()")
    for launch in launches:
        for base in launch.pointers:
            if base not in made:
                body.append(f"_b{base} = torch.empty(shape, device=_kfdev, dtype=torch.{plan.nodes[base].dtype})")
                made.add(base)
    calls = []
    for launch in launches:
        block = int(launch.constexprs["BLOCK"])
        args = ", ".join([*(f"_b{b}" for b in launch.pointers), "n", f"BLOCK={block}"])
        calls.append(f"{launch.name}[(triton.cdiv(n, {block}),)]({args}, num_warps={launch.num_warps}, num_stages=1)")
    body.append("if n:\n" + textwrap.indent("\n".join(calls), "    "))
    out, _ = base_of(plan, plan.output, sched.is_exported)
    body.append(f"return _b{out}")
    lines.append(textwrap.indent("\n".join(body), "    "))
    return textwrap.indent("\n".join(lines), "    ")
