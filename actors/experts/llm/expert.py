"""The LLM expert: answers a ``GenerateRequest`` through any OpenAI-compatible endpoint.

It satisfies :class:`actors.experts.base.Expert`. A request becomes chat messages
(:mod:`~actors.llm.prompts`), one call asks for ``request.n`` choices (endpoints that
ignore ``n`` get one extra call per missing candidate), and every choice's text is searched for
complete ``ModelNew`` sources (:mod:`~actors.experts.llm.extract`). Each source becomes a
``Proposal`` whose strategy names the role and the meta-prompt section
(``<role>/<section id>``). Tokens are accounted from ``usage`` against ``config.token_budget``
(whole life of the expert) and ``request.token_budget`` (this request); a call's completion
tokens are capped so that neither budget can be overrun, and a call that cannot fit is not made
(decline ``budget_exhausted``). Endpoint trouble never raises: it becomes a typed ``Decline``
(``timeout``, ``endpoint_error``, ``refused``, ``no_code``). The API key never reaches a reply
or a log line: everything the endpoint sends back is redacted before use.

``reconfigure`` swaps the configuration live (from a KV watch): calls in flight finish on the old
configuration and client, which is closed once they are done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from actors.evolution.metaprompt import section_id_for_text, strategy_tag
from actors.experts.llm.extract import ExtractOutcome, extract
from actors.llm.client import ChatClient, ChatResult, RetryPolicy, estimate_tokens
from actors.llm.errors import BudgetExhausted, EndpointError, EndpointTimeout, UnknownRole
from actors.llm.prompts import ROLES, build_messages
from actors.llm.redact import shorten
from actors.runtime.errors import ConfigError
from schemas import (
    Decline,
    DeclineReason,
    ExpertConfig,
    ExpertKind,
    GenerateReply,
    GenerateRequest,
    Proposal,
    Role,
    TokenUsage,
)

log = structlog.get_logger(__name__)

MIN_COMPLETION_TOKENS = 64
"""A call whose completion would have to be shorter than this is not made."""


@dataclass
class _Binding:
    """A configuration and the client built for it, with the calls using them."""

    config: ExpertConfig
    client: ChatClient
    active: int = 0
    retired: bool = False


@dataclass
class _Outcome:
    """What the calls of one request produced."""

    sources: list[list[tuple[str, str]]] = field(default_factory=list)
    """Per choice: (source, description)."""
    refusals: list[str] = field(default_factory=list)
    no_code: list[str] = field(default_factory=list)
    usage: TokenUsage = field(default_factory=TokenUsage)
    reserved: int = 0
    """Tokens reserved by this request's calls in flight."""


