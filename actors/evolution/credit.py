"""Credit per (diagnosis category, expert), learned from measured outcomes: a Thompson-sampling
bandit with a routing-table prior.

The arm of a request is the expert; the context is the routing key: the parent's diagnosis
category, or ``start`` for a fresh candidate. Each (key, expert) pair holds a Beta posterior over
the reward in [0, 1] its children earned (see ``IslandBrain`` for the reward). The prior comes
from a routing table (category or family → preferred roles, best first), from the role the
diagnoser suggested, and from the expert's weight in the run spec. Evidence is shared within a
family: a pair borrows ``family_share`` of what the same expert earned on sibling categories, so a
new category does not start from nothing. Draws come from the bandit's own seeded generator, and
the whole state (counts and generator) serialises to JSON.

Every expert gets its share: once the island has made two requests per expert, one answered
fewer than ``min_tries`` times is asked before the posterior decides (so an LLM expert beside a
template expert that wins early is still tried). A decline (refused, no code, unreachable) is
not a failed idea and earns no reward: it is counted in the expert's :class:`ExpertUsage`, and
only a streak of declines rests the expert for a growing number of choices (``2 ** (streak -
1)``, at most ``MAX_REST``). ``uniform=True`` (the ``--uniform-experts`` ablation) ignores
diagnosis, prior and credit and draws uniformly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.errors import PolicyConfigError
from schemas import Diagnosis, DiagnosisCategory, ExpertConfig, ExpertKind, Role

START = "start"
"""Routing key of a request without a parent."""

ROUTES: Mapping[str, tuple[Role, ...]] = MappingProxyType(
    {
        START: (Role.TEMPLATE, Role.GENERAL, Role.ALGORITHM, Role.FUSION, Role.MEMORY, Role.TILING),
        "refine": (Role.TEMPLATE, Role.GENERAL, Role.TILING, Role.MEMORY, Role.FUSION, Role.ALGORITHM),
        "compile": (Role.REPAIR, Role.GENERAL),
        "compile.resources": (Role.TILING, Role.TEMPLATE, Role.REPAIR, Role.GENERAL),
        "runtime": (Role.REPAIR, Role.GENERAL),
        "runtime.launch": (Role.TILING, Role.REPAIR, Role.GENERAL),
        "runtime.oom": (Role.MEMORY, Role.REPAIR, Role.GENERAL),
        "incorrect": (Role.REPAIR, Role.GENERAL),
        "rejected": (Role.REPAIR, Role.GENERAL),
        "slow": (Role.TEMPLATE, Role.GENERAL),
        "slow.launch_bound": (Role.FUSION, Role.TEMPLATE, Role.ALGORITHM, Role.GENERAL),
        "slow.memory_bound": (Role.MEMORY, Role.TEMPLATE, Role.TILING, Role.GENERAL),
        "slow.compute_bound": (Role.TILING, Role.TEMPLATE, Role.ALGORITHM, Role.GENERAL),
        "slow.latency_bound": (Role.TILING, Role.TEMPLATE, Role.ALGORITHM, Role.GENERAL),
        "slow.far_from_sol": (Role.ALGORITHM, Role.TEMPLATE, Role.FUSION, Role.MEMORY, Role.GENERAL),
        "at_sol": (Role.TEMPLATE, Role.TILING, Role.GENERAL),
    }
)
"""Preferred roles per category (or family), best first. ``refine`` is the key of a parent that
came without a diagnosis (a foreign elite)."""

MAX_REST = 16
"""Most choices an expert rests after a streak of declines."""
_RANK_WEIGHT = (1.0, 0.6, 0.4, 0.25, 0.15)
_UNLISTED = 0.1
_SUGGESTED = 0.9


def routing_key(diagnosis: Diagnosis | DiagnosisCategory | None) -> str:
    """The bandit's context for a parent's diagnosis (``start`` without one)."""
    if diagnosis is None:
        return START
    category = diagnosis.category if isinstance(diagnosis, Diagnosis) else diagnosis
    return category.value


def family(key: str) -> str:
    """The family of a routing key (``start`` is its own family)."""
    return key.split(".", 1)[0]


class ExpertProfile(BaseModel):
    """An expert an island may ask: its service name, its role and its prior weight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    """Service name (``kf.expert.<name>.generate``)."""
    role: Role = Role.GENERAL
    """Speciality (``ExpertConfig.role``; ``template`` for the template expert)."""
    weight: float = Field(default=1.0, gt=0)
    """Prior weight from the run spec (``ExpertRef.weight``)."""

    @classmethod
    def from_config(cls, config: ExpertConfig, weight: float = 1.0) -> ExpertProfile:
        """The profile of a configured expert (the template expert's role is ``template``)."""
        role = Role.TEMPLATE if config.kind is ExpertKind.TEMPLATE else Role.of(config.role)
        if role is None:
            known = ", ".join(r.value for r in Role)
            raise ValueError(f"expert {config.name!r}: unknown role {config.role!r} (known: {known})")
        return cls(name=config.name, role=role, weight=weight)


