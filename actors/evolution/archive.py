"""A small MAP-Elites archive: one elite per cell of a descriptor grid.

Only clean results (correct, nothing flagged for review, fitness measured) may enter; a cell
keeps the fittest candidate that ever landed in it. Cells are keyed by bin indices of the
descriptors (``actors.evolution.descriptors``). The archive serialises to JSON, so an island that
restarts keeps its elites.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from actors.evolution.descriptors import DescriptorSpace
from actors.evolution.errors import StateError
from schemas import Candidate, Diagnosis, Elite, EvalResult


class AddStatus(StrEnum):
    """What happened when a candidate was offered to the archive."""

    NEW_CELL = "new_cell"
    """It took a cell that was empty."""
    IMPROVED = "improved"
    """It replaced a less fit elite in its cell."""
    NOT_IMPROVED = "not_improved"
    """Its cell holds an elite at least as fit."""
    NOT_CLEAN = "not_clean"
    """It may not enter: not correct, flagged for review, or no measured fitness."""


class ArchiveState(BaseModel):
    """The serialised archive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    descriptors: DescriptorSpace
    """The axes."""
    island: str = ""
    """Island that owns it."""
    task_ops: int | None = None
    """Operator count of the task (for the fusion descriptor)."""
    elites: tuple[Elite, ...] = ()
    """The elites, one per cell."""
    offered: int = Field(default=0, ge=0)
    """Candidates offered."""
    replaced: int = Field(default=0, ge=0)
    """Times an elite was replaced by a fitter one."""


class Archive:
    """One elite per cell; see the module docstring."""

    def __init__(self, descriptors: DescriptorSpace, *, island: str = "", task_ops: int | None = None) -> None:
        self.descriptors = descriptors
        self.island = island
        self.task_ops = task_ops
        self._cells: dict[tuple[int, ...], Elite] = {}
        self._by_id: dict[str, tuple[int, ...]] = {}
        self.offered = 0
        self.replaced = 0

    def __len__(self) -> int:
        return len(self._cells)

    def add(self, candidate: Candidate, result: EvalResult, diagnosis: Diagnosis | None = None) -> AddStatus:
        """Offer a candidate with its measured result (and diagnosis, kept with the elite)."""
        self.offered += 1
        fitness = result.fitness
        if not result.clean or fitness is None or result.timing is None:
            return AddStatus.NOT_CLEAN
        values = self.descriptors.measure(candidate, result, task_ops=self.task_ops)
        elite = Elite(
            candidate=candidate,
            fitness=fitness,
            speedup_vs_compiled=result.speedup_vs_compiled,
            median_ms=result.timing.median_ms,
            sol_fraction=result.sol.fraction if result.sol is not None else None,
            cell=self.descriptors.cell(values),
            descriptors=values,
            island=self.island,
            found_at=result.created_at,
            result=result,
            diagnosis=diagnosis,
        )
        return self._place(elite)

    def add_elite(self, elite: Elite) -> AddStatus:
        """Offer an elite of another archive (a migrant): its cell is recomputed on these axes."""
        self.offered += 1
        if elite.result is not None and not elite.result.clean:
            return AddStatus.NOT_CLEAN
        cell = self.descriptors.cell(elite.descriptors)
        return self._place(elite.model_copy(update={"cell": cell, "island": self.island}))

    def _place(self, elite: Elite) -> AddStatus:
        if elite.candidate.candidate_id in self._by_id:
            return AddStatus.NOT_IMPROVED
        current = self._cells.get(elite.cell)
        if current is not None and current.fitness >= elite.fitness:
            return AddStatus.NOT_IMPROVED
        if current is not None:
            del self._by_id[current.candidate.candidate_id]
            self.replaced += 1
        self._cells[elite.cell] = elite
        self._by_id[elite.candidate.candidate_id] = elite.cell
        return AddStatus.IMPROVED if current is not None else AddStatus.NEW_CELL

    def best(self) -> Elite | None:
        """The fittest elite (earliest found wins a tie)."""
        if not self._cells:
            return None
        return max(self._cells.values(), key=lambda e: (e.fitness, -e.found_at))

    def elites(self) -> list[Elite]:
        """Every elite, in cell order."""
        return [self._cells[c] for c in sorted(self._cells)]

    def get(self, cell: tuple[int, ...]) -> Elite | None:
        """The elite of a cell."""
        return self._cells.get(cell)

    def elite_of(self, candidate_id: str) -> Elite | None:
        """The elite entry of a candidate, if it holds a cell now."""
        cell = self._by_id.get(candidate_id)
        return self._cells[cell] if cell is not None else None

    def coverage(self) -> float:
        """Occupied cells over all cells."""
        total = 1
        for n in self.descriptors.shape:
            total *= n
        return len(self._cells) / total

    def spread_axes(self) -> tuple[int, int]:
        """The two axes over which the elites spread most (distinct projected cells; first wins)."""
        n = len(self.descriptors.shape)
        if n == 1:
            return 0, 0
        pairs = [(x, y) for y in range(n) for x in range(n) if x < y]
        return max(pairs, key=lambda p: (len({(c[p[0]], c[p[1]]) for c in self._cells}), -pairs.index(p)))

    def grid(self, x: int = 0, y: int = 1) -> list[list[float | None]]:
        """Best fitness per (y, x) bin pair, over all other axes (a heatmap's rows and columns)."""
        shape = self.descriptors.shape
        if len(shape) == 1 or x == y:
            x, y = 0, -1
        rows = shape[y] if y >= 0 else 1
        out: list[list[float | None]] = [[None] * shape[x] for _ in range(rows)]
        for cell, elite in self._cells.items():
            r = cell[y] if y >= 0 else 0
            old = out[r][cell[x]]
            if old is None or elite.fitness > old:
                out[r][cell[x]] = elite.fitness
        return out

    def state(self) -> ArchiveState:
        """The archive as a serialisable value."""
        return ArchiveState(
            descriptors=self.descriptors,
            island=self.island,
            task_ops=self.task_ops,
            elites=tuple(self.elites()),
            offered=self.offered,
            replaced=self.replaced,
        )

    @classmethod
    def from_state(cls, state: ArchiveState) -> Archive:
        """Rebuild an archive from its state."""
        archive = cls(state.descriptors, island=state.island, task_ops=state.task_ops)
        for elite in state.elites:
            if elite.cell in archive._cells:
                raise StateError(f"two elites in cell {elite.cell} of island {state.island!r}")
            archive._cells[elite.cell] = elite
            archive._by_id[elite.candidate.candidate_id] = elite.cell
        archive.offered, archive.replaced = state.offered, state.replaced
        return archive

    def to_json(self) -> str:
        """JSON text of the archive."""
        return self.state().model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> Archive:
        """Rebuild an archive from :meth:`to_json` text."""
        return cls.from_state(ArchiveState.model_validate_json(text))
