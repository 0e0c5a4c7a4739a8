"""One island's requests: for each plan of its brain, experiences from the curator and proposals
from an expert, published as candidates within the run's candidate quota.

Reads:  ``kf.exp.query`` (``ExperienceQuery`` → ``ExperienceHits``) and
        ``kf.expert.<name>.generate`` (``GenerateRequest`` → ``GenerateReply``) by request.
Writes: ``kf.<run>.cand.<island>.<candidate>`` (``Candidate``) into the run stream.

The island actor (``actors.kinds.island``) decides when to ask; this module only asks and tells
the brain what each request put in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from typing import Any

from actors.evolution.brain import IslandBrain
from actors.evolution.plans import ParentSource, RequestPlan
from actors.runtime.bus import Bus
from actors.runtime.errors import BusError, RemoteError
from actors.runtime.latency import EXPERT_REPLY_SECONDS, ReplyOutcome
from actors.runtime.logs import bound
from actors.runtime.quota import CandidateQuota
from schemas import (
    Candidate,
    Decline,
    DeclineReason,
    ExperienceHit,
    ExperienceHits,
    ExperienceQuery,
    GenerateReply,
    RunSpec,
    TaskSignature,
    subjects,
)

SENT_KEPT = 4096
"""Published candidates an island keeps for their feedback: far more than it keeps in flight."""
PUBLISH_WAIT_S = 30.0
"""How long a candidate's publish is tried again when the stream does not acknowledge it (the
server that led the run's stream died: its replicas elect a new leader in seconds). The same
``msg_id`` again is stored once."""
FRESH_ORDER_WAIT_S = 1.0
"""Longest a fresh start's reply waits for the island's earlier fresh starts to be published: an
expert lists its starting points best first (the template expert: its default for the traced
shapes first), and the evaluator takes candidates in the order they arrive. On an H200
(KernelBench L1-57, 2026-12-02) the replies to four concurrent fresh starts arrived in another
order, and a mutation at 0.19x of eager was evaluated 1.8 s before the default at 1.3x."""


def decline_reason(reply: GenerateReply | None, published: int, asked: int) -> str | None:
    """Why a request put no candidate in flight (``None``: it did, or the candidate budget, not
    the expert, cut it short)."""
    if published:
        return None
    if reply is None:
        return "unavailable"
    if reply.decline is not None:
        return reply.decline.reason.value
    return None if reply.proposals[:asked] else "no_proposal"


class ExpertRequests:
    """Asks for one island's plans (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        spec: RunSpec,
        brain: IslandBrain,
        quota: CandidateQuota,
        lock: asyncio.Lock,
        island: str,
        llm_experts: set[str],
        timeouts: dict[str, float],
        retrieve_k: int,
        log: Any,
    ) -> None:
        self.bus, self.spec, self.brain, self.quota, self.lock = bus, spec, brain, quota, lock
        self.island = island
        self.llm_experts = llm_experts
        """Experts that are LLMs: their requests carry a meta-prompt section."""
        self.timeouts = timeouts
        """Seconds to wait for each expert's reply."""
        self.retrieve_k = retrieve_k
        self.log = log
        self.published = 0
        """Candidates this island published."""
        self._stripped: tuple[tuple[ExperienceHit, ...], tuple[ExperienceHit, ...]] | None = None
        self.sent: OrderedDict[str, Candidate] = OrderedDict()
        """The candidates published and not yet answered by a feedback (the newest
        ``SENT_KEPT`` at most): feedback names its candidate, and the island has it here."""
        self.last_decline: Decline | None = None
        self.answered = False
        """Whether any expert has answered this island (proposals or a decline)."""
        """The last decline an expert answered with (shown in the island's status)."""
        self.duplicates = 0
        """Proposals not published: the island had the same kernel already."""
        self._fresh: list[asyncio.Event] = []
        """One per fresh start being asked, in the order asked (its starting point's): set once
        its candidates are published or it has ended."""

    @property
    def signature(self) -> TaskSignature:
        return self.spec.task.signature or TaskSignature()

    async def retrieve(self, plan: RequestPlan) -> tuple[ExperienceHit, ...]:
        """Experiences for a plan (cached per diagnosis category by the brain's ``retrieved``)."""
        if self.spec.ablations.no_experience:
            return ()
        key = plan.diagnosis.category.value if plan.diagnosis else ""
        cached = self.brain.retrieved.get(key, time.monotonic())
        if cached is not None:
            return cached
        query = ExperienceQuery(
            signature=self.signature,
            diagnosis=plan.diagnosis.category if plan.diagnosis else None,
            text=plan.diagnosis.summary if plan.diagnosis else "first kernel for this task",
            # A fresh start looks wider: the expert takes the best configuration among the hits.
            k=self.retrieve_k if plan.parent is not None else 2 * self.retrieve_k,
        )
        try:
            hits = await self.bus.request(subjects.EXPERIENCE_QUERY, query, ExperienceHits, timeout=5.0)
        except BusError as exc:
            self.log.warning("no experiences retrieved", error=str(exc))
            return ()
        self.brain.retrieved.put(key, hits.hits, time.monotonic())
        return hits.hits

    async def ask(self, plan: RequestPlan) -> int:
        """Ask ``plan``'s expert and publish what it proposes; returns the candidates published.
        Whatever happens (a decline, an error, a cancel during drain), the brain learns how many
        candidates the plan really put in flight."""
        published = 0
        reply: GenerateReply | None = None
        self.brain.ledger.planning += plan.n
        earlier, mine = self._fresh_turn(plan)
        try:
            with bound(island=self.island, plan=plan.plan_id, expert=plan.expert):
                hits = await self.retrieve(plan)
                reply = await self._generate(plan, hits)
                if earlier:
                    await self._after(earlier)
                ids = tuple(h.experience.experience_id for h in hits)
                for place, proposal in enumerate(reply.proposals[: plan.n] if reply is not None else ()):
                    if not self.brain.claim_kernel(proposal.fingerprint):
                        # the same kernel again (a mutation that landed on a configuration the
                        # island has, or a migrant's): evaluating it twice would only re-time it
                        self.duplicates += 1
                        self.brain.credit.usage_of(plan.expert).duplicates += 1
                        self.log.info("duplicate proposal skipped", strategy=proposal.strategy)
                        continue
                    if not await self.quota.take():
                        self.brain.forget_kernel(proposal.fingerprint)
                        break  # the run's candidate budget is spent: nothing more is issued
                    assert reply is not None
                    cand = plan.candidate(self.spec, proposal, expert=reply.expert, experience_ids=ids, place=place)
                    try:
                        await self._publish(cand)
                    except BusError:
                        self.brain.forget_kernel(proposal.fingerprint)
                        raise
                    published += 1
                    self.brain.ledger.published(cand.candidate_id, time.monotonic())
                    self.sent[cand.candidate_id] = cand
                    if len(self.sent) > SENT_KEPT:
                        self.sent.popitem(last=False)  # never answered (lost): read from the stream if it is
                    self.log.info(
                        "proposal",
                        candidate=cand.candidate_id,
                        parent=cand.parent_id,
                        expert=cand.expert,
                        strategy=proposal.strategy,
                        experiences=len(ids),
                    )
        finally:
            if mine is not None:
                mine.set()
                self._fresh.remove(mine)
            self.published += published
            async with self.lock:
                if reply is not None:
                    self.brain.record_tokens(reply.tokens.total)
                self.brain.on_reply(plan, published, decline=decline_reason(reply, published, plan.n))
                self.brain.ledger.planning -= plan.n
        return published

    def _fresh_turn(self, plan: RequestPlan) -> tuple[list[asyncio.Event], asyncio.Event | None]:
        """For a fresh start: the island's fresh starts still being asked (asked before it, so
        earlier starting points) and its own marker; nothing for any other plan."""
        if plan.source is not ParentSource.FRESH:
            return [], None
        earlier = list(self._fresh)
        mine = asyncio.Event()
        self._fresh.append(mine)
        return earlier, mine

    async def _after(self, earlier: list[asyncio.Event]) -> None:
        """Wait until the earlier fresh starts are published, :data:`FRESH_ORDER_WAIT_S` at most
        (a slow expert holds the others back no longer)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FRESH_ORDER_WAIT_S):
                for event in earlier:
                    await event.wait()

    async def _publish(self, cand: Candidate) -> None:
        """Publish ``cand`` into the run's stream, tried again for :data:`PUBLISH_WAIT_S` while the
        stream does not acknowledge it; raises :class:`BusError` after."""
        deadline = time.monotonic() + PUBLISH_WAIT_S
        while True:
            try:
                subject = subjects.candidates(self.spec.run_id, self.island, cand.candidate_id)
                await self.bus.publish_durable(subject, cand, msg_id=cand.candidate_id)
                return
            except BusError as exc:
                if time.monotonic() >= deadline:
                    raise
                self.log.warning("candidate not acknowledged, again", candidate=cand.candidate_id, error=str(exc))
                await asyncio.sleep(1.0)

    def _params_only(self, hits: tuple[ExperienceHit, ...]) -> tuple[ExperienceHit, ...]:
        """:func:`params_only` of ``hits``, once per retrieval (the brain hands out the same
        retrieved tuple until it expires)."""
        if self._stripped is None or self._stripped[0] is not hits:
            self._stripped = (hits, params_only(hits))
        return self._stripped[1]

    async def _generate(self, plan: RequestPlan, hits: tuple[ExperienceHit, ...]) -> GenerateReply | None:
        section = None
        if plan.expert in self.llm_experts:
            async with self.lock:
                section = self.brain.prompts.section_for(plan.role)
        request = plan.request(
            self.spec,
            experiences=hits if plan.expert in self.llm_experts else self._params_only(hits),
            meta_prompt=section.text if section is not None else "",
            meta_prompt_section=section.section_id if section is not None else None,
            token_budget=self.brain.tokens_left(),
            avoid=self.brain.kernels_to_avoid(),
        )
        asked = time.perf_counter()
        reply: GenerateReply | None = None
        try:
            reply = await self.bus.request(
                subjects.expert_generate(plan.expert),
                request,
                GenerateReply,
                timeout=self.timeouts.get(plan.expert, 120.0),
            )
        except RemoteError as exc:
            # The expert answered, with an error (its reply past the server's max_payload, say):
            # a decline that names it, not a request left unanswered ("give the run more time").
            self.log.warning("expert answered with an error", error=str(exc))
            reason = DeclineReason.ENDPOINT_ERROR
            decline = Decline(reason=reason, detail=f"error {exc.code}: {exc.description}"[:500])
            reply = GenerateReply(request_id=request.request_id, expert=plan.expert, decline=decline)
        except BusError as exc:
            self.log.warning("expert unavailable", error=str(exc))
        self.answered = self.answered or reply is not None
        answer = (
            ReplyOutcome.UNAVAILABLE
            if reply is None
            else ReplyOutcome.DECLINE
            if reply.decline is not None
            else ReplyOutcome.PROPOSALS
        )
        EXPERT_REPLY_SECONDS.labels(self.spec.run_id, plan.expert, answer.value).observe(time.perf_counter() - asked)
        if reply is not None and reply.decline is not None:
            self.log.info("expert declined", reason=str(reply.decline.reason), detail=reply.decline.detail)
            self.last_decline = reply.decline
        return reply


def params_only(hits: tuple[ExperienceHit, ...]) -> tuple[ExperienceHit, ...]:
    """``hits`` without their source excerpts, for experts that read only an experience's outcome and
    parameters (the template expert): the excerpts were nine tenths of such a request's bytes."""
    return tuple(
        hit.model_copy(update={"experience": hit.experience.model_copy(update={"source_excerpt": ""})})
        if hit.experience.source_excerpt
        else hit
        for hit in hits
    )
