"""The frames the evaluator and its workers exchange: one definition of each, read by both sides.

A frame's header is a JSON object (:mod:`gpu_runner.protocol` carries it and its tensors). The
parent sends *ops* (``{"op": ...}``) and a worker answers with *reports* (``{"kind": ...}``).
Each op and each report has its fields declared here, with their JSON types. The parent builds
every op with :func:`op_frame`, which refuses a missing, unknown or mistyped field, and the worker
reads it back with :func:`decode_op`. The parent reads every report through
:func:`decode_report`: a worker runs candidate code, so an unknown kind or a declared field that
is missing or of the wrong type is a :class:`~gpu_runner.protocol.FrameError`, never a guess.
Reports may carry more fields than they declare (measurements the parent keeps for its logs);
the parent reads only the declared ones as trusted shapes. Stdlib only: workers import it before
the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NewType, TypedDict

from gpu_runner.protocol import FrameError

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))
_OPT_DICT = (dict, type(None))


@dataclass(frozen=True)
class ListOf:
    """A JSON array whose every item decodes to ``item``."""

    item: type


Fields = Mapping[str, tuple[type, ...] | type | ListOf]
"""Field name -> the Python type(s) its JSON value decodes to."""


OpFrame = NewType("OpFrame", dict[str, Any])
"""The header of an op built (and checked) by :func:`op_frame`: the only thing a worker is sent."""


class Op(StrEnum):
    """What the parent asks of a worker (the ``op`` of a frame it sends)."""

    PREPARE = "prepare"
    """Run worker: load the task's reference and ship its outputs for every trial."""
    JOB = "job"
    """Run worker: stage one candidate in the sandbox (then ``go`` and ``time``)."""
    GO = "go"
    """Run worker: the GPU lease is held; run the correctness trials."""
    TIME = "time"
    """Run worker: the GPU is exclusive now; time the candidate and the baselines."""
    MEASURE = "measure"
    """Run worker: report the task's sizes and FLOPs before any preparation."""
    COMPILE = "compile"
    """Compile worker: build one candidate's kernels ahead of time, in the sandbox."""
    JUDGE = "judge"
    """Judge worker: compare one trial's output files with the reference, on the device."""
    GPU_GRANTED = "gpu_granted"
    """Any worker: the shared GPU lease it asked for (``gpu_acquire``) is granted."""


class Report(StrEnum):
    """What a worker tells the parent (the ``kind`` of a frame it sends)."""

    READY = "ready"
    PREPARED = "prepared"
    REFERENCE = "reference"
    REFERENCE_ERROR = "reference_error"
    PREPARE_TIME = "prepare_time"
    MEASURED = "measured"
    """From a measuring worker: the task's sizes; from a run worker: timing is over."""
    SANDBOX = "sandbox"
    ARMED = "armed"
    TRIAL = "trial"
    TRIALS_DONE = "trials_done"
    MEMORY = "memory"
    PROFILE = "profile"
    TIMING = "timing"
    DONE = "done"
    ERROR = "error"
    COMPILED = "compiled"
    JUDGED = "judged"
    GPU_ACQUIRE = "gpu_acquire"
    GPU_RELEASE = "gpu_release"


class SandboxSettings(TypedDict, total=False):
    """What a worker applies to itself before it imports a candidate (the ``sandbox`` of a
    ``job`` or ``compile``), built once by :func:`gpu_runner.isolation.sandbox_settings`."""

    cwd: str
    data_bytes: int
    fsize_bytes: int
    nproc: int
    uid: int | None
    gid: int | None
    mem_fraction: float
    strict: bool
    landlock: dict[str, list[str]]
    seccomp: str


