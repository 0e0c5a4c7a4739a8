"""The run and the task: what the user asked for."""

from __future__ import annotations

import ast
import hashlib
import threading
from typing import Literal

from pydantic import Field, model_validator

from schemas.base import Message, Model, Token, new_id, now
from schemas.enums import DeviceChoice, KernelLanguage, MigrationReason, PrecisionMode, TorchOpsPolicy


def source_fingerprint(source: str) -> str:
    """A source's identity: the first 16 hex digits of its SHA-256. A task's id, and a kernel's
    within a run (two proposals with one source are one kernel, whichever expert or move made them)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class TensorSpec(Model):
    """Shape and dtype of one tensor of the reference (an input or the output)."""

    shape: tuple[int, ...]
    """Sizes per dimension."""
    dtype: str
    """torch dtype name without the ``torch.`` prefix, e.g. ``float32``."""


class TaskSignature(Model):
    """What a task computes, in a form the experience library can compare across runs."""

    ops: tuple[str, ...] = ()
    """Operators of the reference's forward in execution order (e.g. ``linear``, ``relu``)."""
    inputs: tuple[TensorSpec, ...] = ()
    """The tensors ``get_inputs()`` returns."""
    outputs: tuple[TensorSpec, ...] = ()
    """The tensors the reference's forward returns."""
    flops: int | None = None
    """Floating-point operations of one forward, where they could be counted."""
    bytes_moved: int | None = None
    """Fewest bytes one forward must move (inputs, parameters and outputs once)."""

    def text(self) -> str:
        """A short human-readable description, also used as embedding text."""
        ins = ", ".join(f"{t.dtype}{list(t.shape)}" for t in self.inputs)
        return f"ops: {' -> '.join(self.ops) or '?'}; inputs: {ins or '?'}"


_PARSE = threading.Lock()


