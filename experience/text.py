"""What is embedded: the text of an experience record and of a query, in one shared layout.

Both start with the task signature and the diagnosis in the same words, so a query for a task
and a diagnosis lands near experiences about similar tasks under that diagnosis; the record
then adds what was done (expert, strategy, description, parameter names) and how it went. The
diagnosis is written in words (``slow memory bound``), which both embedders match better than
the dotted enum value.
"""

from __future__ import annotations

from schemas import DiagnosisCategory, Experience, ExperienceQuery, TaskSignature

_DESCRIPTION_LIMIT = 600
_QUERY_TEXT_LIMIT = 600


def diagnosis_words(category: DiagnosisCategory | None) -> str:
    """The category in words (``slow.memory_bound`` -> ``slow memory bound``), or ``none``."""
    if category is None:
        return "none"
    return category.value.replace(".", " ").replace("_", " ")


def signature_text(signature: TaskSignature) -> str:
    """Ops, input and output tensors of a task, as one line."""
    outs = ", ".join(f"{t.dtype}{list(t.shape)}" for t in signature.outputs)
    return f"task {signature.text()}; outputs: {outs or '?'}"


def _outcome(exp: Experience) -> str:
    delta = exp.delta
    if exp.child_fitness is None:
        return f"outcome: {exp.status.value.replace('_', ' ')}"
    trend = "no change" if delta is None or delta == 0 else ("improved" if delta > 0 else "regressed")
    return f"outcome: {exp.status.value}, {trend}, speedup {exp.child_fitness:.2f}x"


def experience_text(exp: Experience) -> str:
    """The text embedded for a record: task, diagnosis, what the expert did, and how it went."""
    params = ", ".join(f"{k}={v}" for k, v in sorted(exp.params.items()))
    lines = [
        signature_text(exp.signature),
        f"diagnosis: {diagnosis_words(exp.diagnosis)}",
        f"expert: {exp.expert}; strategy: {exp.strategy or 'unspecified'}",
        f"change: {exp.description[:_DESCRIPTION_LIMIT]}",
    ]
    if params:
        lines.append(f"params: {params}")
    lines.append(_outcome(exp))
    return "\n".join(lines)


def query_text(q: ExperienceQuery) -> str:
    """The text embedded for a query: the same task and diagnosis lines, then its free text."""
    lines = [signature_text(q.signature), f"diagnosis: {diagnosis_words(q.diagnosis)}"]
    if q.text:
        lines.append(q.text[:_QUERY_TEXT_LIMIT])
    return "\n".join(lines)
