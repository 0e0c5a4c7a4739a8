"""``TemplateExpert``: the offline expert that answers ``GenerateRequest`` with template kernels.

Reads ``GenerateRequest`` (task, optional parent with its params or header, diagnosis,
experiences, ``n``, ``seed``) and answers ``GenerateReply`` with ``Proposal``s whose ``params``
are the template parameters and whose ``strategy`` names the template and the move; or a
``Decline`` (``unsupported``) for a reference the templates do not cover or a language other
than Triton. Tracing runs the user's reference, so it happens in a worker thread and its plan is
cached per ``task_id``. By default the analysis runs in a child process (``isolate.py``:
``torch.fx`` patches ``nn.Module.__call__`` process-wide while tracing, which would catch other
threads' module calls); ``analysis="thread"`` traces in a worker thread of this process, for a
process that runs nothing else on torch. Rendering is pure and runs in a worker thread. No
network, no GPU.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import structlog

from actors.evolution.amdahl import steering_shares
from actors.experts import analysis_child
from actors.experts.precision import tf32_admitted
from actors.experts.template.errors import InvalidParams
from actors.experts.template.hardware import GpuModel, detect, lookup
from actors.experts.template.ir import KeepTorch, Plan, Unsupported
from actors.experts.template.isolate import analyse_in_child, analyses_in_child
from actors.experts.template.kernels.conv import cudnn_ieee_likely
from actors.experts.template.params import TemplateParams, params_from_source
from actors.experts.template.plan_store import PlanStore
from actors.experts.template.render import analyse, render
from actors.experts.template.tuning import default_params, mutate, relevant_params
from actors.runtime import task_confine
from schemas import (
    Candidate,
    Decline,
    DeclineReason,
    DiagnosisCategory,
    EvalStatus,
    ExperienceHit,
    GenerateReply,
    GenerateRequest,
    KernelLanguage,
    Proposal,
    TorchOpsPolicy,
    source_fingerprint,
)

_log = structlog.get_logger(__name__)
_PLAN_CACHE = 32
_SOURCES_KEPT = 512
"""Rendered sources kept (a few MB at most: sources are a few KB)."""
_TF32_SEEN = 100.0
"""A reference whose error at PyTorch's defaults is this many times its IEEE fp32 error ran in
TF32 there (about 1e3 on a convolution; draws of one task differ by far less)."""


class AnalysisMode(StrEnum):
    """Where the reference is traced."""

    PROCESS = "process"
    """A fresh child process per task (the default; isolates fx's global patching and user code)."""
    THREAD = "thread"
    """A worker thread of this process (only where nothing else runs torch modules meanwhile)."""


@dataclass(frozen=True)
class TemplateExpertStats:
    """Counters of one expert instance."""

    requests: int
    proposals: int
    declines: int
    plans_traced: int
    errors: int
    plans_stored: int = 0
    """Plans read from the plan store (:mod:`.plan_store`) instead of analysed."""


def _params_of(candidate: Candidate) -> TemplateParams | None:
    """The template parameters of a candidate made by a template expert, if it is one."""
    if candidate.proposal.params:
        try:
            return TemplateParams.from_dict(dict(candidate.proposal.params))
        except (InvalidParams, TypeError):
            pass
    found = params_from_source(candidate.proposal.source)
    return found[1] if found is not None else None


def _admitted(params: TemplateParams, tf32: bool) -> TemplateParams:
    """``params`` with TF32 convolutions replaced by the three-pass scheme where TF32 is not admitted
    (a retrieved experience may come from a run that admitted it)."""
    return params if tf32 or params.conv_precision != "tf32" else params.with_changes(conv_precision="tf32x3")


def _fitted(plan: Plan, params: TemplateParams) -> TemplateParams:
    """``params`` without ``share_sizes`` where the plan has too few kernels for the tuner to move
    it (a parent or an experience from a whole model would leave it on for good)."""
    if params.share_sizes and "share_sizes" not in relevant_params(plan, params):
        return params.with_changes(share_sizes=False)
    return params


def _from_experience(hits: tuple[ExperienceHit, ...], plan: Plan) -> tuple[TemplateParams, str] | None:
    """The parameters of the best clean template result among retrieved experiences, with the id
    of the task it was measured on."""
    best: tuple[float, float, TemplateParams, str] | None = None
    for hit in hits:
        exp = hit.experience
        if exp.status is not EvalStatus.CORRECT or exp.child_fitness is None or not exp.params:
            continue
        try:
            params = TemplateParams.from_dict(dict(exp.params))
        except (InvalidParams, TypeError):
            continue
        if (params.fuse_epilogue, params.fuse_prologue) not in plan.fusions:
            params = params.with_changes(fuse_epilogue=True, fuse_prologue=True)
        params = _fitted(plan, params)
        key = (exp.child_fitness, hit.score, params, exp.task_id)
        if best is None or key[:2] > best[:2]:
            best = key
    return (best[2], best[3]) if best is not None else None


def _changes(before: TemplateParams, after: TemplateParams) -> str:
    old, new = before.as_dict(), after.as_dict()
    diffs = [f"{k} {old[k]}→{new[k]}" for k in new if old[k] != new[k]]
    return ", ".join(diffs) if diffs else "no change"


class TemplateExpert:
    """Satisfies ``actors.experts.base.Expert`` with rendered Triton templates."""

    def __init__(
        self,
        name: str = "template",
        *,
        max_variants: int = 8,
        analysis: AnalysisMode = AnalysisMode.PROCESS,
        analysis_timeout_s: float = 180.0,
        gpu: str | None = None,
        plan_store: PlanStore | None = None,
    ) -> None:
        if not name or not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
            raise ValueError(f"expert name {name!r} must be 1-64 letters, digits, '-' or '_'")
        if not 1 <= max_variants <= 64:
            raise ValueError(f"max_variants={max_variants} must be within 1..64")
        if analysis_timeout_s <= 0:
            raise ValueError(f"analysis_timeout_s={analysis_timeout_s} must be positive")
        self.name = name
        self.max_variants = max_variants
        self.analysis = AnalysisMode(analysis)
        self.analysis_timeout_s = analysis_timeout_s
        self.gpu = gpu
        """The GPU fresh starts are sized for (a name ``hardware.lookup`` knows, e.g. ``H200``):
        the evaluators' where the expert runs elsewhere; ``None``: the GPU the last verdict it was
        shown names (``_evaluated_on``), until then this machine's."""
        self.plan_store = plan_store
        """Plans kept on disk between runs (``None``: every process analyses its tasks afresh)."""
        self._evaluated_on: str | None = None
        """The GPU named by the newest verdict a request carried (its ``device``)."""
        self._plans: OrderedDict[tuple[str, KeepTorch], Plan | Unsupported] = OrderedDict()
        self._exact_tasks: OrderedDict[str, None] = OrderedDict()
        """Tasks whose TF32 convolution came back ``incorrect.precision``: the evaluator judged it
        at exact precision (the reference's cuDNN computes IEEE fp32 there, as it does for few
        input channels); no further proposal for them is in TF32."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._sources: OrderedDict[tuple[int, TemplateParams, GpuModel], tuple[Plan, str]] = OrderedDict()
        """Rendered sources by plan, parameters and the GPU the size buckets were chosen for (the
        plan kept with its source, so its id is not reused while the entry lives): the same
        configurations come back again and again."""
        self._sources_lock = threading.Lock()  # proposals are made in worker threads
        self._requests = self._proposals = self._declines = self._traced = self._errors = 0
        self._stored = 0

    def stats(self) -> TemplateExpertStats:
        """A snapshot of the counters."""
        return TemplateExpertStats(
            self._requests, self._proposals, self._declines, self._traced, self._errors, self._stored
        )

    async def aclose(self) -> None:
        """Drop cached plans (nothing else is held)."""
        self._plans.clear()
        self._locks.clear()
        with self._sources_lock:
            self._sources.clear()

    def _target(self) -> GpuModel:
        """The GPU proposals are sized for: the one named, else the verdicts', else this machine's
        (a fresh start has no measured device)."""
        return detect(self.gpu or self._evaluated_on)

    def _render(self, plan: Plan, params: TemplateParams) -> str:
        """``render(plan, params)``, with a configuration per size bucket for the copies that take
        other sizes, chosen for the GPU fresh starts are sized for (``_starts``); from the cache
        when this configuration was rendered lately for that GPU."""
        hw = self._target()
        key = (id(plan), params, hw)
        with self._sources_lock:
            hit = self._sources.get(key)
            if hit is not None and hit[0] is plan:
                self._sources.move_to_end(key)
                return hit[1]
        source = render(plan, params, hw=hw)
        with self._sources_lock:
            self._sources[key] = (plan, source)
            if len(self._sources) > _SOURCES_KEPT:
                self._sources.popitem(last=False)
        return source

    async def plan_for(self, task_id: str, source: str, keep_torch: KeepTorch = KeepTorch.NONE) -> Plan | Unsupported:
        """The plan of a task, traced once per ``task_id`` (child process or worker thread).

        With ``keep_torch`` a reference the templates do not cover entirely gets a split plan:
        kernels for what they cover, the reference's own PyTorch calls for the rest (``LAYOUT``:
        data movement only; ``ALL``: run policy ``--torch-ops reference``).
        """
        if keep_torch is not KeepTorch.NONE:
            whole = await self._cached((task_id, KeepTorch.NONE), lambda: self._whole(task_id, source, keep_torch))
            if isinstance(whole, Plan):
                return whole
        return await self._cached((task_id, keep_torch), lambda: self._analysed(source, keep_torch))

    async def _cached(
        self, key: tuple[str, KeepTorch], compute: Callable[[], Awaitable[Plan | Unsupported]]
    ) -> Plan | Unsupported:
        """The plan remembered under ``key``, else ``compute``'s (once: concurrent requests wait)."""
        cached = self._plans.get(key)
        if cached is not None:
            self._plans.move_to_end(key)
            return cached
        lock = self._locks.setdefault(f"{key[0]}:{key[1]}", asyncio.Lock())
        async with lock:
            cached = self._plans.get(key)
            if cached is None:
                cached = await compute()
                self._remember(key, cached)
        return cached

    async def _whole(self, task_id: str, source: str, keep_torch: KeepTorch) -> Plan | Unsupported:
        """The plan of the whole reference (``NONE``), analysed in one child with the fallback's
        (``keep_torch``) where it is not covered, that one remembered too: a model that needs the
        fallback waited for two children in a row, each starting Python and torch."""
        store = self.plan_store
        if store is not None:
            for policy in (KeepTorch.NONE, keep_torch):  # kept under the fallback: the whole was not covered
                kept = await asyncio.to_thread(store.get, source, policy)
                if kept is not None:
                    self._stored += 1
                    pending = analysis_child.take(source, keep_torch.value, task_confine.wanted())
                    if pending is not None:  # started ahead by `kfoundry run`: not needed
                        # Its child killed and reaped before going on: a loop that closed while the
                        # kill was still being reported left a process object that warned when freed.
                        pending.cancel()
                        await asyncio.wait([pending])
                    if policy is KeepTorch.NONE:
                        return kept
                    self._remember((task_id, policy), kept)
                    return Unsupported(detail=f"not covered whole (its plan is kept with {policy.value} ops)")
        found: dict[KeepTorch, Plan | Unsupported]
        if self.analysis is AnalysisMode.PROCESS:
            found = await analyses_in_child(source, self.analysis_timeout_s, keep_torch)
        else:
            whole = await asyncio.to_thread(analyse, source)
            found = {KeepTorch.NONE: whole}
            if isinstance(whole, Unsupported):
                found[keep_torch] = await asyncio.to_thread(analyse, source, keep_torch)
        self._traced += 1
        for policy, plan in found.items():
            if policy is not KeepTorch.NONE:
                self._remember((task_id, policy), plan)
            if store is not None and isinstance(plan, Plan):
                await asyncio.to_thread(store.put, source, policy, plan)
        return found[KeepTorch.NONE]

    def _remember(self, key: tuple[str, KeepTorch], plan: Plan | Unsupported) -> None:
        self._plans[key] = plan
        while len(self._plans) > _PLAN_CACHE:
            (old, kept), _ = self._plans.popitem(last=False)
            self._locks.pop(f"{old}:{kept}", None)

    async def _analysed(self, source: str, keep_torch: KeepTorch) -> Plan | Unsupported:
        """The plan from the plan store where it keeps one, else analysed (and then kept there)."""
        store = self.plan_store
        if store is not None:
            kept = await asyncio.to_thread(store.get, source, keep_torch)
            if kept is not None:
                self._stored += 1
                return kept
        if self.analysis is AnalysisMode.PROCESS:
            plan = await analyse_in_child(source, self.analysis_timeout_s, keep_torch)
        else:
            plan = await asyncio.to_thread(analyse, source, keep_torch)
        self._traced += 1
        if store is not None and isinstance(plan, Plan):
            await asyncio.to_thread(store.put, source, keep_torch, plan)
        return plan

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        """Up to ``request.n`` (at most ``max_variants``) template candidates, or a decline."""
        started = time.perf_counter()
        self._requests += 1
        log = _log.bind(expert=self.name, request_id=request.request_id, task_id=request.task.task_id)
        if request.language is not KernelLanguage.TRITON:
            return self._decline(request, started, f"the template expert writes Triton, not {request.language}")
        try:
            reference = request.torch_ops is TorchOpsPolicy.REFERENCE
            keep_torch = KeepTorch.ALL if reference else KeepTorch.LAYOUT
            plan = await self.plan_for(request.task.task_id, request.task.source, keep_torch)
            if isinstance(plan, Unsupported):
                log.info("template.decline", detail=plan.detail)
                return self._decline(request, started, plan.detail, plan.op)
            proposals = await asyncio.to_thread(self._propose, plan, request)
        except Exception as exc:
            # The one boundary: a failure here is a bug of the expert; it is logged with its
            # traceback, counted, and answered as a typed decline so the run goes on.
            self._errors += 1
            log.exception("template.error")
            return self._decline(request, started, f"template expert failed: {type(exc).__name__}: {exc}")
        if not proposals:
            return self._decline(request, started, "no configuration near the parent is left to try")
        self._proposals += len(proposals)
        return GenerateReply(
            request_id=request.request_id,
            expert=self.name,
            proposals=proposals,
            elapsed_s=time.perf_counter() - started,
        )

    def _decline(self, request: GenerateRequest, started: float, detail: str, op: str | None = None) -> GenerateReply:
        self._declines += 1
        return GenerateReply(
            request_id=request.request_id,
            expert=self.name,
            decline=Decline(reason=DeclineReason.UNSUPPORTED, detail=detail, op=op),
            elapsed_s=time.perf_counter() - started,
        )

    def _starts(
        self, plan: Plan, request: GenerateRequest, n: int, avoid: set[str]
    ) -> list[tuple[TemplateParams, str, str]]:
        """A fresh start's ``n`` configurations: ``request.start`` onwards in this task's list of
        starting points, the same list for every request of a run (so that concurrent requests and
        islands, which ask for different starts, get different kernels instead of the default eight
        times): the default for the traced shapes and the best retrieved experience's configuration
        (first when it was measured on this very task), then mutations of them in turn, drawn from
        a generator seeded by the task. Kernels in ``avoid`` (the island's own) are passed over."""
        hw = self._target()
        tf32 = self._tf32(request)
        default = default_params(plan, hw, tf32)
        # Whether the reference's own convolutions run in TF32 is known only from the first
        # verdicts (cuDNN computes IEEE fp32 for few input channels; the evaluator then judges at
        # exact precision): the same start without TF32 comes second, so that a fresh start holds a
        # candidate correct either way. On an H200 (KernelBench L2-6, 21, 67, 73, 92, 40 s each),
        # 7 to 13 of a run's first 16 to 21 evaluations were TF32 candidates refused so. Where
        # cuDNN probably computes IEEE fp32 (``cudnn_ieee_likely``), the start without TF32 leads.
        exact = default_params(plan, hw, False) if tf32 else default
        second = exact
        if tf32 and cudnn_ieee_likely(plan):
            default, second = exact, default
        found = _from_experience(request.experiences, plan)
        learned, where = (_admitted(found[0], tf32), found[1]) if found is not None else (None, "")
        listed: list[tuple[TemplateParams, str, str]] = []
        if learned == default:
            # What worked best on a similar task is this task's default: the start is still the
            # experience's (a run that retrieved it says so).
            listed.append((default, "experience", f"configuration of the best retrieved experience, "
                           f"also the default for the traced shapes on {hw.name}"))  # fmt: skip
        else:
            listed.append((default, "default", f"default configuration for the traced shapes on {hw.name}"))
            if learned is not None:
                # Another task's best comes second: on an H200, KernelBench L1-57 (a transposed
                # convolution) started from a retrieved convolution's configuration ran at 0.06x of
                # eager, and its default was never evaluated in 45 s; a run from its default reached 0.13x.
                experience = (learned, "experience", "configuration of the best retrieved experience")
                listed.insert(0 if where == request.task.task_id else 1, experience)
        if all(second != p for p, _, _ in listed):
            after = next(i for i, (p, _, _) in enumerate(listed) if p == default) + 1
            if second == exact:
                why = "without TF32 (correct whether or not the reference's convolutions use it)"
            else:
                why = "in one TF32 pass (correct if the reference's cuDNN convolutions run TF32)"
            described = f"default configuration for the traced shapes on {hw.name}, {why}"
            listed.insert(after, (second, "default", described))
        if default.share_sizes:
            # The default shares functions between kernels that differ only in constants (a first
            # verdict sooner for a whole model: fewer functions to compile); the same with every
            # constant in its kernel (the compiler knowing each size) follows the defaults.
            apart = default.with_changes(share_sizes=False)
            after = max(i for i, (p, _, _) in enumerate(listed) if p in (default, second)) + 1
            why = "each kernel a function of its own, its sizes constants"
            listed.insert(after, (apart, "default", f"default configuration for the traced shapes on {hw.name}, {why}"))
        bases = [p for p, _, _ in listed]
        seen = set(bases)
        want = request.start + n + min(len(avoid), 8 * n)  # room to pass over the island's kernels
        rng = np.random.default_rng(zlib.crc32(f"{request.task.task_id}:{plan.template}".encode()))
        for i in range(8 * want):
            if len(listed) >= want:
                break
            base = bases[i % len(bases)]
            child = mutate(plan, base, rng, diagnosis=None, tf32=tf32)
            if child not in seen:
                seen.add(child)
                label = "mutate.default" if base in (default, second) else "mutate.experience"
                listed.append((child, label, _changes(base, child)))
        first = request.start % len(listed)  # a small space of configurations: round again
        walk = listed[first:] + listed[:first]
        fresh: list[tuple[TemplateParams, str, str]] = []
        for entry in walk:
            if len(fresh) == n:
                break
            if not avoid or source_fingerprint(self._render(plan, entry[0])) not in avoid:
                fresh.append(entry)
        return fresh or walk[:n]

    def _tf32(self, request: GenerateRequest) -> bool:
        """Whether this request's proposals may compute convolutions in TF32: the run admits it
        (:func:`tf32_admitted`) and no TF32 candidate of this task was refused for its precision."""
        return tf32_admitted(request) and request.task.task_id not in self._exact_tasks

    def _learn_precision(self, request: GenerateRequest, parent: TemplateParams | None) -> None:
        """Whether the task is judged at exact precision, from the parent's verdict: its
        correctness measured the reference's IEEE error against float64 but found no other error
        at PyTorch's defaults (the defaults compute IEEE fp32 there, or were too large to measure),
        or a TF32 parent was diagnosed ``incorrect.precision``."""
        diagnosis = request.diagnosis.category if request.diagnosis is not None else None
        tf32_parent = parent is not None and parent.conv_precision == "tf32"
        refused = tf32_parent and diagnosis is DiagnosisCategory.INCORRECT_PRECISION
        corr = request.parent_result.correctness if request.parent_result is not None else None
        exact = corr is not None and corr.ref_err_vs_fp64 is not None and corr.ref_default_err_vs_fp64 is None
        if not refused and corr is not None and corr.ref_err_vs_fp64 is not None:
            at_defaults = corr.ref_default_err_vs_fp64
            if at_defaults is not None and at_defaults > _TF32_SEEN * max(corr.ref_err_vs_fp64, 1e-12):
                # A later verdict measured the reference at PyTorch's defaults in TF32: an earlier
                # measure was cuDNN short of its workspace (KernelBench L3-25 on an H100: 4.3e-07
                # in the first verdicts, 3.5e-04 later in the same run; its TF32 candidates were
                # refused first and never proposed again, the run's best a three-pass kernel).
                self._exact_tasks.pop(request.task.task_id, None)
                return
        if refused or exact:
            self._exact_tasks[request.task.task_id] = None
            self._exact_tasks.move_to_end(request.task.task_id)
            while len(self._exact_tasks) > _PLAN_CACHE:
                self._exact_tasks.popitem(last=False)

    def _propose(self, plan: Plan, request: GenerateRequest) -> tuple[Proposal, ...]:
        rng = np.random.default_rng(request.seed)
        n = min(request.n, self.max_variants)
        parent = _params_of(request.parent) if request.parent is not None else None
        self._learn_precision(request, parent)
        device = request.parent_result.device if request.parent_result is not None else None
        if device is not None and lookup(device.name) is not None:
            self._evaluated_on = device.name
        tf32 = self._tf32(request)
        if parent is not None:
            parent = _admitted(parent, tf32)  # a refused TF32 parent goes on in three passes
        if parent is not None and (parent.fuse_epilogue, parent.fuse_prologue) not in plan.fusions:
            parent = parent.with_changes(fuse_epilogue=True, fuse_prologue=True)
        if parent is not None:
            parent = _fitted(plan, parent)
        chosen: list[tuple[TemplateParams, str, str]] = []
        avoid = set(request.avoid)
        if parent is not None:
            diagnosis = request.diagnosis.category if request.diagnosis is not None else None
            shares = {f.value: v for f, v in steering_shares(request.parent_result).items()}
            seen = {parent}
            # the diagnosis's moves first; where the island has all they reach, any move
            for steer in (diagnosis, None) if diagnosis is not None else (None,):
                move = f"mutate.{steer.value if steer is not None else 'random'}"
                for _ in range(8 * n):
                    if len(chosen) == n:
                        break
                    child = mutate(plan, parent, rng, diagnosis=steer, tf32=tf32, shares=shares)
                    if child not in seen:
                        seen.add(child)
                        if source_fingerprint(self._render(plan, child)) not in avoid:
                            chosen.append((child, move, _changes(parent, child)))
        else:
            chosen = self._starts(plan, request, n, avoid)
        return tuple(
            Proposal(
                source=self._render(plan, params),
                language=KernelLanguage.TRITON,
                strategy=f"template:{plan.template}/{move}",
                description=description,
                params=params.as_dict(),
            )
            for params, move, description in chosen
        )