def parse_module(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` of a module, one parse at a time in this process.

    CPython 3.11 keeps the depth counter with which it builds a tree's Python objects once per
    interpreter, not per call: a garbage collection during the build that lets another thread run,
    and that thread's parse, leave the first with ``SystemError: AST constructor recursion depth
    mismatch`` (python/cpython#106905; one evaluator's candidate gate in a worker thread and another's
    reference check on the event loop failed so). Every parse in the project's library code goes
    through here or :func:`parse_expression`. A plain lock: nothing parses from inside a parse."""
    with _PARSE:
        return ast.parse(source, filename)


def parse_expression(source: str) -> ast.Expression:
    """``ast.parse`` of one expression, under :func:`parse_module`'s lock."""
    with _PARSE:
        return ast.parse(source, mode="eval")


REFERENCE_NAMES = ("Model", "get_inputs", "get_init_inputs")
"""The names a KernelBench reference defines at module level."""


def module_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level: ``def``/``class``, assignments (``get_inputs =
    lambda: ...`` or any callable), annotated assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".", 1)[0] for a in node.names)
    return names


def missing_reference_names(tree: ast.Module) -> list[str]:
    """Which of :data:`REFERENCE_NAMES` the module does not bind (see :func:`module_names`)."""
    names = module_names(tree)
    return [n for n in REFERENCE_NAMES if n not in names]


class Task(Message):
    """A KernelBench-format reference (``class Model``, ``get_inputs``, ``get_init_inputs``)."""

    type: Literal["task"] = "task"
    """Wire name of this message type."""
    task_id: str
    """Content hash of the reference source (first 16 hex digits of its SHA-256)."""
    name: str
    """Human name, usually the file's stem."""
    source: str = Field(min_length=1)
    """The reference's Python source."""
    signature: TaskSignature | None = None
    """Ops, shapes and dtypes of the reference, where they could be read."""

    @classmethod
    def from_source(cls, name: str, source: str, signature: TaskSignature | None = None) -> Task:
        """Build a task whose id is the hash of its source (:func:`source_fingerprint`)."""
        return cls(task_id=source_fingerprint(source), name=name, source=source, signature=signature)


class Budget(Model):
    """Limits of a run. The run stops at the first one reached; ``None`` is no limit."""

    wall_s: float | None = Field(default=600.0, gt=0)
    """Wall-clock seconds from the start of the run."""
    candidates: int | None = Field(default=200, gt=0)
    """Candidates evaluated across all islands."""
    tokens: int | None = Field(default=None, gt=0)
    """LLM tokens (prompt and completion) across all experts."""

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if self.wall_s is None and self.candidates is None and self.tokens is None:
            raise ValueError("a budget needs at least one limit (wall_s, candidates or tokens)")
        return self


class Ablations(Model):
    """Mechanisms a run turns off, one at a time, to measure what each earns (``bench/ablation.py``)."""

    no_experience: bool = False
    """Islands ask the experience library nothing: no ``kf.exp.query`` request, no experience shown."""
    uniform_experts: bool = False
    """Islands choose experts uniformly at random: no diagnosis routing, no learned credit."""
    no_migration: bool = False
    """No elites move between islands (no migrator is started; a migrator or island of the run
    sends or accepts none)."""
    no_meta_prompt: bool = False
    """LLM experts get no evolved meta-prompt section (and none is evolved)."""

    def active(self) -> tuple[str, ...]:
        """The names of the switches that are on."""
        return tuple(name for name in type(self).model_fields if getattr(self, name))


class MigrationPolicy(Model):
    """How elites move between islands."""

    topology: MigrationReason = MigrationReason.RING
    """``ring`` sends to the next island, ``random`` to a seeded random other island."""
    interval_s: float = Field(default=10.0, gt=0)
    """Seconds between scheduled migrations."""
    count: int = Field(default=1, ge=1)
    """Elites sent per migration."""
    on_stagnation: bool = True
    """Also migrate into an island as soon as it reports stagnation."""


class ExpertRef(Model):
    """An expert a run may call, by the name it serves under."""

    name: Token
    """The expert's service name (``kf.expert.<name>.generate``)."""
    weight: float = Field(default=1.0, gt=0)
    """Prior weight of this expert before credit is learned."""


class RunSpec(Message):
    """Everything that defines a run. Stored in the ``kf_runs`` KV bucket under the run id."""

    type: Literal["run_spec"] = "run_spec"
    """Wire name of this message type."""
    run_id: Token = Field(default_factory=lambda: new_id()[:12])
    """Unique id of the run; namespaces its subjects and its stream."""
    task: Task
    """The reference to make faster."""
    islands: int = Field(default=2, ge=1, le=64)
    """Number of islands."""
    inflight_per_island: int = Field(default=2, ge=1, le=256)
    """Candidates each island keeps in flight (K)."""
    budget: Budget = Budget()
    """Limits of the run."""
    device: DeviceChoice = DeviceChoice.AUTO
    """Device candidates run on."""
    language: KernelLanguage = KernelLanguage.TRITON
    """Kernel language asked of the experts."""
    experts: tuple[ExpertRef, ...] = (ExpertRef(name="template"),)
    """Experts the islands may call."""
    migration: MigrationPolicy = MigrationPolicy()
    """Migration between islands."""
    ablations: Ablations = Ablations()
    """Mechanisms turned off for this run (all on by default)."""
    target_sol_fraction: float = Field(default=0.9, gt=0, le=1)
    """Stop once the best candidate reaches this fraction of the speed-of-light bound."""
    eval_timeout_s: float = Field(default=180.0, gt=0)
    """Bound on one candidate's whole evaluation."""
    seed: int = 0
    """Seed of every random choice of the run's policies."""
    torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID
    """Which PyTorch operations a candidate may leave to PyTorch: none, or the reference's own."""
    precision: PrecisionMode = PrecisionMode.REFERENCE
    """The standard outputs are held to against float64: the reference's own at PyTorch's defaults
    (precision parity, TF32 where cuDNN convolutions run it), or ``exact`` (IEEE float32)."""
    created_at: float = Field(default_factory=now)
    """When the run's clock started (seconds since the epoch): ``kfoundry run``'s process start, so
    the wall budget counts what its user times."""

    # -- the run's limits: the one place that computes them --------------------------------

    def island_names(self) -> tuple[str, ...]:
        """The run's islands: ``i0`` … ``i<islands-1>``."""
        return tuple(f"i{i}" for i in range(self.islands))

    def island_index(self, island: str) -> int:
        """The position of ``island`` among the run's islands; a clear error for any other name."""
        names = self.island_names()
        if island not in names:
            raise ValueError(f"island {island!r} is not one of run {self.run_id}'s islands ({', '.join(names)})")
        return names.index(island)

    @property
    def deadline(self) -> float | None:
        """When the run's wall-clock budget ends (seconds since the epoch), for every actor alike;
        ``None`` without one."""
        wall = self.budget.wall_s
        return None if wall is None else self.created_at + wall

    def past_deadline(self, now: float) -> bool:
        """Whether ``now`` (seconds since the epoch) is at or past the deadline."""
        deadline = self.deadline
        return deadline is not None and now >= deadline

    def island_limits(self, island: str) -> IslandLimits:
        """``island``'s share of the run's budget (see :func:`split_evenly`)."""
        index = self.island_index(island)
        budget = self.budget

        def share(total: int | None) -> int | None:
            return None if total is None else split_evenly(total, self.islands)[index]

        return IslandLimits(candidates=share(budget.candidates), tokens=share(budget.tokens), deadline=self.deadline)


class IslandLimits(Model):
    """One island's share of its run's limits (computed by ``RunSpec.island_limits``)."""

    candidates: int | None
    """Its fair share of the candidate budget (the run's quota, ``actors.runtime.quota``, stays shared:
    an island may issue more when others issue fewer); ``None``: no candidate budget."""
    tokens: int | None
    """LLM tokens this island may spend; ``None``: no token budget."""
    deadline: float | None
    """The run's deadline (seconds since the epoch): islands run side by side, so each has all of it."""


def split_evenly(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` whole shares, the one rounding rule of a run's limits: every
    share is ``total // parts``, and the first ``total % parts`` get one more. The shares sum to
    ``total``, differ by at most one, and none is 0 when ``total >= parts``."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))