class Arm(BaseModel):
    """Observed outcomes of one (key, expert) pair."""

    model_config = ConfigDict(extra="forbid")

    pulls: int = 0
    """Outcomes recorded."""
    reward: float = 0.0
    """Sum of rewards."""


class ExpertUsage(BaseModel):
    """How often an island asked one expert and how it answered."""

    model_config = ConfigDict(extra="forbid")

    requests: int = 0
    """Requests sent to it."""
    declines: int = 0
    """Requests it answered with no candidate (or did not answer)."""
    declined_by: dict[str, int] = Field(default_factory=dict)
    """Declines per reason (``DeclineReason`` value, ``unavailable`` when it did not answer)."""
    duplicates: int = 0
    """Proposals not published: the island had the same kernel already."""
    streak: int = 0
    """Declines in a row, up to now."""
    rest: int = 0
    """Choices it still sits out after its latest streak of declines."""

    @property
    def answered(self) -> int:
        """Requests answered with candidates."""
        return self.requests - self.declines


class CreditRow(BaseModel):
    """One line of the credit table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    """Routing key (diagnosis category or ``start``)."""
    expert: str
    """Expert name."""
    role: str
    """Its role."""
    pulls: int
    """Outcomes recorded."""
    mean_reward: float | None
    """Observed mean reward; ``None`` before the first outcome."""
    prior_mean: float
    """Mean of the prior."""
    posterior_mean: float
    """Mean of the posterior used for choices."""


class CreditState(BaseModel):
    """The serialised bandit."""

    model_config = ConfigDict(extra="forbid")

    experts: tuple[ExpertProfile, ...]
    """Experts known, in order."""
    arms: dict[str, dict[str, Arm]] = Field(default_factory=dict)
    """key → expert → outcomes."""
    rng: dict[str, Any]
    """State of the bandit's generator."""
    prior_strength: float
    """Pseudo-observations behind the prior."""
    family_share: float
    """Share of sibling-category evidence borrowed."""
    min_tries: int = 0
    """Answered requests each expert gets before the posterior decides."""
    usage: dict[str, ExpertUsage] = Field(default_factory=dict)
    """expert → requests and declines."""


