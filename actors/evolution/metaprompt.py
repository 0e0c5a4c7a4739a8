"""Meta-prompt co-evolution: prompt sections that evolve by the outcomes of their candidates.

Per role (memory, fusion, tiling, algorithm, repair, general) a :class:`MetaPromptEvolver` keeps
a small population of prompt sections, each a list of directives. For a request it picks one by
Thompson sampling over a Beta posterior of its reward; the section's text goes into
``GenerateRequest.meta_prompt`` and its id into each proposal's strategy (``<role>/<section id>``),
so the outcome of every candidate can be credited back: reward ``(1 + tanh(delta/scale))/2`` of
the fitness change from parent to child (0 when neither has a fitness). Every ``evolve_every``
outcomes it breeds a child from tournament-chosen parents (mutation: add, drop, replace or promote
a directive; or uniform crossover of two parents' directives) and culls the worst section (tried ones first)
when the population is full. The whole state, the generator's included, is a pydantic model
(:class:`RolePool`) that round-trips through JSON, as kept in the ``kf_prompts`` KV bucket under
``<run>.<role>``. Section ids are content hashes, so an id computed from a request's meta-prompt
text by the expert matches the pool's.
"""

from __future__ import annotations

import hashlib
import math
import re
from enum import StrEnum
from typing import Literal

import numpy as np
from pydantic import Field

from actors.evolution.directives import DIRECTIVES, SHARED_DIRECTIVES
from schemas import Experience, Model, Role

_ID = re.compile(r"^mp-[0-9a-f]{12}$")


def section_id_for_text(text: str) -> str:
    """The id of a section's text: ``mp-`` and 12 hex digits of its SHA-256."""
    return "mp-" + hashlib.sha256(text.strip().encode()).hexdigest()[:12]


def strategy_tag(role: Role, section_id: str | None) -> str:
    """The strategy string of a proposal: ``<role>/<section id>``, or the role alone."""
    return f"{role}/{section_id}" if section_id else role


def parse_strategy(strategy: str) -> tuple[str, str | None]:
    """The role and section id of a strategy string written by :func:`strategy_tag`."""
    role, sep, section = strategy.partition("/")
    if sep and _ID.match(section):
        return role, section
    return strategy, None


def render(directives: tuple[str, ...]) -> str:
    """A section's text: one directive per bullet line."""
    return "\n".join(f"- {d}" for d in directives)


def reward(delta: float | None, scale: float) -> float:
    """Reward in [0, 1] of a fitness change (0.5 for no change, 0 when nothing was measured)."""
    if delta is None or math.isnan(delta):
        return 0.0
    return 0.5 * (1.0 + math.tanh(delta / scale))


class SectionOrigin(StrEnum):
    """How a section came to be."""

    SEED = "seed"
    MUTATION = "mutation"
    CROSSOVER = "crossover"
    ADOPTED = "adopted"
    """Text chosen elsewhere and credited here."""


class PromptSection(Model):
    """One prompt section and what its candidates earned."""

    section_id: str
    """Content hash of ``text`` (see :func:`section_id_for_text`)."""
    role: Role
    """The role it serves."""
    directives: tuple[str, ...] = Field(min_length=1)
    """Its directives, in order of emphasis."""
    origin: SectionOrigin
    """Seed, mutation, crossover or adopted."""
    parents: tuple[str, ...] = ()
    """Ids of the sections it was bred from."""
    born_at: int = Field(default=0, ge=0)
    """Outcomes the pool had recorded when it was made."""
    uses: int = Field(default=0, ge=0)
    """Outcomes credited to it."""
    reward_sum: float = 0.0
    """Sum of those outcomes' rewards."""
    alpha: float = Field(default=1.0, gt=0)
    """Beta posterior: 1 + rewards (plus inherited prior)."""
    beta: float = Field(default=1.0, gt=0)
    """Beta posterior: 1 + (1 - reward) summed (plus inherited prior)."""

    @property
    def text(self) -> str:
        """What goes into ``GenerateRequest.meta_prompt``."""
        return render(self.directives)

    @property
    def mean(self) -> float:
        """Posterior mean reward."""
        return self.alpha / (self.alpha + self.beta)

    @classmethod
    def make(cls, role: Role, directives: tuple[str, ...], origin: SectionOrigin, **fields: object) -> PromptSection:
        """A section whose id is the hash of its text."""
        return cls.model_validate(
            {
                "section_id": section_id_for_text(render(directives)),
                "role": role,
                "directives": directives,
                "origin": origin,
                **fields,
            }
        )


class RngState(Model):
    """The state of a PCG64 generator, so a restored pool continues the same random stream."""

    state: int
    inc: int
    has_uint32: int
    uinteger: int


