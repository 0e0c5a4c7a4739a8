"""Island actor: one line of search, steady state, reacting to each feedback as it arrives.

Reads:  ``kf.<run>.feedback.<island>`` (``Feedback``, naming a candidate this island published:
        kept since, or read back from the run stream after a restart) and
        ``kf.<run>.migrant.<island>`` (``Migration``) through this island's own durable consumers
        (nothing is lost across an island restart).
Writes: ``kf.<run>.elite.<island>`` (``EliteAnnouncement``) and ``kf.<run>.status.<island>``
        (``IslandStatus``) into the run stream; ``kf.exp.batch`` (``ExperienceBatch``: the
        ``Experience`` records and ``ExperienceOutcome``s its feedbacks teach, a batch every
        ``experience_linger_s``) into the experience stream; its brain to the
        ``kf_archives`` KV bucket and its meta-prompt pools to ``kf_prompts``, so the archive,
        the credit table, the history and the prompts survive a restart.

It keeps K candidates in flight: the requests to the curator and the experts, and the candidates
they yield, are ``actors.kinds.island_requests``. Every decision and all bookkeeping (archive, parents,
credit, stagnation, budgets, candidates in flight, retrieval cache, meta-prompts, experience
records) is the brain's: ``actors.evolution.brain.IslandBrain``. This actor moves messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from actors.evolution.brain import IslandBrain
from actors.evolution.credit import ExpertProfile
from actors.evolution.ledger import experience_of
from actors.evolution.plans import IslandConfig, RequestPlan
from actors.kinds.island_experience import ExperienceWriter
from actors.kinds.island_requests import ExpertRequests
from actors.runtime.base import Actor
from actors.runtime.bus import ConsumerSpec, Delivery
from actors.runtime.candidates import CandidateReader
from actors.runtime.errors import BusError, ConfigError
from actors.runtime.kv import get_expert_config, get_run, load_text, save_text
from actors.runtime.logs import bound
from actors.runtime.quota import CandidateQuota
from schemas import (
    ActorKind,
    EliteAnnouncement,
    Experience,
    ExpertKind,
    Feedback,
    Message,
    Migration,
    Role,
    RunSpec,
    StopReason,
    subjects,
)

EXPIRE_EVERY_S = 0.5
"""How often the generation loop looks for candidates whose feedback is overdue (by minutes)."""
UNANSWERED_GIVE_UP_S = 60.0
"""An island whose experts never answered (none serves yet: an expert actor still starting, or
its server away) gives up after this long, not after ``give_up_after`` unanswered requests (about
15 s): declines end a hopeless run that fast, an expert that comes up late does not."""


class IslandActor(Actor):
    """One island of a run (see the module docstring)."""

    kind = ActorKind.ISLAND
    description = "An island of the search: MAP-Elites archive, K candidates in flight"

    def __init__(
        self,
        *,
        nats_url: str,
        run_id: str,
        island: str,
        actor_id: str | None = None,
        retrieve_k: int = 4,
        save_every_s: float = 1.0,
        give_up_after: int = 8,
        per_request: int = 1,
        status_every_s: float = 0.5,
        retrieve_ttl_s: float = 5.0,
        drain_wait_s: float = 2.0,
        feedback_concurrency: int = 64,
        experience_linger_s: float = 0.05,
        version: str | None = None,
    ) -> None:
        super().__init__(nats_url=nats_url, run_id=run_id, island=island, actor_id=actor_id, version=version)
        self.name = island
        self.retrieve_k = retrieve_k
        self.save_every_s = save_every_s
        self.give_up_after = give_up_after
        self.per_request = per_request
        self.status_every_s = status_every_s
        self.retrieve_ttl_s = retrieve_ttl_s
        self.drain_wait_s = drain_wait_s
        self.feedback_concurrency = feedback_concurrency
        """Feedbacks handled at once: each waits up to ``experience_linger_s`` for its experience
        batch to be stored before it is acknowledged, so this bounds the feedback rate (64 per
        50 ms) as well as the overlap of the publishing after the brain's update."""
        self.experience_linger_s = experience_linger_s
        self._experience: ExperienceWriter | None = None
        self._reader: CandidateReader | None = None
        self._last_status = 0.0
        self._spec: RunSpec | None = None
        self._quota: CandidateQuota | None = None
        self._brain: IslandBrain | None = None
        self._llm: set[str] = set()
        self._timeouts: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._requests: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._generating = True  # cleared on drain: the loop ends even if its cancel is lost (3.11 wait_for)
        self._last_save = 0.0
        self._expired_at = 0.0
        self._save_gap_s = save_every_s
        """Seconds between saves: ``save_every_s``, longer when a save is slow (see ``_save``)."""
        self._said_stagnating = False
        self._stopped_announced = False
        self._empty_streak = 0
        self._gave_up = False
        self._since = time.monotonic()
        self._expert_requests: ExpertRequests | None = None

    @property
    def spec(self) -> RunSpec:
        if self._spec is None:
            raise RuntimeError("island used before setup")
        return self._spec

    @property
    def brain(self) -> IslandBrain:
        if self._brain is None:
            raise RuntimeError("island used before setup")
        return self._brain

    @property
    def quota(self) -> CandidateQuota:
        if self._quota is None:
            raise RuntimeError("island used before setup")
        return self._quota

    async def setup(self) -> None:
        self._spec = await get_run(self.bus, self.rid)
        expected = self.spec.island_names()
        if self.name not in expected:
            raise ConfigError(
                f"island {self.name!r} is not one of run {self.rid}'s islands ({', '.join(expected)}); "
                f"start those, or give `kfoundry run` a larger --islands"
            )
        self._quota = CandidateQuota(self.bus, self.rid, self.spec.budget.candidates, islands=self.spec.islands)
        profiles = []
        for ref in self.spec.experts:
            config = await get_expert_config(self.bus, ref.name)
            if config is not None and config.kind is ExpertKind.LLM:
                self._llm.add(ref.name)
            self._timeouts[ref.name] = (config.timeout_s * (config.max_retries + 1) + 10) if config else 120.0
            profiles.append(
                ExpertProfile.from_config(config, ref.weight)
                if config is not None
                else ExpertProfile(name=ref.name, role=Role.TEMPLATE, weight=ref.weight)
            )
        saved = await load_text(self.bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(self.rid, self.name))
        if saved is not None:
            self._brain = IslandBrain.from_json(saved, self.spec)
            self.log.info("island restored", evaluated=self.brain.evaluated, archive=len(self.brain.archive))
        else:
            island_config = IslandConfig(n_per_request=self.per_request)
            self._brain = IslandBrain(self.name, self.spec, profiles, seed=self.spec.seed, config=island_config)
        self._experience = ExperienceWriter(self.bus, linger_s=self.experience_linger_s)
        self._reader = CandidateReader(self.bus, self.rid)
        self._expert_requests = ExpertRequests(
            bus=self.bus,
            spec=self.spec,
            brain=self.brain,
            quota=self.quota,
            lock=self._lock,
            island=self.name,
            llm_experts=self._llm,
            timeouts=self._timeouts,
            retrieve_k=self.retrieve_k,
            log=self.log,
        )
        self.brain.ledger.last_feedback = time.monotonic()
        self.brain.retrieved.ttl_s = self.retrieve_ttl_s
        meta_roles = set() if self.spec.ablations.no_meta_prompt else {p.role for p in profiles if p.name in self._llm}
        for role in meta_roles:
            prompts = self.brain.prompts
            prompts.add(role, await load_text(self.bus, subjects.PROMPTS_BUCKET, prompts.key(role)))
        stream = subjects.run_stream(self.rid)
        await self.bus.consume(
            ConsumerSpec(
                stream=stream,
                durable=subjects.island_feedback_consumer(self.name),
                filter_subject=subjects.feedback(self.rid, self.name),
                ack_wait_s=60.0,
                max_deliver=5,
            ),
            Feedback,
            self.on_feedback,
            # The brain is updated under the lock in arrival order; what follows (elite, experience,
            # status) is publishing, which may overlap between feedbacks.
            concurrency=self.feedback_concurrency,
        )
        await self.bus.consume(
            ConsumerSpec(
                stream=stream,
                durable=subjects.island_migrant_consumer(self.name),
                filter_subject=subjects.migrants(self.rid, self.name),
                ack_wait_s=60.0,
                max_deliver=5,
            ),
            Migration,
            self.on_migration,
            concurrency=1,
        )
        await self._publish_status()  # announces the island to the controller and the migrator
        self._pump = asyncio.create_task(self._keep_in_flight())

    # -- generation ---------------------------------------------------------------------------

    async def _keep_in_flight(self) -> None:
        while self._generating:
            if self._empty_streak:
                # Experts declined or were unreachable: back off before asking again.
                await asyncio.sleep(min(0.25 * 2**self._empty_streak, 10.0))
                if (
                    self._empty_streak >= self.give_up_after
                    and self.brain.evaluated == 0
                    and not self._requests
                    and (self.expert_requests.answered or time.monotonic() - self._since >= UNANSWERED_GIVE_UP_S)
                ):
                    self._gave_up = True
            async with self._lock:
                now = time.monotonic()
                if now - self._expired_at >= EXPIRE_EVERY_S:  # overdue means minutes: no need to look on every wake
                    self._expired_at = now
                    if lost := self.brain.expire_lost(now):
                        self.log.warning("feedback overdue, slots released", candidates=lost)
                if self.quota.exhausted:
                    self.brain.stop(StopReason.CANDIDATES)
                stopped = self.brain.budget_exhausted(time.time())
                if stopped is None and self._gave_up:
                    stopped = StopReason.NO_PROGRESS
                plans: list[RequestPlan] = []
                while stopped is None and self._generating and self.brain.wants_request():
                    plans.append(self.brain.next_request())
            if stopped is not None and not self._stopped_announced:
                self._stopped_announced = True
                self.log.info("island stops generating", reason=str(stopped))
                await self._publish_status(stopped)
            for plan in plans:
                task = asyncio.create_task(self._request(plan))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()

    @property
    def expert_requests(self) -> ExpertRequests:
        if self._expert_requests is None:
            raise RuntimeError("island used before setup")
        return self._expert_requests

    @property
    def published(self) -> int:
        """Candidates this island published."""
        return self._expert_requests.published if self._expert_requests is not None else 0

    @property
    def duplicates(self) -> int:
        """Proposals this island did not publish: it had the same kernel already."""
        return self._expert_requests.duplicates if self._expert_requests is not None else 0

    async def _request(self, plan: RequestPlan) -> None:
        published = 0
        try:
            published = await self.expert_requests.ask(plan)
        except BusError as exc:  # the run's stream stayed away: this plan's candidates are not in flight
            self.log.error("proposals not published", plan=plan.plan_id, error=str(exc))
        finally:
            self._empty_streak = 0 if published else self._empty_streak + 1
            self._wake.set()

    # -- feedback and migrants ----------------------------------------------------------------

    async def _with_candidate(self, fb: Feedback) -> Feedback:
        """``fb`` with its candidate: the one this island published (kept since), or, for one it
        no longer has (published before a restart, or a seed), read from the run stream."""
        if fb.candidate is not None:
            self.expert_requests.sent.pop(fb.candidate.candidate_id, None)
            return fb
        cand = self.expert_requests.sent.pop(fb.candidate_id, None)
        if cand is None:
            assert self._reader is not None  # set up before the feedback consumer starts
            cand = await self._reader.read(self.name, fb.candidate_id)
        return fb.model_copy(update={"candidate": cand})

    async def on_feedback(self, fb: Feedback, delivery: Delivery) -> None:
        with bound(island=self.name, candidate=fb.candidate_id):
            fb = await self._with_candidate(fb)
            async with self._lock:
                parent = self.brain.parent_fitness(fb)
                outcome = self.brain.on_feedback(fb)
                self.brain.ledger.answered(fb.candidate_id, time.monotonic())
            if outcome.duplicate:
                return
            self._wake.set()  # a slot of K is free: the next request need not wait for the publishing below
            cid = fb.candidate_id
            publishing = [self._record_experience(fb, parent)]
            if outcome.elite is not None:
                publishing.append(
                    self._publish(
                        subjects.elites(self.rid, self.name),
                        EliteAnnouncement(run_id=self.rid, elite=outcome.elite, island_best=outcome.improved_best),
                        f"elite-{cid}",
                    )
                )
            if (
                outcome.improved_best
                or outcome.stagnating != self._said_stagnating
                or time.monotonic() - self._last_status >= self.status_every_s
            ):
                # A new best and a change of stagnation go out at once (the migrator acts on the
                # rising edge), beside the experience write that may wait for its batch; otherwise
                # at most one status per ``status_every_s``. Claimed here, before any await, so
                # that feedbacks handled beside this one do not announce the same change again.
                self._said_stagnating, self._last_status = outcome.stagnating, time.monotonic()
                publishing.append(self._publish_status())
            if len(publishing) == 1:
                await publishing[0]  # the usual case: no task to make
            else:
                await asyncio.gather(*publishing)
            await self._save()
            self.log.info(
                "feedback",
                status=str(fb.result.status),
                fitness=fb.result.fitness,
                diagnosis=str(fb.diagnosis.category),
                archive=str(outcome.add_status),
                best=outcome.improved_best,
            )
            self._wake.set()

    async def _record_experience(self, fb: Feedback, parent_fitness: float | None) -> None:
        record, outcome = experience_of(fb, self.expert_requests.signature, parent_fitness)
        assert self._experience is not None  # set up before the feedback consumer starts
        await self._experience.write((record, outcome) if outcome is not None else (record,))
        await self._credit_prompt(record)

    async def _publish(self, subject: str, message: Message, msg_id: str) -> None:
        await self.bus.publish_durable(subject, message, msg_id=msg_id)

    async def _credit_prompt(self, record: Experience) -> None:
        """Credit the meta-prompt section an LLM candidate was made with (co-evolution), and save
        its pool."""
        if record.expert not in self._llm:
            return
        async with self._lock:
            credited = self.brain.prompts.credit(record)
        if credited is not None:
            role, text = credited
            await save_text(self.bus, subjects.PROMPTS_BUCKET, self.brain.prompts.key(role), text)

    async def on_migration(self, migration: Migration, delivery: Delivery) -> None:
        if self.spec.ablations.no_migration:
            self.log.info("migrants refused: migration is off for this run", source=migration.source_island)
            return
        async with self._lock:
            accepted = self.brain.on_migrants(migration)
        self.log.info(
            "migrants received", source=migration.source_island, offered=len(migration.elites), accepted=accepted
        )
        await self._publish_status()
        await self._save(force=True)
        self._wake.set()

    # -- state --------------------------------------------------------------------------------

    async def _publish_status(self, stopped: StopReason | None = None) -> None:
        self._last_status = time.monotonic()
        status = self.brain.status()
        self._said_stagnating = status.stagnating
        stopped = stopped or (StopReason.NO_PROGRESS if self._gave_up else None)
        if stopped is not None and status.stopped is None:
            status = status.model_copy(update={"stopped": stopped})
        if self.expert_requests.last_decline is not None:
            status = status.model_copy(update={"last_decline": self.expert_requests.last_decline})
        await self.bus.publish_durable(
            subjects.island_status(self.rid, self.name),
            status,
            msg_id=f"status-{self.name}-{status.evaluated}-{status.archive_size}-{status.stopped or ''}-{status.at}",
        )

    async def _save(self, *, force: bool = False) -> None:
        """Save the brain at most every ``save_every_s`` (and always when forced). The state grows
        with the island's history, so when encoding it takes long the next saves are spaced out:
        encoding never takes more than about 1/20 of the island's time."""
        if not force and time.monotonic() - self._last_save < self._save_gap_s:
            return
        self._last_save = time.monotonic()  # concurrent feedbacks do not start a second save meanwhile
        async with self._lock:
            started = time.perf_counter()
            text = self.brain.to_json()
            encoding_s = time.perf_counter() - started
        await save_text(self.bus, subjects.ARCHIVE_BUCKET, subjects.archive_key(self.rid, self.name), text)
        self._last_save = time.monotonic()
        self._save_gap_s = max(self.save_every_s, 20.0 * encoding_s)

    def drain_timeout(self) -> float:
        return self.spec.eval_timeout_s + 60.0 if self._spec is not None else 600.0

    async def _cancel(self, tasks: list[asyncio.Task[None]], what: str) -> None:
        """Cancel tasks and wait (bounded) until they have finished; say so if some did not."""
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=10.0)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                self.log.warning("task failed while cancelled", what=what, error=str(task.exception())[:300])
        if pending:
            self.log.warning("tasks still running 10 s after cancel", what=what, count=len(pending))

    async def on_drain(self) -> None:
        """Stop asking for candidates; wait (bounded) for the feedback of those in flight."""
        self._generating = False
        self._wake.set()
        await self._cancel([self._pump] if self._pump is not None else [], "generation loop")
        await self._cancel(list(self._requests), "expert requests")
        await self.quota.give_back()
        # Feedback not yet here stays in this island's durable consumer (a successor gets it):
        # wait only briefly, so that a stop request is honoured within seconds.
        deadline = time.monotonic() + self.drain_wait_s
        while self.brain.in_flight > 0 and time.monotonic() < deadline and not self.run_ended:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._wake.wait()
        if self._experience is not None:
            await self._experience.flush()  # the feedbacks waiting for their batch need not linger
        await self._publish_status()
        await self._save(force=True)

    def extra_stats(self) -> dict[str, float | int | str | None]:
        if self._brain is None:
            return {}
        best = self.brain.archive.best()
        return {
            "evaluated": self.brain.evaluated,
            "in_flight": self.brain.in_flight,
            "archive": len(self.brain.archive),
            "best_fitness": best.fitness if best else None,
            "published": self.published,
            "duplicates": self.duplicates,
        }
