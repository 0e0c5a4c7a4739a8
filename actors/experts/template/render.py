"""``analyse`` a reference into a plan, and ``render`` a plan with parameters into ``ModelNew``.

The rendered file is standalone KernelBench format: the header line with the template and its
parameters, imports, the ``@triton.jit`` kernels, and ``class ModelNew`` whose ``__init__`` is
the reference's own (same submodules and parameters, built in the same order, so a seeded
construction gives identical weights) and whose ``forward`` only checks shapes, allocates
outputs with ``torch.empty`` and launches the kernels. It changes no attribute: what a
reference's ``forward`` leaves on its plain tensor attributes is not reproduced (``tensor_attrs.py``).
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from actors.experts.template import any_batch, any_size, any_sizes, buckets, share, size_fits
from actors.experts.template.arena import Arena, place, positional
from actors.experts.template.carry import init_source
from actors.experts.template.emit import INTERPRETED, Launch
from actors.experts.template.errors import InvalidParams, TraceFailed, UnsupportedGraph
from actors.experts.template.exprs import attr_path, helpers_source
from actors.experts.template.fuse import Kernel, KernelKind, Schedule, base_of, schedule
from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import FLOAT_ARG, TENSOR_ATTR, KeepTorch, NodeKind, Plan, Unsupported
from actors.experts.template.kernel_kinds import template_of
from actors.experts.template.launcher import LAUNCHER_SOURCE
from actors.experts.template.lower import Lowerer
from actors.experts.template.params import TemplateParams, header
from actors.experts.template.trace import Traced, load_namespace, trace_reference
from gpu_runner.sandboxed.held_out import free_sizes

_FUSIONS = ((True, True), (False, True), (True, False), (False, False))


def write_kernel(sched: Schedule, kernel: Kernel, params: TemplateParams, used: set[str]) -> Launch:
    """Emit one kernel of the schedule with the writer its kind registered (``kernel_kinds``)."""
    template = template_of(kernel.kind)
    if template is None:
        raise UnsupportedGraph(f"no kernel template is registered for {kernel.kind.value!r} kernels")
    return template.writer(sched, kernel, params, used).write()


def analyse(reference_source: str, keep_torch: KeepTorch = KeepTorch.NONE) -> Plan | Unsupported:
    """Trace a KernelBench-format reference and map it onto the templates.

    Executes the reference's module code, ``get_init_inputs``, ``Model(...)`` and ``forward``
    on meta tensors: call it off the event loop. Returns :class:`Unsupported` (a decline) for
    anything the templates do not cover, including references that fail to load. With
    ``keep_torch`` an op the templates do not cover stays the reference's own PyTorch call between
    the kernels (``LAYOUT``: data movement only, any policy; ``ALL``: run policy ``--torch-ops
    reference``), as long as some kernel is left.
    """
    try:
        # the lowering's own work (this thread's CPU time): on a GPU host busy starting the
        # evaluator, the wall time of the first analysis passed the any-batch probe's limit and
        # KernelBench L2-9's kernels got no any-batch copies (an H200, 2026-12-04)
        started = time.thread_time()
        plan = lowered(reference_source, keep_torch)
        lowering_s = time.thread_time() - started
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
            if all(k.kind is KernelKind.TORCH for k in sched.kernels):
                raise UnsupportedGraph("every op would stay in PyTorch: nothing is left for a kernel")
            shape = tuple((k.kind.value, len(k.nodes)) for k in sched.kernels)
            if not template:
                template = "+".join(k.kind.value for k in sched.kernels)
            if shape not in seen:
                seen.add(shape)
                fusions.append((epilogue, prologue))
        free = _free_sizes(reference_source)  # the file loaded once for both
        found = _batch_links(reference_source, plan, keep_torch, free, lowering_s)
        sizes = _size_links(reference_source, plan, keep_torch, free, lowering_s)
        return replace(
            plan,
            template=template,
            fusions=tuple(fusions),
            batch=found.dims,
            batch_name=found.name,
            batch_args=found.args,
            batch_least=found.least,
            sizes=sizes or None,
        )
    except UnsupportedGraph as exc:
        return Unsupported(detail=exc.detail, op=exc.op)
    except TraceFailed as exc:
        return Unsupported(detail=f"the reference could not be traced: {exc}")


def _free_sizes(reference_source: str) -> dict[str, int]:
    """The task's module-level sizes that ``get_inputs`` alone reads (the evaluator's held-out
    shapes move the same ones); none where the file does not load again."""
    try:
        namespace = load_namespace(reference_source)
        return {name: namespace[name] for name in free_sizes(namespace)}
    except Exception:  # noqa: BLE001 - user code: the plan stands without copies for other sizes
        return {}


def _batch_links(
    reference_source: str, plan: Plan, keep_torch: KeepTorch, free: dict[str, int], lowering_s: float = 0.0
) -> any_batch.Found:
    """``Plan.batch`` and what goes with it (``any_batch.find``): the reference lowered again at a
    second batch size."""
    try:
        return any_batch.find(
            free,
            plan,
            lambda changed: lowered(reference_source, keep_torch, changed),
            lowering_s=lowering_s,
            outputs_at=lambda changed: _output_shapes(reference_source, changed),
        )
    except Exception:  # noqa: BLE001 - user code: the plan stands without an any-batch path
        return any_batch.Found()


def _size_links(
    reference_source: str, plan: Plan, keep_torch: KeepTorch, free: dict[str, int], lowering_s: float = 0.0
) -> size_fits.Sizes:
    """``Plan.sizes`` (``any_sizes.find``): the reference lowered again with each free size moved.
    Where the plan's lowering chose by size (a reduction over few huge rows split in parts, as
    many as the rows leave room for: KernelBench L1-35 and L2-21's group norms), the fits are of
    the reference lowered without such choices, held in :attr:`Sizes.plan`."""
    try:
        found = any_sizes.find(
            free,
            plan,
            lambda changed: lowered(reference_source, keep_torch, changed),
            lambda changed: _output_shapes(reference_source, changed),
            lowering_s=lowering_s,
        )
        if found or not free or not plan.split or lowering_s > any_sizes.PROBE_LIMIT_S:
            return found
        started = time.thread_time()
        whole = lowered(reference_source, keep_torch, split=False)
        whole = replace(whole, batch=plan.batch, batch_name=plan.batch_name, batch_args=plan.batch_args)
        found = any_sizes.find(
            free,
            whole,
            lambda changed: lowered(reference_source, keep_torch, changed, split=False),
            lambda changed: _output_shapes(reference_source, changed),
            lowering_s=max(lowering_s, time.thread_time() - started),
        )
        return replace(found, plan=whole) if found else found
    except Exception:  # noqa: BLE001 - user code: the plan stands without an any-size path
        return size_fits.Sizes()


def _output_shapes(reference_source: str, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """The shapes of the reference's outputs, in order, from a forward on the meta device with
    ``sizes`` (module-level integers) set first."""
    namespace = load_namespace(reference_source)
    namespace.update(sizes)
    with torch.device("meta"), torch.no_grad():
        inputs = list(namespace["get_inputs"]())
        model = namespace["Model"](*namespace["get_init_inputs"]())
        out = model(*inputs)
    return [tuple(int(d) for d in t.shape) for t in _flat([out]) if isinstance(t, torch.Tensor)]


def lowered(
    reference_source: str,
    keep_torch: KeepTorch = KeepTorch.NONE,
    sizes: dict[str, int] | None = None,
    split: bool = True,
) -> Plan:
    """The reference traced (with ``sizes``: module-level integers set to other values first) and
    lowered into a plan, before any schedule is tried (``split``: see ``Lowerer.split``)."""
    traced = trace_reference(reference_source, sizes)
    init_text, prelude = init_source(reference_source)
    lowerer = Lowerer(traced, KeepTorch(keep_torch), split=split)
    outputs = lowerer.lower()
    return Plan(
        nodes=tuple(lowerer.nodes),
        output=outputs[0],
        extra_outputs=outputs[1:],
        arg_names=traced.arg_names,
        init_source=init_text,
        prelude_source=prelude,
        ops=tuple(lowerer.ops),
        output_strides=_reference_strides(traced),
        returns=lowerer.returns,
        split=lowerer.split_taken,
    )


def _reference_strides(traced: Traced) -> tuple[tuple[int, ...] | None, ...]:
    """Per tensor ``forward`` returns, its traced strides where they are not the contiguous ones."""
    output = next(n for n in traced.graph_module.graph.nodes if n.op == "output")
    values = _flat([traced.values.get(n) for n in _flat(output.args[0])])
    return tuple(tuple(v.stride()) if isinstance(v, torch.Tensor) and not v.is_contiguous() else None for v in values)


def _flat(value: Any) -> list[Any]:
    """Nested tuples and lists as one list, in order (an ``nn.LSTM``'s ``(output, (h, c))``)."""
    return [x for v in value for x in _flat(v)] if isinstance(value, tuple | list) else [value]


def render(
    plan: Plan,
    params: TemplateParams,
    direct: bool = True,
    arena: bool = True,
    hw: GpuModel | None = None,
    shared: bool = True,
) -> str:
    """The complete ``ModelNew`` source for ``plan`` under ``params``. ``direct``: launches
    after a site's first go straight to the kernel it compiled (``launcher.py``); off, every
    launch goes through ``triton.jit``. ``arena``: intermediates share one buffer per dtype
    (``arena.py``); off, each is a ``torch.empty`` of its own. ``hw``: the copies for other sizes
    get a configuration per size bucket from this model of the GPU (``buckets.py``); ``None``:
    they run with ``params`` at every size. ``shared``: kernels of the same code share one
    function (``share.py``; with ``params.share_sizes``, also kernels that differ only in integer
    constants, passed by their launches); off, each kernel is a function of its own."""
    fusion = (params.fuse_epilogue, params.fuse_prologue)
    if fusion not in plan.fusions:
        params = params.with_changes(fuse_epilogue=True, fuse_prologue=True)
    return _render(plan, params, schedule(plan, params), direct, arena, hw, shared)


_LAUNCHED = re.compile(r"^(\s*)(_kf_\w+)\[(.*), (num_warps=\d+, num_stages=\d+\))$")


def _passing(method: str, args: Mapping[str, Mapping[str, int | float]]) -> str:
    """The any-batch or any-size method with each launch of a shared kernel passing its arguments
    (``share.py``; the method's launch lines are written before the kernels are shared)."""
    lines = method.split("\n")
    for i, line in enumerate(lines):
        named = [name for name in re.findall(r"(_kf_\w+)\[", line) if args.get(name)]
        if not named:
            continue
        found = _LAUNCHED.match(line)
        if found is None or named != [found.group(2)]:
            raise ValueError(f"a launch of {named[0]} is not one line of the known form: {line.strip()[:200]}")
        passed = ", ".join(f"{k}={v}" for k, v in args[found.group(2)].items())
        lines[i] = f"{found.group(1)}{found.group(2)}[{found.group(3)}, {passed}, {found.group(4)}"
    return "\n".join(lines)


def _all_fp32(plan: Plan) -> bool:
    """Whether every floating-point value of the plan is fp32 (what a float passed to a kernel at
    run time is: ``const_args.numbers``)."""
    return all(n.dtype == "float32" or not n.dtype.startswith(("float", "bfloat", "complex")) for n in plan.nodes)


def _direct(launch: Launch) -> bool:
    """Whether a launch can keep its compiled kernel: a fixed grid and tensor arguments only
    (a grid or keyword computed in ``forward`` goes through ``triton.jit`` each time)."""
    return not launch.grid_exprs and not launch.tail_args


def _site(launch: Launch, arena: Arena) -> str:
    """The module-level launch site of a kernel (``_KfLaunch``)."""
    grid = ", ".join(str(g) for g in launch.grid)
    kw = [f"{k}={v}" for k, v in arena.args.get(launch.name, {}).items()]
    kw += [f"{k}={v}" for k, v in launch.constexprs.items()]
    kw += [f"num_warps={launch.num_warps}", f"num_stages={launch.num_stages}"]
    return f"_L{launch.name} = _KfLaunch({launch.name}, ({grid},), {', '.join(kw)})"


def _shared_copies(launches: list[Launch | None]) -> list[Launch | None]:
    """One copy of an input that several convolutions read the same way (channels-last, rounded
    to TF32): the later ones read the first one's copy instead of making their own. The branches of
    an inception module (KernelBench L3-6) each copied the same 1 GB input: three copies of
    0.68 ms each of a first candidate's 7.7 ms on an H100. The copy's buffer then lives until the
    last convolution that reads it (``arena.place`` follows the uses)."""
    first: dict[str, str] = {}
    out: list[Launch | None] = []
    for launch in launches:
        copy = (
            next((p for p in launch.pre if p.name.endswith("_in") and len(p.lead_args) == 1), None) if launch else None
        )
        if launch is None or copy is None:
            out.append(launch)
            continue
        key = copy.source.replace(copy.name, "") + repr(
            (copy.grid, sorted(copy.constexprs.items()), copy.num_warps, copy.pointers)
        )
        mine = copy.lead_args[0]
        theirs = first.setdefault(key, mine)
        if theirs == mine:
            out.append(launch)
            continue
        out.append(
            replace(
                launch,
                pre=tuple(p for p in launch.pre if p is not copy),
                lead_args=tuple(theirs if a == mine else a for a in launch.lead_args),
                work=tuple(w for w in launch.work if w[0] != mine),
            )
        )
    return out


def _render(
    plan: Plan,
    params: TemplateParams,
    sched: Schedule,
    direct: bool = True,
    arena: bool = True,
    hw: GpuModel | None = None,
    shared: bool = True,
) -> str:
    used: set[str] = set()
    launches = _shared_copies(
        [
            None if kernel.kind is KernelKind.TORCH else write_kernel(sched, kernel, params, used)
            for kernel in sched.kernels
        ]
    )
    kernels = [launch for launch in launches if launch is not None]
    generic = any_size.kernels(plan, sched, params, used) if any_size.eligible(plan, sched, launches) else []
    if sum(1 + len(launch.pre) for launch in kernels) > buckets.MAX_KERNELS:
        hw = None  # every bucket is another copy of every kernel to compile
    sized = _any_sizes(plan, params, used, hw) if plan.sizes and not generic else None
    batched = sized or (_any_batch(plan, params, used, hw) if plan.batch and not generic else None)
    parts = [
        header(plan.template, params),
        f'"""ModelNew from Kernel Foundry\'s template expert ({plan.template}: '
        f"{len(kernels)} Triton kernel{'s' if len(kernels) != 1 else ''}"
        + (f", {len(launches) - len(kernels)} op(s) left to PyTorch" if len(kernels) < len(launches) else "")
        + ").",
        "",
        (
            "Specialised to the reference's input shapes, with run-time-sized copies of its kernels for "
            "any other shape. Ops: "
            if generic
            else f"Specialised to the reference's input shapes, with copies of its kernels that take any "
            f"{_free(plan) if sized else plan.batch_name} (other shapes are refused, naming the dimension). Ops: "
            if batched
            else "Specialised to the reference's input shapes: forward refuses others, naming the dimension. Ops: "
        )
        + ", ".join(dict.fromkeys(plan.ops))
        + '."""',
        "",
        "import torch",
        "import torch.nn as nn",
        "import triton",
        "import triton.language as tl",
    ]
    standard = set(parts)
    parts.extend(dict.fromkeys(line for launch in kernels for line in launch.imports))
    parts.extend(line for line in plan.prelude_source.splitlines() if line not in standard)
    parts.append(helpers_source(used))
    stages = [stage for launch in kernels for stage in (*launch.pre, launch)]
    placed = _arena(plan, sched, launches) if arena else Arena()
    files = [
        *(
            share.Kernel(stage.name, stage.source, tuple(placed.shifts.get(stage.name, ())), sized=True)
            for stage in stages
        ),
        *(share.Kernel(launch.name, launch.source) for launch in generic),
        *(share.Kernel(share.def_name(source), source, sized=True) for source in (batched[0] if batched else ())),
    ]
    floats = _all_fp32(plan)
    texts = share.share(files, params.share_sizes, floats) if shared else share.alone(files)
    method = batched[1] if batched else ""
    try:
        method = _passing(method, texts.args)
    except ValueError:  # a launch the method writes otherwise: its copies keep their constants
        own = {stage.name for stage in stages}
        files = [f if f.name in own else replace(f, sized=False) for f in files]
        texts = share.share(files, params.share_sizes, floats)
    placed.args = texts.args
    parts.extend(text for kernel in files for text in ("", texts.texts[kernel.name], ""))
    wide = [stage for stage in stages if INTERPRETED in stage.constexprs.values()]
    if wide:  # a triton.jit function is a JITFunction unless the interpreter runs it
        parts.extend([f"{INTERPRETED} = int(not isinstance({wide[0].name}, triton.runtime.JITFunction))", ""])
    sites = [stage for stage in stages if direct and _direct(stage)]
    if sites:
        parts.append(LAUNCHER_SOURCE)
        parts.extend([*(_site(stage, placed) for stage in sites), "", ""])
    if any(node.path != FLOAT_ARG for node in plan.inputs):
        parts.append(REFUSE_SOURCE)
    other = any_size.METHOD if generic else any_sizes.METHOD if sized else any_batch.METHOD if batched else None
    model = _model(plan, sched, launches, direct, placed, other=other)
    if generic:
        model += "\n\n" + any_size.method(plan, sched, generic)
    if batched:
        model += "\n\n" + method
    parts.append(model)
    return "\n".join(parts) + "\n"


REFUSE_SOURCE = '''
def _kf_refuse(name, value, shape, dtype, any_shape=False, any_batch=None):
    """The error for an input this ModelNew's kernels were not written for: which dimension differs."""
    got = tuple(value.shape) if isinstance(value, torch.Tensor) else None
    if got is None:
        what = f"{name} is a {type(value).__name__}, not a tensor"
    elif len(got) != len(shape):
        what = f"{name} has {len(got)} dimensions (shape {got}), not {len(shape)}"
    elif got != shape:
        dims = ", ".join(f"dimension {d} is {g}, not {w}" for d, (g, w) in enumerate(zip(got, shape)) if g != w)
        what = f"{name} has shape {got}: {dims}"
    else:
        what = f"{name} is {str(value.dtype).replace('torch.', '')}, not {dtype}"
    if any_shape:
        return ValueError(f"{what}. This ModelNew takes inputs of any shape, all of one shape, {dtype}.")
    if any_batch:
        return ValueError(
            f"{what}. This ModelNew's kernels take any {any_batch}; the other sizes are fixed at the "
            "reference's (Kernel Foundry's template expert writes them for its shapes)."
        )
    return ValueError(
        f"{what}. This ModelNew's kernels are specialised to {name} of shape {shape} {dtype} (Kernel "
        "Foundry's template expert writes them for the reference's input shapes); generate it again at "
        "the shape you need."
    )

'''
"""The helper a rendered ``forward`` raises through when an input is not of the shape and dtype its
kernels were written for (the message names each dimension that differs)."""


def _returned(plan: Plan, sched: Schedule) -> tuple[list[str], list[str]]:
    """The lines that copy outputs into the reference's strides, and what ``forward`` returns."""
    lines: list[str] = []
    returned: list[str] = []
    for k, nid in enumerate(plan.outputs):
        out, _ = base_of(plan, nid, sched.is_exported)
        node = plan.nodes[nid]
        returned.append(f"_b{out}" if out == nid else f"_b{out}.view({tuple(node.shape)!r})")
        strides = plan.output_strides[k] if k < len(plan.output_strides) else None
        if strides is not None:  # the reference's layout (a permuted or sliced result): copied into it
            shape, dtype = tuple(node.shape), f"torch.{node.dtype}"
            lines.append(f"_o{k} = torch.empty_strided({shape!r}, {strides!r}, device=_kfdev, dtype={dtype})")
            lines.append(f"_o{k}.copy_({returned[-1]})")
            returned[-1] = f"_o{k}"
    return lines, returned


def _arena(plan: Plan, sched: Schedule, launches: list[Launch | None]) -> Arena:
    """Where the intermediates and scratch buffers that only kernels touch live (``arena.py``)."""
    members: dict[str, tuple[int, tuple[int, ...], str]] = {}
    stages: list[list[Launch]] = []
    texts: list[str] = []
    for i, (kernel, launch) in enumerate(zip(sched.kernels, launches, strict=True)):
        if launch is None:
            texts.append(_torch_call(plan, sched, kernel.mm))
            stages.append([])
            continue
        for nid in kernel.exports:
            node = plan.nodes[nid]
            members[f"_b{nid}"] = (i, tuple(node.shape), str(node.dtype))
        for name, shape, dtype in launch.work:
            members[name] = (i, shape, dtype)
        texts.extend(launch.setup)
        for stage in (*launch.pre, launch):
            texts.extend((*stage.grid_exprs, *stage.tail_args))
        stages.append([*launch.pre, launch])
    copies, returned = _returned(plan, sched)
    texts.extend((*copies, *returned))
    return place(stages, members, texts)


def _torch_call(plan: Plan, sched: Schedule, nid: int) -> str:
    """``_bN = (<the reference's call>).contiguous()`` for a node left to PyTorch."""
    node = plan.nodes[nid]
    operands = []
    for arg in node.tensor_args():
        base, transposed = base_of(plan, arg, sched.is_exported)
        src = plan.nodes[arg].tensor_args()[0] if transposed else arg
        expr = f"_b{base}"
        if plan.nodes[base].shape != plan.nodes[src].shape:
            expr += f".view({plan.nodes[src].shape!r})"
        if transposed:
            expr += ".transpose(-1, -2).contiguous()"  # values as the reference's; any view of it works
        operands.append(expr)
    return f"_b{nid} = ({node.path.format(*operands)}).contiguous()"


def _launch_line(launch: Launch, direct: bool, arena: Arena) -> str:
    """``name[grid](args)`` for one kernel launch in ``forward``, or ``_Lname(_kfs, args)``
    through its launch site (``direct``); tensors in the arena are passed as its buffer."""
    args = [arena.arg(name) for name in positional(launch)]
    if direct and _direct(launch):
        return f"_L{launch.name}(_kfs, {', '.join(args)})"
    args += [f"{k}={v}" for k, v in arena.args.get(launch.name, {}).items()]
    args += [f"{k}={v}" for k, v in launch.constexprs.items()]
    args += [*launch.tail_args, f"num_warps={launch.num_warps}", f"num_stages={launch.num_stages}"]
    grid = f"({', '.join(launch.grid_exprs)},)" if launch.grid_exprs else repr(tuple(launch.grid))
    return f"{launch.name}[{grid}]({', '.join(args)})"


def _model(
    plan: Plan, sched: Schedule, launches: list[Launch | None], direct: bool, arena: Arena, other: str | None = None
) -> str:
    """``ModelNew``: the reference's constructor and a ``forward`` that checks its inputs, makes its
    buffers and launches the kernels; ``other``: the method that inputs of other shapes go to
    (``any_size.METHOD``, ``any_batch.METHOD``) instead of being refused."""
    names = plan.arg_names
    lines = ["class ModelNew(nn.Module):", textwrap.indent(plan.init_source, "    "), ""]
    lines.append(f"    def forward(self, {', '.join(names)}):")
    body = _forward(plan, sched, launches, direct, arena, other)
    lines.append(textwrap.indent("\n".join(body), "        "))
    return "\n".join(lines)


def _forward(
    plan: Plan,
    sched: Schedule,
    launches: list[Launch | None],
    direct: bool,
    arena: Arena,
    other: str | None = None,
    batch: bool = False,
    free: str | None = None,
) -> list[str]:
    """The lines of ``forward`` (see :func:`_model`); ``batch``: of ``any_batch.METHOD``, whose
    shapes are expressions in the batch and whose refusals say that only the batch may change."""
    inputs = plan.inputs
    names = plan.arg_names
    body: list[str] = []
    for node in inputs:
        name = names[node.index]
        if node.path == FLOAT_ARG:
            body.append(
                f"if isinstance({name}, bool) or not isinstance({name}, (int, float)):\n"
                f'    raise ValueError("this ModelNew was generated for {name} as a Python number")'
            )
            continue
        refuse = f'    raise _kf_refuse("{name}", {name}, {tuple(node.shape)!r}, "{node.dtype}"' + (
            f", any_batch={free or plan.batch_name!r})" if batch else ")"
        )
        if other is not None:
            refuse = f"    return self.{other}({', '.join(names)})"
        body.append(f"if tuple({name}.shape) != {tuple(node.shape)!r} or {name}.dtype != torch.{node.dtype}:\n{refuse}")
    used_bases = {
        b
        for launch in launches
        if launch is not None
        for stage in (*launch.pre, launch)
        for b in (*stage.pointers, *stage.reads)
    }
    for kernel in sched.kernels:
        if kernel.kind is KernelKind.TORCH:
            used_bases.update(base_of(plan, a, sched.is_exported)[0] for a in plan.nodes[kernel.mm].tensor_args())
    device = None
    for node in inputs:
        if node.id in used_bases and node.path != FLOAT_ARG:
            body.append(f"_b{node.id} = {names[node.index]}.contiguous()")
            device = device or f"_b{node.id}.device"
    attrs = [n for n in plan.nodes if n.kind is NodeKind.PARAM and n.op == TENSOR_ATTR and n.id in used_bases]
    for node in plan.nodes:
        if node.kind is NodeKind.PARAM and node.id in used_bases and node not in attrs:
            body.append(f"_b{node.id} = {attr_path(node.path)}.contiguous()")
            device = device or f"_b{node.id}.device"
    if device is None:
        raise UnsupportedGraph("forward reads no tensor" + (" but plain tensor attributes" if attrs else ""))
    body.append(f"_kfdev = {device}")
    if direct and any(_direct(stage) for launch in launches if launch is not None for stage in (*launch.pre, launch)):
        body.append("_kfs = _kf_stream(_kfdev)")
    for buffer, (dtype, size) in arena.sizes.items():
        body.append(f"{buffer} = torch.empty(({size},), device=_kfdev, dtype=torch.{dtype})")
    for node in attrs:  # not moved by ``.to(device)`` as parameters and buffers are
        body.append(f"_b{node.id} = {attr_path(node.path)}.to({device}).contiguous()")
    for node in inputs:  # a Python number becomes the 0-dim float32 value the kernels read
        if node.id in used_bases and node.path == FLOAT_ARG:
            name = names[node.index]
            body.append(f"_b{node.id} = torch.full((), float({name}), dtype=torch.float32, device={device})")
    for kernel, launch in zip(sched.kernels, launches, strict=True):
        if launch is None:
            body.append(_torch_call(plan, sched, kernel.mm))
            continue
        for nid in kernel.exports:
            node = plan.nodes[nid]
            if f"_b{nid}" not in arena.slots:
                body.append(f"_b{nid} = torch.empty({tuple(node.shape)!r}, device=_kfdev, dtype=torch.{node.dtype})")
        for name, shape, dtype in launch.work:
            if name not in arena.slots:
                body.append(f"{name} = torch.empty({shape!r}, device=_kfdev, dtype=torch.{dtype})")
        body.extend(launch.setup)
        body.extend(_launch_line(stage, direct, arena) for stage in (*launch.pre, launch))
    copies, returned = _returned(plan, sched)
    body.extend(copies)
    if plan.returns is not None:  # the reference's tuples and lists, nested as it nests them
        body.append(f"return {_nested(plan.returns, returned)}")
    else:
        body.append(f"return {returned[0]}" if len(returned) == 1 else f"return ({', '.join(returned)})")
    return body


def _free(plan: Plan) -> str:
    """The sizes an any-size ``ModelNew`` takes, for people: ``batch_size, height and width``."""
    assert plan.sizes is not None
    names = [str(n) for n in plan.sizes.names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass(frozen=True)
class _Copy:
    """The kernels of a copy for other sizes and the lines of the method that launches them."""

    sources: tuple[str, ...]
    """The renamed kernels' sources."""
    head: tuple[str, ...]
    """The method's first lines: the sizes read from the inputs and checked (``guard``)."""
    body: tuple[str, ...]
    """The rest: ``forward``'s lines at the run-time sizes."""
    names: tuple[tuple[str, str], ...]
    """Each kernel's name at the task's shapes and in this copy."""

    @property
    def text(self) -> str:
        """Everything the copy writes (what the probes' renderings must agree on)."""
        return "\n".join([*self.sources, *self.head, *self.body])

    def normalised(self) -> str:
        """The kernels and ``forward``'s lines, every kernel under its name at the task's shapes (two
        copies that differ only in their suffixes compare equal)."""
        return any_batch.renamed("\n".join([*self.sources, *self.body]), {new: old for old, new in self.names})


def _any_sizes(
    plan: Plan, params: TemplateParams, used: set[str], hw: GpuModel | None = None
) -> tuple[list[str], str] | None:
    """The any-size kernels' sources and the method that launches them (``any_sizes``), or None
    where the plan, rendered at two sets of sizes, does not come out the same. With ``hw``, further
    copies for the smaller size buckets (``buckets.py``), the method choosing among them."""
    found = plan.sizes
    assert found is not None
    base = plan  # or the plan lowered without choices by size, holding the fits
    if found.plan is not None:
        base = replace(found.plan, sizes=replace(found, plan=None))

    def copy(at: TemplateParams, suffix: str, task: tuple[int, ...], into: set[str]) -> _Copy | None:
        sizes = replace(found, values=task)  # choices of speed taken at these sizes (``any_sizes.at_task``)
        return _copies(
            lambda: [any_sizes.symbolic(base, sizes, point) for point in any_sizes.probe_points(base, found)],
            at,
            into,
            lambda sym, sched, launches: _sized(sym, sched, launches, suffix),
            lambda texts: any_sizes.check_texts(texts, found),
        )

    main = copy(params, any_sizes.SUFFIX, found.values, used)
    if main is None:
        return None
    total = buckets.work(found.values)
    kept: list[tuple[buckets.Bucket, _Copy]] = []
    if hw is not None:

        def at(b: int) -> tuple[Plan, tuple[int, ...], str]:
            rep = buckets.representative(found.values, found.least, b)
            where = ", ".join(f"{name}={v}" for name, v in zip(found.names, rep, strict=True))
            return buckets.concrete_sizes(base, found, rep), rep, where

        def make(at_params: TemplateParams, b: int, rep: tuple[int, ...], into: set[str]) -> _Copy | None:
            return copy(at_params, f"{any_sizes.SUFFIX}{b}", rep, into)

        kept = _bucketed(main, params, hw, used, buckets.reachable(total, buckets.work(found.least)), at, make)
    return _assembled(main, kept, any_sizes.METHOD, plan.arg_names, found.variables, total)


def _bucketed(
    main: _Copy,
    params: TemplateParams,
    hw: GpuModel,
    used: set[str],
    reachable: list[int],
    at: Callable[[int], tuple[Plan, Any, str]],
    make: Callable[[TemplateParams, int, Any, set[str]], _Copy | None],
) -> list[tuple[buckets.Bucket, _Copy]]:
    """The copies of the buckets ``reachable`` (``at``: the plan at a bucket's representative
    sizes, those sizes, and their text; ``make``: the copy rendered with a bucket's parameters),
    consecutive equal ones merged, those that come out as ``main`` (or fail to render) left to it."""
    own = main.normalised()
    made: list[tuple[int, str | None, str]] = []
    copies: dict[int, tuple[_Copy, set[str]]] = {}
    for b in reachable:
        concrete, rep, where = at(b)
        try:
            chosen = buckets.bucket_params(concrete, params, hw, tf32=params.conv_precision == "tf32")
        except (InvalidParams, UnsupportedGraph):  # the candidate's precisions refuse the model's tiles
            made.append((b, None, ""))
            continue
        helpers: set[str] = set()
        copy = make(chosen, b, rep, helpers)
        text = copy.normalised() if copy is not None else None
        if copy is None or text == own:
            made.append((b, None, ""))
            continue
        made.append((b, text, buckets.note(params, chosen, where)))
        copies[b] = (copy, helpers)
    kept = buckets.runs(made)
    for run in kept:
        used |= copies[run.first][1]
    return [(run, copies[run.first][0]) for run in kept]


def _assembled(
    main: _Copy,
    kept: list[tuple[buckets.Bucket, _Copy]],
    method: str,
    args: tuple[str, ...],
    variables: tuple[str, ...],
    total: int,
) -> tuple[list[str], str]:
    """Every copy's kernels, and the methods: ``method`` (the sizes read and checked, the call sent
    to its bucket's method, else the run's own copy) and one per bucket kept."""
    everything = [*args, *variables]
    lines = buckets.dispatch(
        [run for run, _ in kept], total, variables, lambda b: f"return self.{method}_{b}({', '.join(everything)})"
    )
    methods = [_method(method, args, [*main.head, *lines, *main.body])]
    methods += [_method(f"{method}_{run.first}", (*args, *variables), list(copy.body)) for run, copy in kept]
    return [*main.sources, *(source for _, copy in kept for source in copy.sources)], "\n\n".join(methods)


def _method(name: str, args: tuple[str, ...], body: list[str]) -> str:
    """A ``ModelNew`` method, indented as the class's."""
    lines = [f"def {name}(self, {', '.join(args)}):", textwrap.indent("\n".join(body), "    ")]
    return textwrap.indent("\n".join(lines), "    ")


def _copies(
    probes: Callable[[], list[Plan]],
    params: TemplateParams,
    used: set[str],
    assemble: Callable[[Plan, Schedule, list[Launch | None]], _Copy],
    same: Callable[[list[str]], bool],
) -> _Copy | None:
    """A copy (kernels and the method's lines) written for each symbolic plan of ``probes`` (one
    per probe), kept where every rendering comes out the same (``same``); None where not, or where
    a writer cannot take a symbolic size."""
    renders: list[_Copy] = []
    helpers: set[str] = set()
    try:
        syms = probes()
    except Exception:  # noqa: BLE001 - a plan the symbolic sizes do not fit: no such path
        return None
    for sym in syms:
        try:
            sched = schedule(sym, params)
            launches = [
                None if kernel.kind is KernelKind.TORCH else write_kernel(sched, kernel, params, helpers)
                for kernel in sched.kernels
            ]
            renders.append(assemble(sym, sched, launches))
        except Exception:  # noqa: BLE001 - a writer that cannot take a symbolic size: no such path
            return None
    if not same([copy.text for copy in renders]):
        return None
    used |= helpers
    return renders[0]


def _sized(plan: Plan, sched: Schedule, launches: list[Launch | None], suffix: str = any_sizes.SUFFIX) -> _Copy:
    """The renamed any-size kernels (the size variables their first arguments) and the method's lines."""
    found = plan.sizes
    assert found is not None
    variables = found.variables
    stages = [stage for launch in launches if launch is not None for stage in (*launch.pre, launch)]
    names = {stage.name: stage.name + suffix for stage in stages}
    sources = [any_batch.batched_source(stage.source, names, variables) for stage in stages]

    def renamed(launch: Launch) -> Launch:
        return replace(
            launch,
            name=names[launch.name],
            lead_args=(*variables, *launch.lead_args),
            pre=tuple(renamed(p) for p in launch.pre),
        )

    moved = [None if launch is None else renamed(launch) for launch in launches]
    body = _forward(plan, sched, moved, direct=False, arena=Arena(), batch=True, free=_free(plan))
    return _Copy(tuple(sources), tuple(any_sizes.guard(plan, found)), tuple(body), tuple(names.items()))


def _any_batch(
    plan: Plan, params: TemplateParams, used: set[str], hw: GpuModel | None = None
) -> tuple[list[str], str] | None:
    """The any-batch kernels' sources and ``ModelNew``'s method that launches them (``any_batch``),
    or None where the plan, rendered at two batch sizes, does not come out the same. With ``hw``,
    further copies for the smaller batch buckets (``buckets.py``)."""

    def make(at_params: TemplateParams, suffix: str, into: set[str]) -> _Copy | None:
        return _copies(
            lambda: [any_batch.symbolic(plan, value) for value in any_batch.probe_batches(plan)],
            at_params,
            into,
            lambda sym, sched, launches: _batched(sym, sched, launches, suffix),
            any_batch.check_texts,
        )

    main = make(params, any_batch.SUFFIX, used)
    if main is None:
        return None
    total = any_batch.reference_batch(plan)
    kept: list[tuple[buckets.Bucket, _Copy]] = []
    if hw is not None:

        def at(b: int) -> tuple[Plan, int, str]:
            rep = buckets.representative((total,), (plan.batch_least,), b)[0]
            return buckets.concrete_batch(plan, rep), rep, f"{plan.batch_name}={rep}"

        def make_at(at_params: TemplateParams, b: int, rep: int, into: set[str]) -> _Copy | None:
            return make(at_params, f"{any_batch.SUFFIX}{b}", into)

        kept = _bucketed(main, params, hw, used, buckets.reachable(total, plan.batch_least), at, make_at)
    return _assembled(main, kept, any_batch.METHOD, plan.arg_names, (any_batch.NAME,), total)


def _batched(plan: Plan, sched: Schedule, launches: list[Launch | None], suffix: str = any_batch.SUFFIX) -> _Copy:
    """The renamed any-batch kernels (``kf_B`` their first argument) and the method's lines."""
    stages = [stage for launch in launches if launch is not None for stage in (*launch.pre, launch)]
    names = {stage.name: stage.name + suffix for stage in stages}
    sources = [any_batch.batched_source(stage.source, names) for stage in stages]

    def renamed(launch: Launch) -> Launch:
        return replace(
            launch,
            name=names[launch.name],
            lead_args=(any_batch.NAME, *launch.lead_args),
            pre=tuple(renamed(p) for p in launch.pre),
        )

    moved = [None if launch is None else renamed(launch) for launch in launches]
    body = _forward(plan, sched, moved, direct=False, arena=Arena(), batch=True)
    index, dim = any_batch.leading_input(plan)
    rank = len(next(n for n in plan.inputs if n.index == index).shape)
    guard = any_batch.guard(plan.arg_names[index], rank, dim, plan.batch_least)
    return _Copy(tuple(sources), tuple(guard), tuple(body), tuple(names.items()))


def _nested(returns: tuple[Any, ...], exprs: list[str]) -> str:
    """``forward``'s return expression for :attr:`Plan.returns`: ``(_b3, (_b5, _b7))``."""
    kind, *items = returns
    inner = ", ".join(_nested(x, exprs) if isinstance(x, tuple) else exprs[x] for x in items)
    if kind == "list":
        return f"[{inner}]"
    return f"({inner},)" if len(items) == 1 else f"({inner})"