OP_FIELDS: dict[Op, Fields] = {
    Op.PREPARE: {
        "reference_source": str,
        "init_seed": int,
        "trial_seeds": list,
        "compiled_baseline": bool,
        "flops": _OPT_NUM,
        "device_verdict": bool,
        "inputs_on_device": bool,
        "in_place_bytes": int,
    },
    Op.JOB: {
        "candidate_path": str,
        "ext_manifest": dict,
        "sandbox": dict,
        "atol": _NUM,
        "rtol": _NUM,
        "timing": dict,
        "profile_kernels": bool,
        "device_verdict": bool,
        "poison_bytes": _OPT_INT,
        "in_place_bytes": int,
        "admitted_aten_ops": list,
    },
    Op.GO: {},
    Op.TIME: {},
    Op.MEASURE: {"reference_source": str},
    Op.COMPILE: {
        "candidate_path": str,
        "reference_source": str,
        "build_root": str,
        "target": _OPT_DICT,
        "triton_kernels": list,
        "sandbox": dict,
    },
    Op.JUDGE: {
        "reference_source": str,
        "init_seed": int,
        "seed": int,
        "on_device": bool,
        "input_sums": list,
        "outputs": list,
    },
    Op.GPU_GRANTED: {},
}
"""Every field of every op: the parent sends exactly these."""

REPORT_FIELDS: dict[Report, Fields] = {
    Report.READY: {"device": dict, "pid": int, "phases": dict},
    Report.PREPARED: {"out_metas": list, "phases": dict},
    Report.REFERENCE: {"trial": int, "n_outputs": int, "tensors": ListOf(dict)},
    Report.REFERENCE_ERROR: {"etype": str, "message": str},
    Report.PREPARE_TIME: {"seconds": _NUM},
    Report.MEASURED: {},
    Report.SANDBOX: {"checks": dict, "phases": dict},
    Report.ARMED: {},
    Report.TRIAL: {"trial": int, "tensors": ListOf(dict), "info": dict},
    Report.TRIALS_DONE: {},
    Report.MEMORY: {"peak_bytes": int},
    Report.PROFILE: {"kernels": ListOf(str)},
    Report.TIMING: {},
    Report.DONE: {"phases": dict},
    Report.ERROR: {"stage": str, "etype": str, "message": str},
    Report.COMPILED: {"ok": bool},
    Report.JUDGED: {"results": ListOf(dict)},
    Report.GPU_ACQUIRE: {},
    Report.GPU_RELEASE: {},
}
"""The fields each report must carry, as the parent reads them."""


def _check(what: str, header: Mapping[str, Any], fields: Fields, exact: bool) -> None:
    for name, types in fields.items():
        if name not in header:
            raise FrameError(f"{what} has no {name!r}")
        value = header[name]
        if isinstance(types, ListOf):
            if not isinstance(value, list) or not all(isinstance(x, types.item) for x in value):
                raise FrameError(f"{what}: {name!r} is not a list of {types.item.__name__}")
            continue
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise FrameError(f"{what}: {name!r} is a bool")  # JSON true is no number
        if not isinstance(value, types):
            raise FrameError(f"{what}: {name!r} is a {type(value).__name__}")
    if exact:
        extra = sorted(set(header) - set(fields) - {"op", "blobs"})
        if extra:
            raise FrameError(f"{what} has undeclared fields {extra}")


def op_frame(op: Op, **fields: Any) -> OpFrame:
    """The header of one op, checked against its declaration (a parent bug fails here, loudly)."""
    _check(f"op {op.value}", fields, OP_FIELDS[op], exact=True)
    return OpFrame({"op": op.value, **fields})


def decode_op(header: Mapping[str, Any]) -> Op:
    """The op of a frame the parent sent, its fields checked; :class:`FrameError` if it is not one."""
    try:
        op = Op(str(header.get("op")))
    except ValueError:
        raise FrameError(f"unknown op {header.get('op')!r}") from None
    _check(f"op {op.value}", header, OP_FIELDS[op], exact=True)
    return op


def decode_report(header: dict[str, Any]) -> Report:
    """The kind of a frame a worker sent, its declared fields checked; :class:`FrameError` if it is not one.

    The header's ``kind`` becomes the :class:`Report` member (equal to its string)."""
    try:
        kind = Report(str(header.get("kind")))
    except ValueError:
        raise FrameError(f"unknown report kind {str(header.get('kind'))[:40]!r}") from None
    _check(f"{kind.value} report", header, REPORT_FIELDS[kind], exact=False)
    header["kind"] = kind
    return kind