class LLMExpert:
    """An expert backed by a chat model at an OpenAI-compatible endpoint."""

    def __init__(
        self,
        config: ExpertConfig,
        *,
        environ: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        seed: int = 0,
        instance_id: str = "",
    ) -> None:
        self._environ = environ
        self._retry = retry
        self._seed = seed
        self._bindings_made = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: list[_Binding] = []
        self.name = config.name
        self.instance_id = instance_id
        self.tokens_used = 0
        """Tokens spent over the expert's life (for budget accounting)."""
        self._reserved = 0
        self._binding = self._bind(config)

    @property
    def config(self) -> ExpertConfig:
        """The configuration in force for new calls."""
        return self._binding.config

    @property
    def client(self) -> ChatClient:
        """The chat client new calls use."""
        return self._binding.client

    def _bind(self, config: ExpertConfig) -> _Binding:
        if config.kind is not ExpertKind.LLM:
            raise ConfigError(f"expert {config.name!r} has kind {config.kind.value!r}, not 'llm'")
        if config.role not in ROLES:
            raise UnknownRole(config.role, tuple(ROLES))
        client = ChatClient.from_config(
            config, environ=self._environ, retry=self._retry, seed=self._seed + self._bindings_made
        )
        self._bindings_made += 1
        return _Binding(config=config, client=client)

    def reconfigure(self, config: ExpertConfig) -> None:
        """Use ``config`` for new calls; calls in flight finish on the old one."""
        if config.name != self.name:
            raise ConfigError(f"expert {self.name!r} cannot be reconfigured as {config.name!r}")
        new = self._bind(config)
        old, self._binding = self._binding, new
        old.retired = True
        if old.active == 0:
            self._close_later(old)
        log.info(
            "llm.reconfigured",
            expert=self.name,
            revision=config.revision,
            model=config.model,
            role=config.role,
        )

    def _close_later(self, binding: _Binding) -> None:
        try:
            task = asyncio.get_running_loop().create_task(binding.client.aclose())
        except RuntimeError:  # no running loop: closed by aclose()
            self._retired.append(binding)
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        """Proposals for the request, or a typed decline (never raises for endpoint trouble)."""
        started = time.perf_counter()
        binding = self._binding
        binding.active += 1
        try:
            with structlog.contextvars.bound_contextvars(
                expert=self.name,
                revision=binding.config.revision,
                request_id=request.request_id,
                run_id=request.run_id,
                island=request.island,
            ):
                return await self._generate(binding, request, started)
        finally:
            binding.active -= 1
            if binding.retired and binding.active == 0:
                await binding.client.aclose()

    async def _generate(self, binding: _Binding, request: GenerateRequest, started: float) -> GenerateReply:
        cfg = binding.config
        section_id = request.meta_prompt_section or (
            section_id_for_text(request.meta_prompt) if request.meta_prompt.strip() else None
        )
        role = Role(cfg.role)  # checked against the known roles when the binding was made
        strategy = strategy_tag(role, section_id)
        messages = build_messages(request, cfg, role)
        outcome = _Outcome()
        decline: Decline | None = None
        try:
            result = await self._call(binding, request, messages, outcome, n=request.n, seed=request.seed)
            missing = request.n - len(result.choices)
            if missing > 0 and len(result.choices) == 1:  # the endpoint ignores n
                calls = [
                    self._call(binding, request, messages, outcome, n=1, seed=request.seed + i)
                    for i in range(1, missing + 1)
                ]
                for extra in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(extra, BaseException) and not isinstance(extra, EndpointError | BudgetExhausted):
                        raise extra
        except BudgetExhausted as exc:
            decline = Decline(reason=DeclineReason.BUDGET_EXHAUSTED, detail=str(exc))
        except EndpointTimeout as exc:
            decline = Decline(reason=DeclineReason.TIMEOUT, detail=binding.client.redact(str(exc)))
        except EndpointError as exc:
            decline = Decline(reason=DeclineReason.ENDPOINT_ERROR, detail=binding.client.redact(str(exc)))
        proposals = self._proposals(outcome, request, cfg, strategy)
        if proposals:
            decline = None
        elif decline is None:
            decline = self._no_proposal_decline(outcome)
        reply = GenerateReply(
            request_id=request.request_id,
            expert=self.name,
            expert_instance=self.instance_id,
            proposals=tuple(proposals),
            decline=decline,
            tokens=outcome.usage,
            elapsed_s=time.perf_counter() - started,
        )
        log.info(
            "llm.generate",
            proposals=len(proposals),
            decline=decline.reason.value if decline else None,
            tokens=outcome.usage.total,
            tokens_used=self.tokens_used,
            strategy=strategy,
            elapsed_s=round(reply.elapsed_s, 3),
        )
        return reply

    async def _call(
        self,
        binding: _Binding,
        request: GenerateRequest,
        messages: list[dict[str, str]],
        outcome: _Outcome,
        *,
        n: int,
        seed: int,
    ) -> ChatResult:
        """One chat call within both budgets; its choices and usage go into ``outcome``."""
        cfg = binding.config
        prompt_est = sum(estimate_tokens(m["content"]) for m in messages)
        max_tokens = cfg.max_tokens
        scopes: list[tuple[str, int]] = []
        if cfg.token_budget is not None:
            scopes.append(("expert", cfg.token_budget - self.tokens_used - self._reserved))
        if request.token_budget is not None:
            scopes.append(("request", request.token_budget - outcome.usage.total - outcome.reserved))
        for scope, left in scopes:
            per_choice = (left - prompt_est) // n
            if per_choice < MIN_COMPLETION_TOKENS:
                raise BudgetExhausted(scope, max(0, left), prompt_est + n * MIN_COMPLETION_TOKENS)
            max_tokens = min(max_tokens, per_choice)
        reserved = prompt_est + n * max_tokens
        self._reserved += reserved
        outcome.reserved += reserved
        try:
            result = await binding.client.complete(messages, n=n, seed=seed, max_tokens=max_tokens)
        finally:
            self._reserved -= reserved
            outcome.reserved -= reserved
        self.tokens_used += result.usage.total
        outcome.usage = TokenUsage(
            prompt=outcome.usage.prompt + result.usage.prompt,
            completion=outcome.usage.completion + result.usage.completion,
        )
        for choice in result.choices:
            text = binding.client.redact(choice.text)
            refusal = binding.client.redact(choice.refusal) if choice.refusal else None
            found = extract(text, refusal=refusal, finish_reason=choice.finish_reason)
            if found.outcome is ExtractOutcome.CODE:
                outcome.sources.append([(s, found.description) for s in found.sources])
            elif found.outcome is ExtractOutcome.REFUSED:
                outcome.refusals.append(found.detail)
            else:
                outcome.no_code.append(found.detail)
        if not result.choices:
            outcome.no_code.append("the endpoint returned no choices")
        return result

    def _proposals(
        self, outcome: _Outcome, request: GenerateRequest, cfg: ExpertConfig, strategy: str
    ) -> list[Proposal]:
        """Up to ``request.n`` distinct proposals, taking each choice's first source first."""
        seen: set[str] = set()
        proposals: list[Proposal] = []
        depth = max((len(s) for s in outcome.sources), default=0)
        for rank in range(depth):
            for per_choice in outcome.sources:
                if rank >= len(per_choice) or len(proposals) >= request.n:
                    continue
                source, description = per_choice[rank]
                if source in seen:
                    continue
                seen.add(source)
                proposals.append(
                    Proposal(
                        source=source,
                        language=request.language,
                        strategy=strategy,
                        description=description or f"{cfg.role} rewrite by {cfg.model}",
                        params={"model": cfg.model or "", "config_revision": cfg.revision},
                    )
                )
        return proposals

    @staticmethod
    def _no_proposal_decline(outcome: _Outcome) -> Decline:
        if outcome.refusals and not outcome.no_code:
            return Decline(reason=DeclineReason.REFUSED, detail=shorten("; ".join(outcome.refusals), 400))
        details = "; ".join(dict.fromkeys(outcome.no_code + outcome.refusals))
        return Decline(reason=DeclineReason.NO_CODE, detail=shorten(details, 400))

    async def aclose(self) -> None:
        """Close every client this expert made; waits for pending closes."""
        for binding in (*self._retired, self._binding):
            await binding.client.aclose()
        self._retired.clear()
        if self._closing:
            await asyncio.gather(*self._closing)
