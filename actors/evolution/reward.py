"""The reward of a child to its (diagnosis, expert) pair, in [0, 1] (the island brain's credit).

From a clean parent: 1 if the child is clean and fitter by more than ``improve_eps``, 0.1 if clean
but not fitter, else 0. From a failed parent: 1 if the child is clean, 0.5 if it got further
(compile → run → correct answer), else 0. From no parent: 1 if clean, else 0.1 per stage reached.
A parent the island does not know (a foreign elite): 0.5 if the child is clean, else 0.
"""

from __future__ import annotations

from schemas import EvalOutcome, EvalResult, EvalStatus

STAGE = {
    EvalStatus.COMPILE_ERROR: 0,
    EvalStatus.EVALUATOR_ERROR: 0,
    EvalStatus.RUNTIME_ERROR: 1,
    EvalStatus.TIMEOUT: 1,
    EvalStatus.REJECTED: 1,
    EvalStatus.INCORRECT: 2,
    EvalStatus.CORRECT: 2,
}
"""How far a result got: compiled (1), ran and answered (2); a clean result counts 3."""


def reward_of(child: EvalResult, parent_id: str | None, parent: EvalOutcome | None, improve_eps: float) -> float:
    """The reward of ``child`` (see the module docstring)."""
    stage = 3 if child.clean else STAGE[child.status]
    if parent_id is None:
        return 1.0 if child.clean else 0.1 * stage
    if parent is None:
        return 0.5 if child.clean else 0.0
    if parent.fitness is not None:
        if child.fitness is not None and child.fitness > parent.fitness * (1.0 + improve_eps):
            return 1.0
        return 0.1 if child.clean else 0.0
    if child.clean:
        return 1.0
    return 0.5 if stage > STAGE[EvalStatus(parent.status)] else 0.0
