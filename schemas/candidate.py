"""Generation: requests to experts, their replies, and the candidates islands publish."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from schemas.base import Message, Model, Token, new_id, now
from schemas.diagnosis import Diagnosis
from schemas.enums import DeclineReason, ExpertKind, KernelLanguage, PrecisionMode, TorchOpsPolicy
from schemas.evaluation import EvalResult
from schemas.experience import ExperienceHit
from schemas.task import Task, source_fingerprint

ParamValue = int | float | str | bool
"""A template or tuning parameter value."""

AVOID_KEPT = 512
"""Most fingerprints a request names for its expert to avoid (the island's newest kernels)."""


class Proposal(Model):
    """One candidate source proposed by an expert."""

    source: str = Field(min_length=1)
    """Complete, standalone Python source defining ``ModelNew`` (KernelBench format)."""
    language: KernelLanguage
    """Language of its kernels."""
    strategy: str = ""
    """Role, template or mutation operator that produced it."""
    description: str = ""
    """What the proposal changes relative to its parent, in one or two sentences."""
    params: dict[str, ParamValue] = Field(default_factory=dict)
    """Template or tuning parameters (tile sizes, warps, stages, fusion), if any."""

    @property
    def fingerprint(self) -> str:
        """:func:`source_fingerprint` of the source."""
        return source_fingerprint(self.source)


class TokenUsage(Model):
    """LLM tokens spent on one request."""

    prompt: int = Field(default=0, ge=0)
    """Prompt tokens."""
    completion: int = Field(default=0, ge=0)
    """Completion tokens."""

    @property
    def total(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt + self.completion


class Decline(Model):
    """A typed refusal to produce candidates."""

    reason: DeclineReason
    """Why no candidate was produced."""
    detail: str = ""
    """Plain-language detail (never a key or a raw secret)."""
    op: str | None = None
    """The reference's op the expert does not cover, where one stopped it (``--torch-ops
    reference`` may leave such an op to PyTorch); ``None`` for any other reason (an input dtype,
    the outputs' form)."""


class GenerateRequest(Message):
    """What an island asks of an expert."""

    type: Literal["generate_request"] = "generate_request"
    """Wire name of this message type."""
    request_id: str = Field(default_factory=new_id)
    """Unique id of the request."""
    run_id: str
    """Run the request belongs to."""
    island: str
    """Island asking."""
    task: Task
    """The reference to write kernels for."""
    language: KernelLanguage = KernelLanguage.TRITON
    """Kernel language wanted."""
    parent: Candidate | None = None
    """Candidate to improve or repair; ``None`` asks for a fresh start."""
    parent_result: EvalResult | None = None
    """The parent's evaluation, with its evidence."""
    diagnosis: Diagnosis | None = None
    """The parent's diagnosis."""
    experiences: tuple[ExperienceHit, ...] = ()
    """Retrieved experiences relevant to the task and diagnosis."""
    instructions: str = ""
    """Extra instructions from the island (e.g. the role to play)."""
    meta_prompt: str = ""
    """Prompt section evolved by the run (LLM experts include it verbatim)."""
    meta_prompt_section: str | None = None
    """Id of the section in ``meta_prompt``: the expert tags its proposals' strategy with it, so
    the island credits the section with their outcomes; ``None``: no section (or an older island:
    the expert then derives the id from the text)."""
    n: int = Field(default=1, ge=1, le=64)
    """Candidates wanted."""
    seed: int = 0
    """Seed for the expert's random choices (template mutation, sampling seed)."""
    avoid: tuple[str, ...] = Field(default=(), max_length=AVOID_KEPT)
    """Fingerprints (:func:`source_fingerprint`) of kernels the island already has, newest last:
    an expert should not propose them again (the island does not publish them twice)."""
    start: int = Field(default=0, ge=0)
    """For a fresh start (no parent): which of the expert's starting points to lead with. An island
    asks ``i, i + islands, i + 2 islands, …`` (``i`` its index), so that its concurrent requests
    and the other islands get different first kernels; an expert with one way to start ignores it."""
    token_budget: int | None = Field(default=None, ge=0)
    """Tokens the expert may spend on this request; ``None`` is the expert's own limit."""
    torch_ops: TorchOpsPolicy = TorchOpsPolicy.FORBID
    """The run's policy: whether a candidate may leave some of the reference's own operations to PyTorch."""
    precision: PrecisionMode = PrecisionMode.REFERENCE
    """The run's precision standard: under ``reference`` a candidate may compute as the reference
    does at PyTorch's defaults (TF32 convolutions where cuDNN runs them so)."""


class GenerateReply(Message):
    """An expert's answer: candidate sources, or a typed decline."""

    type: Literal["generate_reply"] = "generate_reply"
    """Wire name of this message type."""
    request_id: str
    """The request answered."""
    expert: str
    """Name of the expert that answered."""
    expert_instance: str = ""
    """Id of the expert actor instance that answered."""
    proposals: tuple[Proposal, ...] = ()
    """Candidate sources, best guess first."""
    decline: Decline | None = None
    """Set when no proposal could be made."""
    tokens: TokenUsage = TokenUsage()
    """Tokens spent."""
    elapsed_s: float = Field(default=0.0, ge=0)
    """Time spent answering."""

    @model_validator(mode="after")
    def _proposals_or_decline(self) -> GenerateReply:
        if not self.proposals and self.decline is None:
            raise ValueError("a reply carries proposals or a decline")
        return self


class Candidate(Message):
    """A candidate kernel, published by an island for evaluation."""

    type: Literal["candidate"] = "candidate"
    """Wire name of this message type."""
    candidate_id: str = Field(default_factory=new_id)
    """Unique id (also the JetStream dedup id of its publish)."""
    run_id: str
    """Run it belongs to."""
    island: str
    """Island that produced it."""
    task_id: str
    """Task it answers."""
    parent_id: str | None = None
    """Candidate it was derived from."""
    lineage: tuple[str, ...] = ()
    """Ancestor ids, oldest first (kept across migration)."""
    generation: int = Field(default=0, ge=0)
    """Distance from a first-generation candidate."""
    expert: str
    """Expert that produced it."""
    proposal: Proposal
    """The source and how it was made."""
    experience_ids: tuple[str, ...] = ()
    """Experiences shown to the expert when it made this candidate."""
    diagnosis: Diagnosis | None = None
    """The parent's diagnosis this candidate answers."""
    rank: int | None = Field(default=None, ge=0)
    """Its turn among the run's candidates (0 first): an evaluator holding several that wait
    together runs the lowest rank first. Islands number their plans interleaved with the other
    islands' (so every island's first starting point goes before anyone's second), and a plan's
    candidates in the order its expert proposed them. ``None``: after every ranked one."""
    created_at: float = Field(default_factory=now)
    """When it was published."""


class ExpertConfig(Message):
    """Configuration of one expert, kept in the ``kf_experts`` KV bucket under its name."""

    type: Literal["expert_config"] = "expert_config"
    """Wire name of this message type."""
    name: Token
    """Service name; requests go to ``kf.expert.<name>.generate``."""
    kind: ExpertKind
    """Template (offline) or LLM."""
    role: str = "general"
    """Speciality: memory, fusion, tiling, algorithm, repair, general (LLM prompt role)."""
    language: KernelLanguage = KernelLanguage.TRITON
    """Default kernel language."""
    target_gpu: str | None = Field(default=None, min_length=1, max_length=128)
    """Template experts: the GPU their fresh starts are sized for (``H200``, ``NVIDIA H100 80GB
    HBM3``), where the evaluators run on another machine; ``None``: the device the run's verdicts
    name, until there is one this machine's."""
    base_url: str | None = None
    """OpenAI-compatible endpoint (LLM experts)."""
    model: str | None = None
    """Model name at that endpoint (LLM experts)."""
    api_key_env: str | None = None
    """Name of the environment variable that holds the key; the key itself is never stored."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """A key given directly (never serialised, never logged)."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    """Sampling temperature."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling."""
    max_tokens: int = Field(default=4096, ge=16)
    """Completion tokens per reply."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Per-call timeout."""
    max_retries: int = Field(default=3, ge=0, le=10)
    """Retries on 429, 5xx and timeouts, with exponential backoff."""
    concurrency: int = Field(default=4, ge=1, le=256)
    """Concurrent calls to the endpoint from one instance."""
    token_budget: int | None = Field(default=None, ge=1)
    """Total tokens this expert may spend in a run; ``None`` is unlimited."""
    price_in_per_mtok: float | None = Field(default=None, ge=0)
    """What a million prompt tokens cost (in the operator's currency, USD by convention): where
    set, with ``price_out_per_mtok``, the ``kfoundry_llm_cost`` metric adds up the calls' cost."""
    price_out_per_mtok: float | None = Field(default=None, ge=0)
    """What a million completion tokens cost."""
    revision: int = Field(default=0, ge=0)
    """Bumped on every change; replies and logs name the revision in force."""
    created_at: float = Field(default_factory=now)
    """When this revision was written."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {value!r}")
        return value

    @model_validator(mode="after")
    def _llm_needs_endpoint(self) -> ExpertConfig:
        if self.kind is ExpertKind.LLM and (not self.base_url or not self.model):
            raise ValueError(f"LLM expert {self.name!r} needs base_url and model")
        return self


GenerateRequest.model_rebuild()
