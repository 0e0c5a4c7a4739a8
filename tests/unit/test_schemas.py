"""The wire contract: strictness, round trips, descriptions, and the exported JSON Schemas."""

from __future__ import annotations

import pydantic
import pytest

import schemas as s
from schemas import export, subjects


def _task() -> s.Task:
    return s.Task.from_source("relu", "import torch\nclass Model(torch.nn.Module): ...\n")


def _candidate() -> s.Candidate:
    return s.Candidate(
        run_id="r1",
        island="i0",
        task_id=_task().task_id,
        expert="template",
        proposal=s.Proposal(source="class ModelNew: ...", language=s.KernelLanguage.TRITON),
    )


def test_every_message_round_trips_through_json() -> None:
    cand = _candidate()
    result = s.EvalResult(
        run_id="r1",
        candidate_id=cand.candidate_id,
        task_id=cand.task_id,
        status=s.EvalStatus.INCORRECT,
        summary="wrong",
        correctness=s.Correctness(trials=5, passed_trials=0, atol=1e-5, rtol=1e-5),
    )
    diag = s.Diagnosis(candidate_id=cand.candidate_id, category=s.DiagnosisCategory.INCORRECT_BOUNDARY, summary="x")
    fb = s.Feedback(run_id="r1", island="i0", candidate=cand, result=result, diagnosis=diag)
    for msg in (cand, result, diag, fb, s.RunSpec(task=_task()), s.Control(action=s.ControlAction.DRAIN)):
        back = s.decode_any(msg.to_bytes())
        assert back == msg
        assert type(back) is type(msg)


def test_messages_are_frozen_and_refuse_unknown_fields() -> None:
    cand = _candidate()
    with pytest.raises(pydantic.ValidationError):
        cand.island = "other"  # type: ignore[misc]
    data = cand.model_dump(mode="json") | {"surprise": 1}
    with pytest.raises(pydantic.ValidationError, match="surprise"):
        s.Candidate.model_validate(data)


def test_decode_any_rejects_unknown_type_and_wrong_version() -> None:
    with pytest.raises(s.UnknownMessageType, match="nope"):
        s.decode_any(b'{"type": "nope"}')
    data = _candidate().model_dump(mode="json") | {"schema_version": 99}
    with pytest.raises(pydantic.ValidationError, match="schema_version"):
        s.Candidate.model_validate(data)


@pytest.mark.parametrize("name", sorted(s.MESSAGE_TYPES))
def test_every_field_of_every_message_has_a_docstring(name: str) -> None:
    missing: list[str] = []

    def visit(cls: type[pydantic.BaseModel], path: str) -> None:
        for field_name, field in cls.model_fields.items():
            if not field.description:
                missing.append(f"{path}.{field_name}")
            ann = field.annotation
            for arg in (*getattr(ann, "__args__", ()), ann):
                if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel) and arg is not cls:
                    visit(arg, f"{path}.{field_name}")

    visit(s.MESSAGE_TYPES[name], name)
    assert missing == []


def test_exported_json_schemas_are_current() -> None:
    assert export.stale() == [], "run `python -m schemas.export` and commit schemas/json"


def test_subject_builders_refuse_tokens_that_would_break_subjects() -> None:
    assert subjects.candidates("run1", "i0", "c1") == "kf.run1.cand.i0.c1"
    assert subjects.candidates("run1") == "kf.run1.cand.*.*"
    with pytest.raises(ValueError, match="not a valid id"):
        subjects.candidates("run.1", "i0")
    with pytest.raises(ValueError, match="not a valid id"):
        s.RunSpec(task=_task(), run_id="has space")


def test_budget_needs_a_limit_and_llm_expert_needs_an_endpoint() -> None:
    with pytest.raises(pydantic.ValidationError, match="at least one limit"):
        s.Budget(wall_s=None, candidates=None, tokens=None)
    with pytest.raises(pydantic.ValidationError, match="needs base_url and model"):
        s.ExpertConfig(name="gpt", kind=s.ExpertKind.LLM)
    with pytest.raises(pydantic.ValidationError, match="http"):
        s.ExpertConfig(name="gpt", kind=s.ExpertKind.LLM, base_url="ftp://x", model="m")


def test_expert_config_never_serialises_its_key() -> None:
    cfg = s.ExpertConfig(
        name="gpt",
        kind=s.ExpertKind.LLM,
        base_url="http://127.0.0.1:1/v1",
        model="m",
        api_key=pydantic.SecretStr("sk-very-secret"),
    )
    assert "sk-very-secret" not in cfg.model_dump_json()
    assert "sk-very-secret" not in repr(cfg)


def test_every_cheat_rule_has_a_rejected_category() -> None:
    for rule in s.CheatRule:
        assert s.DiagnosisCategory.for_rule(rule).family == "rejected"


def test_reply_needs_proposals_or_decline() -> None:
    with pytest.raises(pydantic.ValidationError, match="proposals or a decline"):
        s.GenerateReply(request_id="x", expert="template")


def test_fitness_only_for_clean_results() -> None:
    base = {"run_id": "r", "candidate_id": "c", "task_id": "t", "summary": "ok", "speedup_vs_eager": 2.0}
    assert s.EvalResult(status=s.EvalStatus.CORRECT, **base).fitness == 2.0  # type: ignore[arg-type]
    flagged = s.EvalResult(status=s.EvalStatus.CORRECT, review=("too fast",), **base)  # type: ignore[arg-type]
    assert flagged.fitness is None
    assert s.EvalResult(status=s.EvalStatus.INCORRECT, **base).fitness is None  # type: ignore[arg-type]
