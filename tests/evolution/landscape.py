"""A stand-in for expert and evaluator in policy tests: a seeded landscape of block sizes."""

from __future__ import annotations

import math

import numpy as np

from actors.diagnosis.rules import RuleDiagnoser
from actors.evolution.brain import IslandBrain, RequestPlan
from schemas import EvalResult, EvalStatus, Feedback, KernelLanguage, Proposal
from tests.evolution import factories as f

DIAGNOSER = RuleDiagnoser()


class Landscape:
    """A stand-in for expert + evaluator: block sizes near 2048 run fastest; some children fail.

    Candidate ids and clocks follow the plans, so two brains that plan alike build identical
    histories.
    """

    def __init__(self, seed: int, fail: float = 0.15) -> None:
        self.rng = np.random.default_rng(seed)
        self.fail = fail
        self.at = 2000.0

    def evaluate(self, brain: IslandBrain, plan: RequestPlan) -> Feedback:
        parent_block = int(plan.parent.proposal.params.get("BLOCK_SIZE", 128)) if plan.parent else 128
        step = int(np.random.default_rng(plan.seed).integers(-1, 3))  # the expert's own seeded mutation
        block = int(min(16384, max(32, parent_block * 2.0**step)))
        proposal = Proposal(
            source=f.KERNEL, language=KernelLanguage.TRITON, params={"BLOCK_SIZE": block, "num_warps": 4}
        )
        self.at += 1.0
        cand = plan.candidate(brain.spec, proposal).model_copy(
            update={"candidate_id": f"c-{plan.plan_id}", "created_at": self.at}
        )
        brain.on_reply(plan, 1)
        result: EvalResult
        if self.rng.random() < self.fail:
            result = f.failed(
                cand,
                EvalStatus.RUNTIME_ERROR,
                runtime_log="RuntimeError: CUDA error: an illegal memory access was encountered",
                created_at=self.at,
            )
        else:
            result = f.correct(cand, median_ms=0.1 * (1 + abs(math.log2(block) - 11)), bound_ms=0.05, at=self.at)
        diagnosis = DIAGNOSER.diagnose(result, cand).model_copy(update={"created_at": self.at})
        return f.feedback(cand, result, diagnosis)