class CreditBandit:
    """Chooses an expert per routing key and learns from rewards; see the module docstring."""

    def __init__(
        self,
        experts: Sequence[ExpertProfile],
        seed: int | np.random.SeedSequence,
        *,
        prior_strength: float = 2.0,
        family_share: float = 0.5,
        min_tries: int = 0,
    ) -> None:
        if not experts:
            raise PolicyConfigError("experts", [], "at least one expert is needed")
        if prior_strength <= 0:
            raise PolicyConfigError("prior_strength", prior_strength, "must be > 0")
        if not 0 <= family_share <= 1:
            raise PolicyConfigError("family_share", family_share, "must be in [0, 1]")
        self.experts: dict[str, ExpertProfile] = {e.name: e for e in experts}
        self.rng = np.random.default_rng(seed)
        self.prior_strength = prior_strength
        self.family_share = family_share
        if min_tries < 0:
            raise PolicyConfigError("min_tries", min_tries, "must be >= 0")
        self.min_tries = min_tries
        self.arms: dict[str, dict[str, Arm]] = {}
        self.usage: dict[str, ExpertUsage] = {}

    def prior(self, key: str, expert: str, suggested_role: str | None = None) -> tuple[float, float]:
        """Beta prior (alpha, beta) of a pair, from the routing table and the expert's weight."""
        profile = self.experts.get(expert) or ExpertProfile(name=expert)
        roles = ROUTES.get(key) or ROUTES.get(family(key), ())
        rank = roles.index(profile.role) if profile.role in roles else None
        w = _RANK_WEIGHT[min(rank, len(_RANK_WEIGHT) - 1)] if rank is not None else _UNLISTED
        if suggested_role is not None and profile.role == suggested_role:
            w = max(w, _SUGGESTED)
        w = min(1.0, w * profile.weight)
        s = self.prior_strength
        return 1.0 + s * w, 1.0 + s * (1.0 - w)

    def posterior(self, key: str, expert: str, suggested_role: str | None = None) -> tuple[float, float]:
        """Beta posterior (alpha, beta) of a pair, with the family's evidence shared in."""
        a, b = self.prior(key, expert, suggested_role)
        own = self.arms.get(key, {}).get(expert, Arm())
        sib_pulls, sib_reward = 0, 0.0
        for other, arms in self.arms.items():
            if other != key and family(other) == family(key) and expert in arms:
                sib_pulls += arms[expert].pulls
                sib_reward += arms[expert].reward
        a += own.reward + self.family_share * sib_reward
        b += (own.pulls - own.reward) + self.family_share * (sib_pulls - sib_reward)
        return a, b

    def choose(
        self, key: str, *, suggested_role: str | None = None, exclude: Sequence[str] = (), uniform: bool = False
    ) -> str:
        """The expert for the next request (counted as asked): a resting expert sits out, one
        not yet tried ``min_tries`` times goes first (after a warm-up), else the highest posterior draw (Thompson
        sampling); ``uniform`` draws uniformly among those not resting."""
        allowed = [n for n in self.experts if n not in exclude] or list(self.experts)
        awake = [n for n in allowed if self.usage_of(n).rest == 0] or allowed
        for name in allowed:
            usage = self.usage_of(name)
            usage.rest = max(0, usage.rest - 1)
        asked = sum(u.requests for u in self.usage.values())
        warm = asked >= 2 * len(self.experts)  # the first requests follow the routing prior
        untried = [n for n in awake if warm and self.usage_of(n).answered < self.min_tries]
        if uniform or untried:
            pool = awake if uniform else untried
            name = pool[int(self.rng.integers(len(pool)))]
        else:
            draws = [self.rng.beta(*self.posterior(key, n, suggested_role)) for n in awake]
            name = awake[int(np.argmax(draws))]
        self.usage_of(name).requests += 1
        return name

    def usage_of(self, expert: str) -> ExpertUsage:
        """The requests and declines of one expert (created on first use)."""
        usage = self.usage.get(expert)
        if usage is None:  # not ``setdefault``: that would build a model on every call
            usage = self.usage[expert] = ExpertUsage()
        return usage

    def record_answer(self, expert: str, *, decline: str | None) -> None:
        """An expert answered a request: with candidates (``decline`` None) or with none, for the
        reason given. A decline earns no reward; a streak of them rests the expert."""
        usage = self.usage_of(expert)
        if decline is None:
            usage.streak = 0
            return
        usage.declines += 1
        usage.declined_by[decline] = usage.declined_by.get(decline, 0) + 1
        usage.streak += 1
        if usage.streak >= 2:
            usage.rest = min(MAX_REST, 2 ** (usage.streak - 1))

    def update(self, key: str, expert: str, reward: float) -> None:
        """Record one outcome (reward clipped to [0, 1]); an unknown expert joins as ``general``."""
        if expert not in self.experts:
            self.experts[expert] = ExpertProfile(name=expert)
        arm = self.arms.setdefault(key, {}).setdefault(expert, Arm())
        arm.pulls += 1
        arm.reward += min(1.0, max(0.0, reward))

    def rows(self) -> list[CreditRow]:
        """The credit table: every pair with outcomes, by key then expert."""
        out: list[CreditRow] = []
        for key in sorted(self.arms):
            for name in sorted(self.arms[key]):
                arm = self.arms[key][name]
                pa, pb = self.prior(key, name)
                a, b = self.posterior(key, name)
                out.append(
                    CreditRow(
                        key=key,
                        expert=name,
                        role=self.experts[name].role,
                        pulls=arm.pulls,
                        mean_reward=arm.reward / arm.pulls if arm.pulls else None,
                        prior_mean=pa / (pa + pb),
                        posterior_mean=a / (a + b),
                    )
                )
        return out

    def render(self) -> str:
        """The credit table as aligned text."""
        head = f"{'diagnosis':<28} {'expert':<16} {'role':<10} {'pulls':>5} {'mean':>6} {'prior':>6} {'post':>6}"
        lines = [head, "-" * len(head)]
        for r in self.rows():
            mean = f"{r.mean_reward:.2f}" if r.mean_reward is not None else "-"
            lines.append(
                f"{r.key:<28} {r.expert:<16} {r.role:<10} {r.pulls:>5} {mean:>6} "
                f"{r.prior_mean:>6.2f} {r.posterior_mean:>6.2f}"
            )
        return "\n".join(lines)

    def state(self) -> CreditState:
        """The bandit as a serialisable value."""
        return CreditState(
            experts=tuple(self.experts.values()),
            arms={k: {n: a.model_copy() for n, a in v.items()} for k, v in self.arms.items()},
            rng=dict(self.rng.bit_generator.state),
            prior_strength=self.prior_strength,
            family_share=self.family_share,
            min_tries=self.min_tries,
            usage={n: u.model_copy(deep=True) for n, u in self.usage.items()},
        )

    @classmethod
    def from_state(cls, state: CreditState) -> CreditBandit:
        """Rebuild a bandit that continues exactly where ``state`` was taken."""
        bandit = cls(
            state.experts,
            0,
            prior_strength=state.prior_strength,
            family_share=state.family_share,
            min_tries=state.min_tries,
        )
        bandit.rng.bit_generator.state = state.rng
        bandit.usage = {n: u.model_copy(deep=True) for n, u in state.usage.items()}
        bandit.arms = {k: {n: a.model_copy() for n, a in v.items()} for k, v in state.arms.items()}
        return bandit
