"""The candidate's own kernels timed one by one: a kernel's family from its name, and the
``kernel_times`` a spare's ``done`` frame carries (:mod:`gpu_runner.frames`) read into
:class:`schemas.KernelTime` records.

The times come from the candidate's process, after its timed calls (one more forward with a timer
around each of its own launches, :class:`gpu_runner.sandboxed.hooks.LaunchTimer`): evidence for the
diagnosis and the report, never for the verdict. That process runs the candidate's code, so
anything may arrive: a value that is not what an honest process sends gives no times at all, and
one warning line in the logs. Imports only the stdlib, structlog and :mod:`schemas` (the report
writer names families with :func:`kernel_family` too).
"""

from __future__ import annotations

import math
import re

import structlog

from gpu_runner.frames import KERNEL_NAME_CHARS, KERNEL_TIMES_KEPT, KernelTimer
from schemas import KernelTime, OpFamily

logger = structlog.get_logger(__name__)

TEMPLATE_KINDS = frozenset(
    {OpFamily.PW, OpFamily.ROW, OpFamily.MM, OpFamily.CONV, OpFamily.POOL, OpFamily.SCAN, OpFamily.ATTN, OpFamily.REC}
)
"""The kernel kinds the template expert writes (every family but layout and other)."""

_TEMPLATE_NAME = re.compile(r"_kf_([a-z]+)[0-9]+(?:_b)?")
"""A template kernel's name: ``_kf_<kind><index>``, ``_b`` after it for its any-batch copy."""
_BY_KIND = {f.value: f for f in TEMPLATE_KINDS}


def kernel_family(name: str) -> OpFamily | None:
    """The family a kernel's name says (the template expert's ``_kf_conv0``, ``_kf_mm12_b``);
    ``None`` for any other name."""
    found = _TEMPLATE_NAME.fullmatch(name)
    if found is None:
        return None
    return _BY_KIND.get(found.group(1))


class Malformed(ValueError):
    """What a candidate's process sent as its kernel times is not what an honest one sends."""


def read_kernel_times(raw: object, timer: object) -> tuple[tuple[KernelTime, ...], KernelTimer | None]:
    """The kernel times of a ``done`` frame (its ``kernel_times`` and ``kernel_timer``), largest
    first, at most :data:`KERNEL_TIMES_KEPT`, with their timer. Nothing (``()``, ``None``) where
    none came, or where what came is malformed: a timer not :class:`KernelTimer`'s, an entry not
    ``{"name", "launches", "time_us"}``, a name empty, longer than :data:`KERNEL_NAME_CHARS` or
    repeated, launches not a positive integer, a time not finite or negative."""
    if raw is None and timer is None:
        return (), None
    try:
        return _parse(raw, timer)
    except Malformed as exc:
        logger.warning("kernel_times_malformed", error=str(exc)[:300])
        return (), None


def _parse(raw: object, timer: object) -> tuple[tuple[KernelTime, ...], KernelTimer]:
    if not isinstance(timer, str) or timer not in {t.value for t in KernelTimer}:
        raise Malformed(f"timer {str(timer)[:60]!r} is none of {[t.value for t in KernelTimer]}")
    if not isinstance(raw, list) or not raw:
        raise Malformed(f"kernel_times is {type(raw).__name__}, not a list of kernels")
    out: list[KernelTime] = []
    seen: set[str] = set()
    for entry in raw:
        if not isinstance(entry, dict) or set(entry) != {"name", "launches", "time_us"}:
            raise Malformed(f"an entry is not {{name, launches, time_us}}: {str(entry)[:100]}")
        name, launches, time_us = entry["name"], entry["launches"], entry["time_us"]
        if not isinstance(name, str) or not 0 < len(name) <= KERNEL_NAME_CHARS or name in seen:
            raise Malformed(f"kernel name {str(name)[:60]!r}: empty, over {KERNEL_NAME_CHARS} characters or repeated")
        if type(launches) is not int or launches < 1:
            raise Malformed(f"{name[:60]}: launches {str(launches)[:30]} is not a positive integer")
        if type(time_us) not in (int, float) or not math.isfinite(time_us) or time_us < 0:
            raise Malformed(f"{name[:60]}: time {str(time_us)[:30]} us is not finite and >= 0")
        seen.add(name)
        out.append(KernelTime(name=name, family=kernel_family(name), launches=launches, time_us=float(time_us)))
    out.sort(key=lambda k: k.time_us, reverse=True)
    return tuple(out[:KERNEL_TIMES_KEPT]), KernelTimer(timer)
