"""The contract between actors: every wire message, the enums, and the subject builders."""

from __future__ import annotations

import json
from typing import Any

from schemas.base import READABLE_VERSIONS, SCHEMA_VERSION, Message, Model, Token, new_id, now
from schemas.candidate import (
    Candidate,
    Decline,
    ExpertConfig,
    GenerateReply,
    GenerateRequest,
    ParamValue,
    Proposal,
    TokenUsage,
)
from schemas.control import ActorInfo, ActorStats, Control, DeadLetter
from schemas.diagnosis import Diagnosis
from schemas.enums import (
    ActorKind,
    ActorState,
    CheatRule,
    CheckName,
    CheckOutcome,
    ControlAction,
    DeclineReason,
    DeviceChoice,
    DeviceKind,
    DiagnosisCategory,
    EvalStatus,
    ExpertKind,
    KernelLanguage,
    MigrationReason,
    OpFamily,
    PrecisionMode,
    Role,
    Severity,
    StopReason,
    TimerKind,
    TorchOpsPolicy,
)
from schemas.evaluation import (
    LOWER_PRECISION,
    Baselines,
    Check,
    Correctness,
    DeviceInfo,
    EvalResult,
    FamilyShare,
    Finding,
    HardwareCounters,
    KernelTime,
    OpTime,
    Profile,
    ReferenceProfile,
    ShapeCheck,
    SpeedOfLight,
    StageTimes,
    StallShare,
    TimingStats,
)
from schemas.evolution import (
    Elite,
    EliteAnnouncement,
    EvalOutcome,
    Feedback,
    IslandStatus,
    Migration,
    RunEnd,
    RunStop,
)
from schemas.experience import (
    Experience,
    ExperienceBatch,
    ExperienceHit,
    ExperienceHits,
    ExperienceItem,
    ExperienceOutcome,
    ExperienceQuery,
)
from schemas.task import (
    Ablations,
    Budget,
    ExpertRef,
    IslandLimits,
    MigrationPolicy,
    RunSpec,
    Task,
    TaskSignature,
    TensorSpec,
    source_fingerprint,
    split_evenly,
)

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        RunSpec,
        Task,
        GenerateRequest,
        GenerateReply,
        Candidate,
        ExpertConfig,
        EvalResult,
        Diagnosis,
        Feedback,
        EliteAnnouncement,
        Migration,
        IslandStatus,
        RunEnd,
        RunStop,
        Experience,
        ExperienceQuery,
        ExperienceHits,
        ExperienceOutcome,
        ExperienceBatch,
        Control,
        ActorInfo,
        DeadLetter,
    )
}
"""Every wire message by its ``type`` name."""


class UnknownMessageType(ValueError):
    """A payload whose ``type`` names no message of this contract."""


def decode_any(data: bytes | str) -> Message:
    """Decode a payload of any message type, by its ``type`` field.

    Raises ``pydantic.ValidationError`` for an invalid message, ``UnknownMessageType`` for an
    unknown ``type`` and ``ValueError`` for bytes that are not a JSON object.
    """
    obj: Any = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("payload is not a JSON object")
    name = obj.get("type")
    cls = MESSAGE_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownMessageType(f"unknown message type {name!r}")
    return cls.model_validate(obj)


__all__ = [
    "LOWER_PRECISION",
    "MESSAGE_TYPES",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "Ablations",
    "ActorInfo",
    "ActorKind",
    "ActorState",
    "ActorStats",
    "Baselines",
    "Budget",
    "Candidate",
    "CheatRule",
    "Check",
    "CheckName",
    "CheckOutcome",
    "Control",
    "ControlAction",
    "Correctness",
    "DeadLetter",
    "Decline",
    "DeclineReason",
    "DeviceChoice",
    "DeviceInfo",
    "DeviceKind",
    "Diagnosis",
    "DiagnosisCategory",
    "Elite",
    "EliteAnnouncement",
    "EvalOutcome",
    "EvalResult",
    "EvalStatus",
    "Experience",
    "ExperienceBatch",
    "ExperienceHit",
    "ExperienceHits",
    "ExperienceItem",
    "ExperienceOutcome",
    "ExperienceQuery",
    "ExpertConfig",
    "ExpertKind",
    "ExpertRef",
    "FamilyShare",
    "Feedback",
    "Finding",
    "GenerateReply",
    "GenerateRequest",
    "HardwareCounters",
    "IslandLimits",
    "IslandStatus",
    "KernelLanguage",
    "KernelTime",
    "Message",
    "Migration",
    "MigrationPolicy",
    "MigrationReason",
    "Model",
    "OpFamily",
    "OpTime",
    "ParamValue",
    "PrecisionMode",
    "Profile",
    "Proposal",
    "ReferenceProfile",
    "Role",
    "RunEnd",
    "RunSpec",
    "RunStop",
    "Severity",
    "ShapeCheck",
    "SpeedOfLight",
    "StageTimes",
    "StallShare",
    "StopReason",
    "Task",
    "TaskSignature",
    "TensorSpec",
    "TimerKind",
    "TimingStats",
    "Token",
    "TokenUsage",
    "TorchOpsPolicy",
    "UnknownMessageType",
    "decode_any",
    "new_id",
    "now",
    "source_fingerprint",
    "split_evenly",
]
