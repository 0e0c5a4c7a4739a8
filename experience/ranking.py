"""How retrieved experiences are ranked, and how their utility follows outcomes.

Retrieval is two-stage. The vector index returns the ``fetch`` nearest records by cosine
similarity ``s`` of the query text and the record text (both embed the task signature and the
diagnosis, see :mod:`experience.text`). Those candidates are filtered (``exclude_run``,
``min_utility``) and re-ranked by

    rank = s + w_diag * diag + w_sig * sig + w_util * (utility - 0.5)

* ``diag`` is 1 when the record answered the same diagnosis category as the query, 0.5 for the
  same family (``slow.*``, ``incorrect.*``...), else 0 (also when either has none);
* ``sig`` in [0, 1] compares task signatures: 0.5 x Jaccard of the op sets, 0.25 x Jaccard of the
  input dtypes, 0.25 x size closeness (1 for equal element counts, 0 at 1000x apart);
* ``utility`` in (0, 1) is the record's current utility (below).

Default weights (0.15, 0.10, 0.30) let a matching diagnosis or a proven record overtake a
slightly closer text, while a record whose advice keeps failing (utility near 0) loses 0.15 and
sinks below comparable records. Hits report ``s`` as ``score`` (the schema's meaning) and
arrive in ``rank`` order.

Utility is a discounted Beta-Bernoulli estimate. A record starts at ``(a, b) = (2, 1)`` when its
own child improved on its parent (utility 2/3) and ``(1, 2)`` otherwise (1/3). Every outcome
of advice that showed it updates ``a <- decay * a + r``, ``b <- decay * b + (1 - r)`` with ``r``
= 1 if the candidate improved, and utility = ``a / (a + b)``. With ``decay`` 0.9, evidence has a
half-life of about 6.6 outcomes: advice that stops working fades towards 0 within tens of
outcomes, whatever its past record, and the update is deterministic (no randomness needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from schemas import DiagnosisCategory, EvalStatus, Experience, Model, TaskSignature


class RankWeights(Model):
    """Weights of the re-ranking formula (see the module docstring)."""

    diagnosis: float = Field(default=0.15, ge=0, allow_inf_nan=False)
    """Weight of a matching diagnosis (category 1, family 0.5)."""
    signature: float = Field(default=0.10, ge=0, allow_inf_nan=False)
    """Weight of the task-signature similarity."""
    utility: float = Field(default=0.30, ge=0, allow_inf_nan=False)
    """Weight of ``utility - 0.5``."""


class UtilityModel(Model):
    """Discounted Beta-Bernoulli utility (see the module docstring)."""

    decay: float = Field(default=0.9, gt=0, le=1)
    """Factor applied to past evidence at each outcome (1 = never forget)."""

    @staticmethod
    def prior(exp: Experience) -> tuple[float, float]:
        """Starting ``(a, b)``: the record's own transition is its first piece of evidence."""
        delta = exp.delta
        improved = exp.status is EvalStatus.CORRECT and delta is not None and delta > 0
        return (2.0, 1.0) if improved else (1.0, 2.0)

    def update(self, a: float, b: float, improved: bool) -> tuple[float, float]:
        """``(a, b)`` after one outcome."""
        r = 1.0 if improved else 0.0
        return self.decay * a + r, self.decay * b + (1.0 - r)

    @staticmethod
    def value(a: float, b: float) -> float:
        """Utility in (0, 1)."""
        return a / (a + b)


@dataclass(frozen=True)
class SignatureKey:
    """The parts of a task signature that ranking compares, precomputed once per record."""

    ops: frozenset[str]
    dtypes: frozenset[str]
    log_numel: float | None

    @classmethod
    def of(cls, signature: TaskSignature) -> SignatureKey:
        """Key of ``signature``; ``log_numel`` is log10 of the inputs' total element count."""
        numel = sum(math.prod(t.shape) for t in signature.inputs)
        return cls(
            ops=frozenset(signature.ops),
            dtypes=frozenset(t.dtype for t in signature.inputs),
            log_numel=math.log10(numel) if numel > 0 else None,
        )


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def signature_similarity(a: SignatureKey, b: SignatureKey) -> float:
    """Similarity of two task signatures in [0, 1]."""
    size = 0.0
    if a.log_numel is not None and b.log_numel is not None:
        size = max(0.0, 1.0 - abs(a.log_numel - b.log_numel) / 3.0)
    return 0.5 * _jaccard(a.ops, b.ops) + 0.25 * _jaccard(a.dtypes, b.dtypes) + 0.25 * size


def diagnosis_match(query: DiagnosisCategory | None, record: DiagnosisCategory | None) -> float:
    """1 for the same category, 0.5 for the same family, 0 otherwise or when either is missing."""
    if query is None or record is None:
        return 0.0
    if query is record:
        return 1.0
    return 0.5 if query.family == record.family else 0.0


def rank_score(similarity: float, diag: float, sig: float, utility: float, weights: RankWeights) -> float:
    """The re-ranking score (higher first)."""
    return similarity + weights.diagnosis * diag + weights.signature * sig + weights.utility * (utility - 0.5)
