"""``analyse`` a reference into a plan, and ``render`` a plan with parameters into ``ModelNew``.

The rendered file is standalone KernelBench format: the header line with the template and its
parameters, imports, the ``@triton.jit`` kernels, and ``class ModelNew`` whose ``__init__`` is
the reference's own (same submodules and parameters, built in the same order, so a seeded
construction gives identical weights) and whose ``forward`` only checks shapes, allocates
outputs with ``torch.empty`` and launches the kernels.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

from actors.experts.template.emit import Launch, write_kernel
from actors.experts.template.errors import TraceFailed, UnsupportedGraph
from actors.experts.template.exprs import helpers_source
from actors.experts.template.fuse import Schedule, base_of, schedule
from actors.experts.template.ir import NodeKind, Plan, Unsupported
from actors.experts.template.lower import Lowerer
from actors.experts.template.params import TemplateParams, header
from actors.experts.template.trace import init_source, trace_reference

_FUSIONS = ((True, True), (False, True), (True, False), (False, False))


def analyse(reference_source: str) -> Plan | Unsupported:
    """Trace a KernelBench-format reference and map it onto the templates.

    Executes the reference's module code, ``get_init_inputs``, ``Model(...)`` and ``forward``
    on meta tensors: call it off the event loop. Returns :class:`Unsupported` (a decline) for
    anything the templates do not cover, including references that fail to load.
    """
    try:
        traced = trace_reference(reference_source)
        init_text, prelude = init_source(reference_source)
        lowerer = Lowerer(traced)
        output = lowerer.lower()
        plan = Plan(
            nodes=tuple(lowerer.nodes),
            output=output,
            arg_names=traced.arg_names,
            init_source=init_text,
            prelude_source=prelude,
            ops=tuple(lowerer.ops),
        )
        seen: set[tuple[tuple[str, int], ...]] = set()
        fusions: list[tuple[bool, bool]] = []
        template = ""
        for epilogue, prologue in _FUSIONS:
            params = TemplateParams(fuse_epilogue=epilogue, fuse_prologue=prologue)
            try:
                sched = schedule(plan, params)
                _render(plan, params, sched)
            except UnsupportedGraph:
                if (epilogue, prologue) == (True, True):
                    raise
                continue
            shape = tuple((k.kind.value, len(k.nodes)) for k in sched.kernels)
            if not template:
                template = "+".join(k.kind.value for k in sched.kernels)
            if shape not in seen:
                seen.add(shape)
                fusions.append((epilogue, prologue))
        return replace(plan, template=template, fusions=tuple(fusions))
    except UnsupportedGraph as exc:
        return Unsupported(detail=exc.detail, op=exc.op)
    except TraceFailed as exc:
        return Unsupported(detail=f"the reference could not be traced: {exc}")


def render(plan: Plan, params: TemplateParams) -> str:
    """The complete ``ModelNew`` source for ``plan`` under ``params``."""
    fusion = (params.fuse_epilogue, params.fuse_prologue)
    if fusion not in plan.fusions:
        params = params.with_changes(fuse_epilogue=True, fuse_prologue=True)
    return _render(plan, params, schedule(plan, params))


def _render(plan: Plan, params: TemplateParams, sched: Schedule) -> str:
    used: set[str] = set()
    launches = [write_kernel(sched, kernel, params, used) for kernel in sched.kernels]
    parts = [
        header(plan.template, params),
        f'"""ModelNew from Kernel Foundry\'s template expert ({plan.template}: '
        f"{len(launches)} Triton kernel{'s' if len(launches) != 1 else ''}).",
        "",
        "Specialised to the reference's input shapes; forward checks them. Ops: "
        + ", ".join(dict.fromkeys(plan.ops))
        + '."""',
        "",
        "import torch",
        "import torch.nn as nn",
        "import triton",
        "import triton.language as tl",
    ]
    standard = set(parts)
    parts.extend(line for line in plan.prelude_source.splitlines() if line not in standard)
    parts.append(helpers_source(used))
    for launch in launches:
        parts.extend(["", launch.source, ""])
    parts.append(_model(plan, sched, launches))
    return "\n".join(parts) + "\n"


def _attr_path(path: str) -> str:
    expr = "self"
    for part in path.split("."):
        expr += f".{part}" if part.isidentifier() else f"[{int(part)}]" if part.isdigit() else f"[{part!r}]"
    return expr


def _model(plan: Plan, sched: Schedule, launches: list[Launch]) -> str:
    inputs = plan.inputs
    names = plan.arg_names
    lines = ["class ModelNew(nn.Module):", textwrap.indent(plan.init_source, "    "), ""]
    lines.append(f"    def forward(self, {', '.join(names)}):")
    body: list[str] = []
    for node in inputs:
        name = names[node.index]
        body.append(
            f"if tuple({name}.shape) != {tuple(node.shape)!r} or {name}.dtype != torch.{node.dtype}:\n"
            f'    raise ValueError("this ModelNew was generated for {name} of shape {tuple(node.shape)} {node.dtype}")'
        )
    used_bases = {b for launch in launches for b in launch.pointers}
    device = None
    for node in inputs:
        if node.id in used_bases:
            body.append(f"_b{node.id} = {names[node.index]}.contiguous()")
            device = device or f"_b{node.id}.device"
    for node in plan.nodes:
        if node.kind is NodeKind.PARAM and node.id in used_bases:
            body.append(f"_b{node.id} = {_attr_path(node.path)}.contiguous()")
            device = device or f"_b{node.id}.device"
    if device is None:
        raise UnsupportedGraph("forward reads no tensor")
    for kernel, launch in zip(sched.kernels, launches, strict=True):
        for nid in kernel.exports:
            node = plan.nodes[nid]
            body.append(f"_b{nid} = torch.empty({tuple(node.shape)!r}, device={device}, dtype=torch.{node.dtype})")
        args = [f"_b{b}" for b in launch.pointers]
        args += [f"{k}={v}" for k, v in launch.constexprs.items()]
        args += [f"num_warps={launch.num_warps}", f"num_stages={launch.num_stages}"]
        body.append(f"{launch.name}[{tuple(launch.grid)!r}]({', '.join(args)})")
    out, _ = base_of(plan, plan.output, sched.is_exported)
    if out == plan.output:
        body.append(f"return _b{out}")
    else:
        body.append(f"return _b{out}.view({tuple(plan.nodes[plan.output].shape)!r})")
    lines.append(textwrap.indent("\n".join(body), "        "))
    return "\n".join(lines)
