"""A configuration per size bucket for the any-size and any-batch copies (issue 38 item 1).

A candidate's parameters were tuned at the task's own sizes. Its copies for other sizes
(``any_sizes.py``, ``any_batch.py``) ran with those parameters at every size, so at a batch of one
a GEMM kept the 128 x 128 tiles and 8 warps chosen to fill 132 SMs with a 2048-row product, and
left most of the machine idle. Here the sizes a copy meets are sorted into buckets by the work
they carry, the product of the free sizes against the task's (``W0``):

- bucket 0: over ``W0 / 4`` (sizes near the task's, and every larger one): the run's own
  configuration, the one its search timed;
- bucket ``b`` of 1 to :data:`DEEPEST`: at most ``W0 / 4 ** b`` (the deepest takes everything
  smaller): the hardware model's first configuration (``default_params``) for the plan at that
  bucket's representative sizes (:func:`representative`: the batch, the first free size, made
  smaller first, as users meet other batch sizes most often).

Only what moves speed comes from the bucket: the precisions (``tl.dot``'s inputs in products,
convolutions and attention, which precision parity judged at the task's size) and the fusions
stay the candidate's (:data:`KEPT`), so every bucket computes as the verdict's configuration did.
``render(plan, params, hw=...)`` writes each bucket's copy as it writes the run's own (the same
two renderings that must come out alike; an any-size copy's choices of speed, ``at_task``, taken
at the bucket's sizes), with kernels suffixed ``_s1``, ``_s2`` ... (``_b1`` ... for any-batch) and
a method ``_kf_any_sizes_1(self, <inputs>, <size variables>)``. A bucket whose copy comes out as
the run's own (once the suffixes are set aside), or that cannot be rendered, runs the run's own;
consecutive buckets of the same copy share the shallowest one's (:func:`runs`). The method that
runs the copies (``_kf_any_sizes``, ``_kf_any_batch``) reads the call's work after its checks and
goes to the deepest bucket it falls in (:func:`dispatch`, each branch commented with what its
configuration changes), else on to the run's own copy. Without ``hw`` (bench scripts, tests) the
source is as before; the template expert passes the model of the GPU it sizes fresh starts for.
Plans of many kernels (:data:`MAX_KERNELS`) keep one configuration: each bucket is another copy of
every kernel to compile at its first call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from actors.experts.template.hardware import GpuModel
from actors.experts.template.ir import Plan
from actors.experts.template.params import TemplateParams
from actors.experts.template.size_fits import Sizes

STEP = 4
"""Each bucket holds sizes whose product is this many times smaller than the one before."""
DEEPEST = 3
"""The last bucket: everything below ``W0 / STEP ** DEEPEST`` (a 64th of the task's work)."""
MAX_KERNELS = 16
"""Plans with more kernels than this keep the candidate's configuration at every size."""
KEPT = ("mm_precision", "conv_precision", "attn_precision", "fuse_epilogue", "fuse_prologue")
"""Parameters every bucket takes from the candidate (what its kernels compute, not how fast)."""


def work(values: Sequence[int]) -> int:
    """The product of the free sizes (the bucket's measure)."""
    return math.prod(int(v) for v in values)


def representative(values: Sequence[int], least: Sequence[int], bucket: int) -> tuple[int, ...]:
    """Sizes in the middle of ``bucket`` (a product ``2 * STEP ** bucket`` times below the task's):
    the first size divided down, to its least value at most, then the others in turn."""
    factor = 2 * STEP**bucket
    out = [int(v) for v in values]
    for i in range(len(out)):
        if factor <= 1:
            break
        new = max(int(least[i]) if i < len(least) else 1, 1, out[i] // factor)
        factor = math.ceil(factor * new / out[i])
        out[i] = new
    return tuple(out)


def concrete_sizes(plan: Plan, found: Sizes, point: tuple[int, ...]) -> Plan:
    """``plan`` at the free sizes ``point``: every fitted dimension and moving constant at its value."""
    nodes = []
    for k, node in enumerate(plan.nodes):
        shape = tuple(d if fit is None else fit.at(point) for d, fit in zip(node.shape, found.dims[k], strict=True))
        consts = found.args[k] if found.args else ()
        args = (
            tuple(a if fit is None else float(fit.at(point)) for a, fit in zip(node.args, consts, strict=True))
            if consts
            else node.args
        )
        nodes.append(replace(node, shape=shape, args=args))
    return replace(plan, nodes=tuple(nodes))


def concrete_batch(plan: Plan, batch: int) -> Plan:
    """``plan`` at batch ``batch`` (its batch-linked dimensions and constants)."""
    consts = plan.batch_args or tuple(() for _ in plan.nodes)
    nodes = tuple(
        replace(
            node,
            shape=tuple(c * batch if c else d for d, c in zip(node.shape, links, strict=True)),
            args=tuple(float(c * batch) if c else a for a, c in zip(node.args, cs, strict=True)) if cs else node.args,
        )
        for node, links, cs in zip(plan.nodes, plan.batch, consts, strict=True)
    )
    return replace(plan, nodes=nodes)


def bucket_params(at: Plan, params: TemplateParams, hw: GpuModel, tf32: bool) -> TemplateParams:
    """The hardware model's configuration for the plan ``at`` a bucket's sizes, with the
    candidate's precisions and fusions (:data:`KEPT`)."""
    from actors.experts.template.tuning import default_params  # tuning imports the kernel kinds

    chosen = default_params(at, hw, tf32)
    return chosen.with_changes(**{name: getattr(params, name) for name in KEPT})


def reachable(total: int, smallest: int = 1) -> list[int]:
    """The buckets 1..DEEPEST a call can fall in, for a task of work ``total`` and calls of work
    ``smallest`` at least (the product of the least sizes the reference takes): bucket ``b`` holds
    the calls whose work times ``STEP ** b`` is at most ``total``."""
    return [b for b in range(1, DEEPEST + 1) if max(1, smallest) * STEP**b <= total]


@dataclass(frozen=True)
class Bucket:
    """Consecutive buckets served by one copy of the kernels."""

    first: int
    """The shallowest (its copy's suffix and method are numbered by it)."""
    last: int
    """The deepest."""
    note: str
    """Which parameters its copy changes, and where the hardware model chose them."""


def note(params: TemplateParams, chosen: TemplateParams, where: str) -> str:
    """What a bucket's configuration ``chosen`` changes from the candidate's ``params``, for the
    comment on its branch (``where``: its representative sizes, as ``batch_size=16``)."""
    old, new = params.as_dict(), chosen.as_dict()
    changed = [f"{name}={value}" for name, value in new.items() if value != old[name]]
    if not changed:  # any_sizes.at_task: choices of speed the parameters leave to the sizes
        return f"the run's own parameters, the choices they leave to the sizes taken at {where}"
    return ", ".join(changed) + f", the hardware model's choice at {where}"


def runs(made: Sequence[tuple[int, str | None, str]]) -> list[Bucket]:
    """The copies to keep, from ``(bucket, its copy's text or None where it runs the candidate's
    own copy, its note)`` in order: consecutive buckets with the same text served by the shallowest
    one's copy, those of no text left to the candidate's."""
    out: list[Bucket] = []
    last_text: str | None = None
    for b, text, why in made:
        if text is not None and out and last_text == text and out[-1].last == b - 1:
            out[-1] = replace(out[-1], last=b)
        elif text is not None:
            out.append(Bucket(b, b, why))
        last_text = text
    return out


def dispatch(kept: Sequence[Bucket], total: int, variables: Sequence[str], call: Callable[[int], str]) -> list[str]:
    """The lines that send a call to its bucket's copy (``call``: the statement that runs bucket
    ``b``'s method), the deepest first; a call in no kept bucket goes on to the candidate's own
    copy. A bucket with a shallower one kept and a deeper one not (that deeper one runs the
    candidate's copy) is bounded below too."""
    if not kept:
        return []
    served = {b for run in kept for b in range(run.first, run.last + 1)}
    lines = [f"_kf_work = {' * '.join(variables)}"]  # not ``kf_``: a size could be named ``work``
    for run in sorted(kept, key=lambda r: -r.first):
        deeper = run.last + 1
        bounded = deeper <= DEEPEST and deeper not in served and total >= STEP**deeper
        which = f"bucket {run.first}" if run.first == run.last else f"buckets {run.first} to {run.last}"
        share = f"at most 1/{STEP**run.first} of the task's work"
        cond = f"0 < _kf_work * {STEP**run.first} <= {total}"
        if bounded:
            share += f", over 1/{STEP**deeper}"
            cond += f" < _kf_work * {STEP**deeper}"
        lines += [f"# {which} ({share}): {run.note}", f"if {cond}:", f"    {call(run.first)}"]
    return lines
