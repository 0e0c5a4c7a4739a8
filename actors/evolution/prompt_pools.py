"""The island's meta-prompt pools, one per LLM role: the section a request carries, and the
credit of its candidate's outcome (the evolution itself is ``metaprompt.MetaPromptEvolver``).

Owned by the island brain; the island actor loads each pool from and saves it to the
``kf_prompts`` KV bucket (``key``), as the JSON this module reads and writes.
"""

from __future__ import annotations

import zlib

from actors.evolution.metaprompt import MetaPromptEvolver, PromptSection, parse_strategy
from schemas import Experience, Role


class PromptPools:
    """The meta-prompt pools of one island's LLM roles."""

    def __init__(self, run_id: str, island: str, seed: int) -> None:
        self.run_id, self.island, self.seed = run_id, island, seed
        self.pools: dict[Role, MetaPromptEvolver] = {}

    def key(self, role: Role) -> str:
        """The pool's key in the ``kf_prompts`` bucket."""
        return f"{self.run_id}.{self.island}.{role}"

    def add(self, role: Role, saved: str | None) -> None:
        """The pool of ``role``: restored from ``saved`` JSON, else a fresh one seeded from the run."""
        seed = self.seed * 7919 + zlib.crc32(f"{self.island}/{role}".encode())
        self.pools[role] = MetaPromptEvolver.from_json(saved) if saved else MetaPromptEvolver(role, seed=seed % 2**32)

    def section_for(self, role: Role) -> PromptSection | None:
        """The meta-prompt section for the next request of ``role`` (``None``: a role without a pool)."""
        pool = self.pools.get(role)
        return pool.choose() if pool is not None else None

    def credit(self, record: Experience) -> tuple[Role, str] | None:
        """Credit the section ``record``'s candidate was made with; returns the pool to save (its
        role and JSON), or ``None`` when the record came from no pool of this island."""
        role_name, section = parse_strategy(record.strategy)
        role = Role.of(role_name)
        pool = self.pools.get(role) if role is not None else None
        if pool is None or role is None or section is None:
            return None
        pool.record_experience(record)
        return role, pool.to_json().decode()