class EvolutionSettings(Model):
    """How a pool evolves."""

    population_cap: int = Field(default=8, ge=2, le=64)
    """Sections kept; the worst tried one is culled beyond it."""
    evolve_every: int = Field(default=6, ge=1)
    """Outcomes between two breedings."""
    min_uses: int = Field(default=2, ge=1)
    """Outcomes a section needs before it may breed or be culled."""
    crossover_rate: float = Field(default=0.35, ge=0, le=1)
    """Chance a breeding is a crossover (when two parents qualify)."""
    max_directives: int = Field(default=6, ge=1)
    """Longest section."""
    reward_scale: float = Field(default=0.25, gt=0)
    """Fitness change that maps to a reward of about 0.88 (tanh(1))."""


class RolePool(Model):
    """The evolving sections of one role: the JSON kept in ``kf_prompts`` under ``<run>.<role>``."""

    version: Literal[1] = 1
    """Format version."""
    role: Role
    """The role."""
    sections: tuple[PromptSection, ...] = Field(min_length=1)
    """The population."""
    outcomes: int = Field(default=0, ge=0)
    """Outcomes recorded so far."""
    settings: EvolutionSettings = EvolutionSettings()
    """Breeding parameters."""
    rng: RngState
    """The pool's generator."""


class MetaPromptEvolver:
    """Chooses, credits and breeds the prompt sections of one role."""

    def __init__(self, role: Role, *, seed: int = 0, settings: EvolutionSettings | None = None) -> None:
        if role not in DIRECTIVES:
            raise KeyError(f"unknown role {role!r}; known roles: {', '.join(DIRECTIVES)}")
        self.role = role
        self.settings = settings or EvolutionSettings()
        self._rng = np.random.default_rng(seed)
        self._outcomes = 0
        self._sections: dict[str, PromptSection] = {}
        for directives in seed_sections(role):
            section = PromptSection.make(role, directives, SectionOrigin.SEED)
            self._sections[section.section_id] = section

    @classmethod
    def from_state(cls, pool: RolePool) -> MetaPromptEvolver:
        """Continue an evolution from its saved state."""
        evolver = cls.__new__(cls)
        evolver.role = pool.role
        evolver.settings = pool.settings
        evolver._rng = np.random.default_rng()
        evolver._rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": pool.rng.state, "inc": pool.rng.inc},
            "has_uint32": pool.rng.has_uint32,
            "uinteger": pool.rng.uinteger,
        }
        evolver._outcomes = pool.outcomes
        evolver._sections = {s.section_id: s for s in pool.sections}
        return evolver

    @classmethod
    def from_json(cls, data: bytes | str) -> MetaPromptEvolver:
        """Continue an evolution from the JSON of a :class:`RolePool`."""
        return cls.from_state(RolePool.model_validate_json(data))

    def state(self) -> RolePool:
        """The whole state, for the KV bucket."""
        raw = self._rng.bit_generator.state
        rng = RngState(
            state=raw["state"]["state"],
            inc=raw["state"]["inc"],
            has_uint32=raw["has_uint32"],
            uinteger=raw["uinteger"],
        )
        return RolePool(
            role=self.role,
            sections=tuple(self._sections.values()),
            outcomes=self._outcomes,
            settings=self.settings,
            rng=rng,
        )

    def to_json(self) -> bytes:
        """The JSON of :meth:`state`."""
        return self.state().model_dump_json().encode()

    @property
    def sections(self) -> tuple[PromptSection, ...]:
        """The population, oldest first."""
        return tuple(self._sections.values())

    @property
    def outcomes(self) -> int:
        """Outcomes recorded so far."""
        return self._outcomes

    def best(self) -> PromptSection:
        """The section with the highest posterior mean among those tried (any, if none was)."""
        tried = [s for s in self._sections.values() if s.uses > 0] or list(self._sections.values())
        return max(tried, key=lambda s: (s.mean, s.uses))

    def choose(self) -> PromptSection:
        """A section for the next request, by Thompson sampling."""
        sections = list(self._sections.values())
        draws = [float(self._rng.beta(s.alpha, s.beta)) for s in sections]
        return sections[int(np.argmax(draws))]

    def adopt(self, text: str) -> PromptSection:
        """Register a section chosen elsewhere (bullet lines become directives); returns it."""
        directives = tuple(d for d in (line.strip().lstrip("-*• ").strip() for line in text.splitlines()) if d)
        if not directives:
            raise ValueError("an adopted section needs at least one directive")
        section = PromptSection.make(self.role, directives, SectionOrigin.ADOPTED, born_at=self._outcomes)
        return self._sections.setdefault(section.section_id, section)

    def record(self, section_id: str, delta: float | None) -> PromptSection | None:
        """Credit an outcome to a section; returns a newly bred section when breeding happened.

        An unknown id (e.g. culled since) is counted towards breeding but credits nothing.
        """
        section = self._sections.get(section_id)
        if section is not None:
            r = reward(delta, self.settings.reward_scale)
            self._sections[section_id] = section.model_copy(
                update={
                    "uses": section.uses + 1,
                    "reward_sum": section.reward_sum + r,
                    "alpha": section.alpha + r,
                    "beta": section.beta + (1.0 - r),
                }
            )
        self._outcomes += 1
        if self._outcomes % self.settings.evolve_every == 0:
            return self._breed()
        return None

    def record_experience(self, experience: Experience) -> PromptSection | None:
        """Credit a recorded transition whose strategy names a section of this role."""
        role, section_id = parse_strategy(experience.strategy)
        if role != self.role or section_id is None:
            return None
        return self.record(section_id, experience.delta)

    def _breed(self) -> PromptSection | None:
        cfg = self.settings
        eligible = [s for s in self._sections.values() if s.uses >= cfg.min_uses]
        if not eligible:
            return None
        first = self._tournament(eligible)
        parents: tuple[str, ...]
        for _ in range(8):
            if len(eligible) >= 2 and self._rng.random() < cfg.crossover_rate:
                second = self._tournament([s for s in eligible if s.section_id != first.section_id])
                directives = self._crossover(first, second)
                origin, parents = SectionOrigin.CROSSOVER, (first.section_id, second.section_id)
            else:
                directives = self._mutate(first)
                origin, parents = SectionOrigin.MUTATION, (first.section_id,)
            child_id = section_id_for_text(render(directives))
            if directives and child_id not in self._sections:
                break
        else:
            return None
        inherited = float(np.mean([self._sections[p].mean for p in parents]))
        child = PromptSection.make(
            self.role,
            directives,
            origin,
            parents=parents,
            born_at=self._outcomes,
            alpha=1.0 + inherited,
            beta=1.0 + (1.0 - inherited),
        )
        self._sections[child.section_id] = child
        self._cull(keep={child.section_id, self.best().section_id})
        return child

    def _tournament(self, pool: list[PromptSection]) -> PromptSection:
        picks = self._rng.choice(len(pool), size=min(2, len(pool)), replace=False)
        return max((pool[int(i)] for i in picks), key=lambda s: s.mean)

    def _mutate(self, parent: PromptSection) -> tuple[str, ...]:
        current = list(parent.directives)
        library = [d for d in (*DIRECTIVES[self.role], *SHARED_DIRECTIVES) if d not in current]
        ops = ["promote"] if len(current) > 1 else []
        if library and len(current) < self.settings.max_directives:
            ops.append("add")
        if len(current) > 1:
            ops.append("drop")
        if library:
            ops.append("replace")
        if not ops:
            return tuple(current)
        op = ops[int(self._rng.integers(len(ops)))]
        where = int(self._rng.integers(len(current)))
        if op == "add":
            current.insert(int(self._rng.integers(len(current) + 1)), library[int(self._rng.integers(len(library)))])
        elif op == "drop":
            current.pop(where)
        elif op == "replace":
            current[where] = library[int(self._rng.integers(len(library)))]
        else:
            current.insert(0, current.pop(max(1, where)))
        return tuple(current)

    def _crossover(self, a: PromptSection, b: PromptSection) -> tuple[str, ...]:
        merged: list[str] = []
        for directive in (*a.directives, *b.directives):
            if directive not in merged and self._rng.random() < 0.5:
                merged.append(directive)
        if not merged:
            merged.append(a.directives[0])
        return tuple(merged[: self.settings.max_directives])

    def _cull(self, keep: set[str]) -> None:
        """Remove the worst sections beyond the cap: tried ones first, untried only if no tried one is left."""
        while len(self._sections) > self.settings.population_cap:
            candidates = [s for s in self._sections.values() if s.section_id not in keep]
            if not candidates:
                return
            tried = [s for s in candidates if s.uses >= self.settings.min_uses]
            worst = min(tried or candidates, key=lambda s: (s.mean, -s.uses))
            del self._sections[worst.section_id]


def seed_sections(role: Role) -> list[tuple[str, ...]]:
    """The starting sections of a role: disjoint slices of its directive library."""
    library = DIRECTIVES[role]
    return [tuple(library[i : i + 3]) for i in range(0, len(library), 3) if library[i : i + 3]]
