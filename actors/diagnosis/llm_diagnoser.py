"""The LLM diagnoser: refines a rule-based ``Diagnosis`` with a model's reading of the evidence.

It uses the same endpoint configuration (``ExpertConfig``) and chat client as the LLM experts.
The model is shown the evaluation (verdict, numbers, findings, logs), the candidate's source and
the rule-based diagnosis, and answers with a JSON object: category, summary, evidence, hints,
suggested expert, confidence. What it may change is bounded: the category only within the
baseline's family (a compile error stays a compile error; anti-cheat rejections and at-SOL are
measured facts and never change), the distance to speed-of-light never (it is measured), the
suggested expert only to a known role. Its hints come first, then the rules' hints. On any
trouble (endpoint, budget, a reply that is not such a JSON object) the baseline is returned
unchanged except for one line of evidence saying why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from actors.llm.client import ChatClient, RetryPolicy, estimate_tokens
from actors.llm.errors import EndpointError
from actors.llm.metrics import DIAGNOSER_FALLBACKS
from actors.llm.prompts import ROLES, diagnosis_section, result_section
from actors.llm.redact import shorten
from schemas import Candidate, Diagnosis, DiagnosisCategory, EvalResult, ExpertConfig

log = structlog.get_logger(__name__)

REFINABLE_FAMILIES = frozenset({"compile", "runtime", "incorrect", "slow"})
"""Families whose category the model may refine (to another category of the same family)."""
MAX_HINTS = 6
HINT_LIMIT = 300
SOURCE_LIMIT = 12_000
REPLY_TOKENS = 1024
MAX_TEMPERATURE = 0.3


class _Verdict(BaseModel):
    model_config = ConfigDict(extra="ignore")
    category: str | None = None
    summary: str | None = None
    evidence: list[str] = []
    hints: list[str] = []
    suggested_expert: str | None = None
    confidence: float | None = None


class LLMDiagnoser:
    """Refines rule-based diagnoses through a chat model (see the module docstring)."""

    def __init__(
        self,
        config: ExpertConfig,
        *,
        environ: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.name = config.name
        self.version = f"llm:{config.name}@r{config.revision}"
        self.tokens_used = 0
        """Tokens spent over the diagnoser's life."""
        self._client = ChatClient.from_config(config, environ=environ, retry=retry, seed=seed)

    async def diagnose(self, result: EvalResult, candidate: Candidate | None, baseline: Diagnosis) -> Diagnosis:
        """The baseline refined by the model, or the baseline with a note when that failed."""
        messages = self._messages(result, candidate, baseline)
        prompt_est = sum(estimate_tokens(m["content"]) for m in messages)
        max_tokens = min(self.config.max_tokens, REPLY_TOKENS)
        budget = self.config.token_budget
        if budget is not None:
            max_tokens = min(max_tokens, budget - self.tokens_used - prompt_est)
            if max_tokens < 64:
                why = f"token budget exhausted ({self.tokens_used} of {budget} used)"
                return self._unrefined(baseline, why, "budget")
        try:
            reply = await self._client.complete(
                messages,
                temperature=min(self.config.temperature, MAX_TEMPERATURE),
                max_tokens=max_tokens,
            )
        except EndpointError as exc:
            return self._unrefined(baseline, self._client.redact(str(exc)), "endpoint")
        self.tokens_used += reply.usage.total
        text = self._client.redact(reply.choices[0].text) if reply.choices else ""
        verdict = parse_verdict(text)
        if verdict is None:
            return self._unrefined(baseline, "its reply was not a diagnosis JSON object", "reply")
        refined = self._merge(baseline, verdict)
        log.info(
            "llm.diagnosis",
            candidate_id=baseline.candidate_id,
            baseline=baseline.category.value,
            category=refined.category.value,
            tokens=reply.usage.total,
        )
        return refined

    def _messages(self, result: EvalResult, candidate: Candidate | None, baseline: Diagnosis) -> list[dict[str, str]]:
        family = baseline.category.family
        if family in REFINABLE_FAMILIES:
            allowed = [c.value for c in DiagnosisCategory if c.family == family]
            rule = f"`category` must be one of: {', '.join(allowed)}."
        else:
            rule = f"`category` must stay {baseline.category.value} (it is a measured fact)."
        system = (
            "You diagnose GPU kernel candidates (Triton or CUDA) from their evaluation. Read the "
            "evidence, find the root cause, and say what a kernel engineer should try next. Reply "
            "with one JSON object and nothing else, with keys: category, summary (one sentence), "
            "evidence (list of short facts you rely on, quoted from the evaluation), hints (list "
            "of concrete actions, most promising first), suggested_expert (one of "
            f"{', '.join(ROLES)}), confidence (0 to 1). {rule}"
        )
        parts = [result_section(result)]
        if candidate is not None:
            source = shorten(candidate.proposal.source, SOURCE_LIMIT)
            parts.append(f"## The candidate's source\n```python\n{source}\n```")
        parts.append(diagnosis_section(baseline).replace("## Diagnosis:", "## Rule-based diagnosis (refine it):", 1))
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def _merge(self, baseline: Diagnosis, verdict: _Verdict) -> Diagnosis:
        category = baseline.category
        evidence = list(baseline.evidence)
        if verdict.category and verdict.category != category.value:
            proposed = _category(verdict.category)
            if proposed is not None and category.family in REFINABLE_FAMILIES and proposed.family == category.family:
                evidence.append(f"llm: refined {category.value} to {proposed.value}")
                category = proposed
            else:
                evidence.append(f"llm: proposed {shorten(verdict.category, 60)}, kept {category.value}")
        evidence.extend(f"llm: {shorten(e.strip(), HINT_LIMIT)}" for e in verdict.evidence[:4] if e.strip())
        hints = list(
            dict.fromkeys(shorten(h.strip(), HINT_LIMIT) for h in [*verdict.hints, *baseline.hints] if h.strip())
        )
        suggested = verdict.suggested_expert if verdict.suggested_expert in ROLES else baseline.suggested_expert
        confidence = baseline.confidence
        if category is not baseline.category:
            confidence = min(max(verdict.confidence if verdict.confidence is not None else 0.6, 0.0), 0.9)
        summary = shorten(verdict.summary.strip(), HINT_LIMIT) if verdict.summary and verdict.summary.strip() else None
        return baseline.model_copy(
            update={
                "category": category,
                "summary": summary or baseline.summary,
                "evidence": tuple(evidence),
                "hints": tuple(hints[:MAX_HINTS]),
                "suggested_expert": suggested,
                "confidence": confidence,
                "diagnoser": f"{baseline.diagnoser}+{self.version}" if baseline.diagnoser else self.version,
            }
        )

    def _unrefined(self, baseline: Diagnosis, why: str, cause: str) -> Diagnosis:
        """The baseline with a note saying why the model's reading is not in it (counted by
        ``cause`` in ``kfoundry_llm_diagnoser_fallbacks``, :mod:`actors.llm.metrics`)."""
        DIAGNOSER_FALLBACKS.labels(self.name, cause).inc()
        log.warning("llm.diagnosis_skipped", candidate_id=baseline.candidate_id, reason=why, cause=cause)
        note = f"llm diagnoser {self.name} not applied: {shorten(why, HINT_LIMIT)}"
        return baseline.model_copy(update={"evidence": (*baseline.evidence, note)})

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()


def _category(value: str) -> DiagnosisCategory | None:
    try:
        return DiagnosisCategory(value.strip())
    except ValueError:
        return None


def parse_verdict(text: str) -> _Verdict | None:
    """The JSON object in a reply (bare, fenced, or embedded in prose), validated; ``None`` if none."""
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*\n(.*?)\n\s*```", text, re.DOTALL)
    if fenced is not None:
        candidates.append(fenced.group(1))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            data: Any = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        try:
            return _Verdict.model_validate(data)
        except ValidationError:
            return None
    return None
