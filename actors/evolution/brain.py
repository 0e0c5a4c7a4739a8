"""The island brain: the whole policy of one island, without I/O.

The island actor feeds it every ``Feedback`` and ``Migration`` addressed to the island and asks
it what to request next; the brain answers from its state alone, so a run is reproducible from
its seed and the order of messages, and a restarted island continues from ``to_json``.

- **Archive**: a MAP-Elites grid (``archive.py``); only clean results become elites.
- **Parent**: a fresh start, an elite (tournament or exploratory draw, ``selection.py``; more
  exploration while stagnating), or a recent failure to repair.
- **Expert**: chosen per the parent's diagnosis by a Thompson-sampling bandit (``credit.py``).
- **Every expert gets its share**: after a warm-up each is asked ``min_tries_per_expert`` times
  before credit decides; a decline earns no reward (``credit.py``).
- **Reward** of a child to its (diagnosis, expert) pair, in [0, 1]: from a clean parent, 1 if
  the child is clean and fitter by more than ``improve_eps``, 0.1 if clean but not fitter, else
  0; from a failed parent, 1 if the child is clean, 0.5 if it got further (compile → run →
  correct answer), else 0; from no parent, 1 if clean, else 0.1 per stage reached.
- **Headroom** (``headroom.py``): parents are drawn in proportion to their gap to speed-of-light
  times the gain their family's mutations measurably earned; an elite within ``near_sol`` of the
  target is no longer refined, and when all are, the island asks for fresh (different) plans.
- **Stagnation** (``stagnation.py``) and **budgets**: the island stops at its share of the run's
  token budget, at the wall-time limit, or when its best reaches the target fraction of
  speed-of-light; the candidate budget is the run's shared quota (``actors.runtime.quota``), which the
  actor applies through :meth:`IslandBrain.stop`.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence

import numpy as np

from actors.evolution.archive import AddStatus, Archive
from actors.evolution.brain_state import BrainState
from actors.evolution.credit import CreditBandit, CreditRow, ExpertProfile, routing_key
from actors.evolution.errors import StateError, WrongIsland
from actors.evolution.headroom import Headroom, family_of
from actors.evolution.ledger import InFlightLedger, RetrievalCache
from actors.evolution.plans import (
    FeedbackOutcome,
    FitnessPoint,
    IslandConfig,
    ParentSource,
    RequestPlan,
    Reward,
    instructions_for,
)
from actors.evolution.prompt_pools import PromptPools
from actors.evolution.reward import reward_of
from actors.evolution.selection import ParentSelector, Pick
from actors.evolution.stagnation import StagnationDetector
from schemas import (
    Candidate,
    Diagnosis,
    EvalOutcome,
    EvalResult,
    EvalStatus,
    Feedback,
    IslandStatus,
    Migration,
    RunSpec,
    StopReason,
    now,
    source_fingerprint,
)
from schemas.candidate import AVOID_KEPT

__all__ = [
    "REFINE",
    "BrainState",
    "ExpertProfile",
    "FeedbackOutcome",
    "FitnessPoint",
    "IslandBrain",
    "IslandConfig",
    "ParentSource",
    "RequestPlan",
    "Reward",
]

REFINE = "refine"
"""Routing key of a request whose parent has no diagnosis (a foreign elite)."""


def _key(diagnosis: Diagnosis | None, has_parent: bool) -> str:
    return REFINE if diagnosis is None and has_parent else routing_key(diagnosis)


RESTART_GRACE_S = 75.0
"""Seconds without feedback after which slots counted from before a restart are given up: the
feedback consumer's ack wait (60 s, after which what the killed process held is redelivered)
and a margin."""


class IslandBrain:
    """The policy of one island; see the module docstring."""

    def __init__(
        self,
        island: str,
        spec: RunSpec,
        experts: Sequence[ExpertProfile],
        seed: int,
        config: IslandConfig | None = None,
    ) -> None:
        self.island, self.spec, self.seed = island, spec, seed
        self.limits = spec.island_limits(island)  # the spec is frozen: computed once, read per request
        self._index = spec.island_index(island)
        self.config = cfg = config or IslandConfig()
        root = np.random.SeedSequence(seed, spawn_key=(zlib.crc32(island.encode()),))
        rng_seed, credit_seed = root.spawn(2)
        self.rng = np.random.default_rng(rng_seed)
        self.credit = CreditBandit(
            experts,
            credit_seed,
            prior_strength=cfg.prior_strength,
            family_share=cfg.family_share,
            min_tries=cfg.min_tries_per_expert,
        )
        ops = spec.task.signature.ops if spec.task.signature else ()
        self.archive = Archive(cfg.descriptors, island=island, task_ops=len(ops) or None)
        self.selector = ParentSelector(cfg.exploit, cfg.tournament, cfg.curiosity)
        self.stagnation = StagnationDetector(
            window=cfg.stagnation_window, seconds=cfg.stagnation_seconds, eps=cfg.stagnation_eps
        )
        self.headroom = Headroom(near_sol=cfg.near_sol)
        self._repair: list[Feedback] = []
        self._outcomes: dict[str, EvalOutcome] = {}
        self._visits: dict[str, int] = {}
        self._seen: set[str] = set()
        self._kernels: dict[str, None] = {}
        """Fingerprints of the kernels this island published or received, oldest first."""
        self._history: list[FitnessPoint] = []
        self.evaluated = self.in_flight = self.tokens_used = self.plans = self.declines = 0
        self._fresh_starts = 0
        self._stopped: StopReason | None = None
        self.ledger = InFlightLedger()  # not saved: after a restart, what it held expires in time
        self.retrieved = RetrievalCache()
        self.prompts = PromptPools(spec.run_id, island, spec.seed)  # saved per role by the actor

    # requests -------------------------------------------------------------------------------

    def next_request(self) -> RequestPlan:
        """Choose parent, expert, instructions and seed for the next request."""
        cfg = self.config
        stagnating = self.stagnation.is_stagnating(None)
        elites = self.archive.elites()
        target = self.spec.target_sol_fraction
        open_elites = [e for e in elites if not self.headroom.done(e, target)] if cfg.headroom else elites
        u = float(self.rng.random())
        parent: Candidate | None = None
        result: EvalResult | None = None
        diagnosis: Diagnosis | None = None
        if not elites:
            source = ParentSource.REPAIR if self._repair and u < cfg.repair_when_empty else ParentSource.FRESH
        else:
            repair = cfg.repair if self._repair else 0.0
            fresh = min(1.0, cfg.fresh * (2 if stagnating else 1))
            if u < repair:
                source = ParentSource.REPAIR
            elif u < repair + fresh or not open_elites:  # every elite near speed-of-light: other plans
                source = ParentSource.FRESH
            else:
                exploit = cfg.stagnant_exploit if stagnating else cfg.exploit
                worth = [self.headroom.weight(e) for e in open_elites] if cfg.headroom else None
                elite, pick = self.selector.select(
                    open_elites, self.rng, visits=self._visits, exploit=exploit, worth=worth
                )
                source = ParentSource.EXPLOIT if pick is Pick.EXPLOIT else ParentSource.EXPLORE
                parent, result, diagnosis = elite.candidate, elite.result, elite.diagnosis
        if source is ParentSource.REPAIR:
            weights = np.arange(1, len(self._repair) + 1, dtype=float)
            fb = self._repair.pop(int(self.rng.choice(len(self._repair), p=weights / weights.sum())))
            parent, result, diagnosis = fb.judged(), fb.result, fb.diagnosis
        key = _key(diagnosis, parent is not None)
        expert = self.credit.choose(
            key,
            suggested_role=diagnosis.suggested_expert if diagnosis else None,
            uniform=cfg.uniform_experts or self.spec.ablations.uniform_experts,
        )
        role = self.credit.experts[expert].role
        if parent is not None:
            self._visits[parent.candidate_id] = self._visits.get(parent.candidate_id, 0) + 1
        self.plans += 1
        self.in_flight += cfg.n_per_request
        seed = int(self.rng.integers(0, 2**31 - 1))
        start = 0
        if source is ParentSource.FRESH:
            # Fresh starts walk the expert's starting points, interleaved with the other islands'.
            start = self._fresh_starts * self.spec.islands + self._index
            self._fresh_starts += 1
        return RequestPlan(
            plan_id=f"{self.island}-{self.plans}",
            island=self.island,
            expert=expert,
            role=role,
            key=key,
            source=source,
            parent=parent,
            parent_result=result,
            diagnosis=diagnosis,
            instructions=instructions_for(role, source, diagnosis),
            seed=seed,
            n=cfg.n_per_request,
            start=start,
            # every island's k-th plan before anyone's (k+1)-th: the evaluators run the first
            # starting points first, whichever island's candidates reached them first
            rank=(self.plans - 1) * self.spec.islands + self._index,
        )

    def wants_request(self) -> bool:
        """Whether fewer than K candidates are in flight and the island has not stopped."""
        return self._stopped is None and self.in_flight < self.spec.inflight_per_island

    def on_reply(self, plan: RequestPlan, proposals: int, *, decline: str | None = "unavailable") -> None:
        """The expert answered ``plan`` with ``proposals`` candidates. None, for the reason
        ``decline``, is a decline: counted, not a failed idea, so it earns no reward; only a
        streak of declines rests the expert (``credit.py``). None with ``decline=None`` is a
        request the island itself cut short (the candidate budget was spent): not counted."""
        self.in_flight = max(0, self.in_flight - plan.n + proposals)
        if proposals == 0 and decline is not None:
            self.declines += 1
            self.credit.record_answer(plan.expert, decline=decline)
        elif proposals:
            self.credit.record_answer(plan.expert, decline=None)

    def forget_in_flight(self, n: int) -> None:
        """Stop counting ``n`` candidates as in flight: their feedback is not coming (e.g. they
        were dead-lettered); the actor decides when to give up on them."""
        self.in_flight = max(0, self.in_flight - n)

    def record_tokens(self, n: int) -> None:
        """Add LLM tokens spent by this island's requests."""
        self.tokens_used += max(0, n)

    def tokens_left(self) -> int | None:
        """LLM tokens left of this island's share of the run's budget (``None``: no budget)."""
        share = self.limits.tokens
        return None if share is None else max(0, share - self.tokens_used)

    def expire_lost(self, now: float) -> list[str]:
        """Give up on candidates whose feedback is overdue (see ``InFlightLedger.overdue``): four
        evaluation timeouts and a minute after they were published; returns them. Slots counted
        from before a restart go after :data:`RESTART_GRACE_S` without feedback: the saved count
        can lag the feedback the killed process had already taken (an island restored with 2 in
        flight whose feedback was long consumed waited 13 minutes), and feedback it had not
        acknowledged is redelivered within the consumer's ack wait."""
        lost = self.ledger.overdue(now, self.spec.eval_timeout_s * 4 + 60.0, self.in_flight, RESTART_GRACE_S)
        self.forget_in_flight(len(lost))
        return lost

    def parent_fitness(self, fb: Feedback) -> float | None:
        """The fitness of the parent of ``fb``'s candidate, where the island knows it."""
        parent_id = fb.judged().parent_id
        parent = self.outcome_of(parent_id) if parent_id else None
        return parent.fitness if parent else None

    # feedback and migrants ------------------------------------------------------------------

    def on_feedback(self, fb: Feedback) -> FeedbackOutcome:
        """Update archive, credit, stagnation and history with one evaluated candidate."""
        if fb.island != self.island:
            raise WrongIsland(self.island, fb.island, "feedback")
        cand, res = fb.judged(), fb.result
        cid = cand.candidate_id
        if cid in self._seen:
            return FeedbackOutcome(
                cid, AddStatus.NOT_IMPROVED, None, False, None, self.stagnation.is_stagnating(), True
            )
        self._seen.add(cid)
        self.evaluated += 1
        self.in_flight = max(0, self.in_flight - 1)
        before = self.archive.best()
        status = self.archive.add(cand, res, fb.diagnosis)
        best = self.archive.best()
        improved = best is not None and (before is None or best.fitness > before.fitness)
        reward = Reward(
            key=_key(cand.diagnosis, cand.parent_id is not None), expert=cand.expert, value=self._reward(fb)
        )
        self.credit.update(reward.key, reward.expert, reward.value)
        parent = self._outcomes.get(cand.parent_id) if cand.parent_id else None
        if parent is not None:
            self.headroom.observe(family_of(cand), reward.key, parent.fitness, res.fitness)
        self._outcomes[cid] = EvalOutcome.of(res)
        if not res.clean:
            self._repair = [*self._repair, fb][-self.config.repair_pool :]
        stagnating = self.stagnation.observe(best.fitness if best else None, res.created_at)
        self._history.append(
            FitnessPoint(
                at=res.created_at,
                candidate_id=cid,
                status=res.status.value,
                fitness=res.fitness,
                best=best.fitness if best else None,
                expert=cand.expert,
                key=reward.key,
            )
        )
        elite = self.archive.elite_of(cid) if status in (AddStatus.NEW_CELL, AddStatus.IMPROVED) else None
        return FeedbackOutcome(cid, status, elite, improved, reward, stagnating)

    def _reward(self, fb: Feedback) -> float:
        parent_id = fb.judged().parent_id
        parent = self._outcomes.get(parent_id) if parent_id else None
        return reward_of(fb.result, parent_id, parent, self.config.improve_eps)

    def claim_kernel(self, fingerprint: str) -> bool:
        """Note a kernel the island is about to publish; False if it has it already (published
        before, or a migrant), which the island then does not publish again."""
        if fingerprint in self._kernels:
            return False
        self._kernels[fingerprint] = None
        return True

    def forget_kernel(self, fingerprint: str) -> None:
        """Undo :meth:`claim_kernel` for a kernel that was not published after all."""
        self._kernels.pop(fingerprint, None)

    def kernels_to_avoid(self) -> tuple[str, ...]:
        """The newest :data:`~schemas.candidate.AVOID_KEPT` kernels' fingerprints, for a request's ``avoid``."""
        return tuple(itertools.islice(reversed(self._kernels), AVOID_KEPT))[::-1]

    def on_migrants(self, m: Migration) -> int:
        """Offer migrants to the archive with their measured results; returns how many entered."""
        if m.dest_island != self.island:
            raise WrongIsland(self.island, m.dest_island, "a migration")
        accepted = 0
        for elite in m.elites:
            self._kernels.setdefault(source_fingerprint(elite.candidate.proposal.source), None)
            status = self.archive.add_elite(elite)
            cid = elite.candidate.candidate_id
            self._outcomes.setdefault(cid, EvalOutcome(status=EvalStatus.CORRECT.value, fitness=elite.fitness))
            if status in (AddStatus.NEW_CELL, AddStatus.IMPROVED):
                accepted += 1
                best = self.archive.best()
                self._history.append(
                    FitnessPoint(
                        at=m.created_at,
                        candidate_id=cid,
                        status=EvalStatus.CORRECT.value,
                        fitness=elite.fitness,
                        best=best.fitness if best else None,
                        expert=elite.candidate.expert,
                        migrant=True,
                    )
                )
        if accepted:
            self.stagnation.reset(m.created_at)
        return accepted

    # budget, status, report -----------------------------------------------------------------

    def budget_exhausted(self, now: float) -> StopReason | None:
        """Why the island must stop now, if it must (sticky once set)."""
        if self._stopped is not None:
            return self._stopped
        limits = self.limits
        best = self.archive.best()
        if best is not None and best.sol_fraction is not None and best.sol_fraction >= self.spec.target_sol_fraction:
            self._stopped = StopReason.SPEED_OF_LIGHT
        elif limits.tokens is not None and self.tokens_used >= limits.tokens:
            self._stopped = StopReason.TOKENS
        elif self.spec.past_deadline(now):
            self._stopped = StopReason.WALL_TIME
        return self._stopped

    def stop(self, reason: StopReason) -> None:
        """Stop issuing for a reason decided outside the brain (the run's shared candidate quota
        is spent); sticky, like the budget's own reasons."""
        if self._stopped is None:
            self._stopped = reason

    def status(self, at: float | None = None) -> IslandStatus:
        """The island's progress as an ``IslandStatus``."""
        best = self.archive.best()
        return IslandStatus(
            run_id=self.spec.run_id,
            island=self.island,
            evaluated=self.evaluated,
            in_flight=self.in_flight,
            archive_size=len(self.archive),
            best_fitness=best.fitness if best else None,
            best_candidate_id=best.candidate.candidate_id if best else None,
            stagnating=self.stagnation.is_stagnating(at),
            tokens_used=self.tokens_used,
            stopped=self._stopped,
            declines=self.declines,
            at=now() if at is None else at,
        )

    def outcome_of(self, candidate_id: str) -> EvalOutcome | None:
        """The verdict and fitness of a candidate this island has seen (evaluated or migrant)."""
        return self._outcomes.get(candidate_id)

    def credit_table(self) -> list[CreditRow]:
        """Credit per (diagnosis, expert) learned so far."""
        return self.credit.rows()

    @property
    def fitness_history(self) -> tuple[FitnessPoint, ...]:
        """Per feedback (and accepted migrant): time, fitness and best so far."""
        return tuple(self._history)

    def to_json(self) -> str:
        """The whole state as JSON (for the KV bucket); :meth:`from_json` continues identically."""
        return BrainState(
            island=self.island,
            seed=self.seed,
            config=self.config,
            archive=self.archive.state(),
            credit=self.credit.state(),
            stagnation=self.stagnation.model_copy(),
            rng=dict(self.rng.bit_generator.state),
            repair=list(self._repair),
            outcomes=dict(self._outcomes),
            visits=dict(self._visits),
            seen=sorted(self._seen),
            history=list(self._history),
            evaluated=self.evaluated,
            in_flight=self.in_flight,
            tokens_used=self.tokens_used,
            plans=self.plans,
            declines=self.declines,
            stopped=self._stopped,
            headroom=self.headroom.model_copy(deep=True),
            fresh_starts=self._fresh_starts,
            kernels=list(self._kernels),
        ).model_dump_json()

    @classmethod
    def from_json(cls, text: str, spec: RunSpec) -> IslandBrain:
        """Restore a brain saved by :meth:`to_json` for the run ``spec``."""
        state = BrainState.model_validate_json(text)
        if state.archive.island != state.island:
            raise StateError(f"archive of island {state.archive.island!r} in the state of {state.island!r}")
        brain = cls(state.island, spec, state.credit.experts, state.seed, state.config)
        brain.rng.bit_generator.state = state.rng
        brain.credit = CreditBandit.from_state(state.credit)
        brain.archive = Archive.from_state(state.archive)
        brain.stagnation = state.stagnation.model_copy()
        brain._repair, brain._outcomes, brain._visits = list(state.repair), dict(state.outcomes), dict(state.visits)
        brain._seen, brain._history = set(state.seen), list(state.history)
        brain.evaluated, brain.in_flight, brain.tokens_used = state.evaluated, state.in_flight, state.tokens_used
        brain.plans, brain.declines, brain._stopped = state.plans, state.declines, state.stopped
        brain.headroom = state.headroom.model_copy(deep=True)
        brain._fresh_starts = state.fresh_starts
        brain._kernels = dict.fromkeys(state.kernels)
        return brain
