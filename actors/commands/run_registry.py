"""The runs a NATS server knows, as an operator sees them: each one's state, and what is done to
one: its id refused to a new run, a request that it stop, its removal.

Reads:  the ``kf_runs`` bucket (``RunSpec`` by run id; ``<run>.issued``, the candidates issued), and
        each run's stream ``KF_RUN_<run>``: ``RunEnd`` (``kf.<run>.end``), ``RunStop``
        (``kf.<run>.stop``), the last ``IslandStatus`` of each island (``kf.<run>.status.<island>``),
        the count of results (``kf.<run>.result.<island>``) and the stream's consumers (a controller
        reading it is a running run).
Writes: ``RunSpec`` (create-only: ``register_new_run``, for the controller), ``RunStop`` on
        ``kf.<run>.stop``; ``remove_run`` deletes the run's stream, its keys in ``kf_runs``,
        ``kf_archives`` and ``kf_prompts``, and its dead letters (``kf.dlq.<run>`` in ``KF_DLQ``).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TypeVar

import nats.errors
import nats.js.errors
import pydantic
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from actors.commands.progress import CONTROLLER_CONSUMER
from actors.runtime.bus import Bus, settled
from actors.runtime.errors import ConfigError, RunIdTaken
from actors.runtime.kv import bucket, create_run
from actors.runtime.quota import issued_key
from schemas import DeviceChoice, IslandStatus, RunEnd, RunSpec, RunStop, StopReason, new_id, subjects

READ_SAMPLES = 3
"""How often a run's consumers are looked at before it counts as read by nobody: a reader's pull
request is renewed every quarter second, and between two of them the server may show none."""
READ_SAMPLE_S = 0.15
"""The wait between two looks."""
PARALLEL_READS = 16
"""Runs read at once by ``list_runs``."""


class RunState(StrEnum):
    """Where a run is, as far as the NATS server can tell."""

    RUNNING = "running"
    """No end recorded, and a controller reads its stream."""
    ENDED = "ended"
    """Its ``RunEnd`` is in its stream."""
    ABANDONED = "abandoned"
    """No end recorded and no controller reads its stream: its ``kfoundry run`` was killed, or
    lost its server for good."""
    EXPIRED = "expired"
    """Registered, but its stream is gone, or empty and older than the stream keeps messages (a week)."""


@dataclass(frozen=True)
class RunInfo:
    """One run as the server knows it."""

    run_id: str
    spec: RunSpec | None
    """Its registered spec; ``None``: no registry entry (or one this version cannot read)."""
    registered: bool
    """Whether the registry holds an entry for it (readable or not)."""
    state: RunState
    end: RunEnd | None
    stop: RunStop | None
    """The last stop request made of it, if any."""
    messages: int | None
    """Messages in its stream; ``None`` when it has no stream."""
    results: int
    """Results in its stream (candidates evaluated so far)."""
    issued: int | None
    """Candidates issued (the run's quota counter), where counted."""
    best: float | None
    """Its best speedup over eager: the end's, or while it runs the islands' latest."""
    readers: tuple[str, ...]
    """Consumers of its stream being read now (a controller, evaluators, islands, a tap)."""

    @property
    def created_at(self) -> float | None:
        return self.spec.created_at if self.spec is not None else None

    @property
    def evaluated(self) -> int:
        return self.end.evaluated if self.end is not None else self.results

    @property
    def on_cpu(self) -> bool:
        """Timed on the CPU: its "speedups" are not speedups."""
        return self.spec is not None and self.spec.device is DeviceChoice.CPU

    def state_text(self) -> str:
        """``running``, ``ended (candidates)``, ``ended (stopped by alice@host)``, ``abandoned``, …"""
        if self.end is None:
            return str(self.state)
        if self.stop is not None and self.end.reason is StopReason.INTERRUPTED and self.stop.at <= self.end.at:
            return f"ended (stopped by {self.stop.by})"
        return f"ended ({self.end.reason})"

    def holder(self, task_id: str | None = None) -> str:
        """What holds the run id, for a refusal: state, age, task (``task_id``: the new run's)."""
        parts = [self.state_text()]
        if self.created_at is not None:
            parts[0] += f", registered {age_text(time.time() - self.created_at)} ago"
        if self.spec is not None:
            same = ", the same task" if self.spec.task.task_id == task_id else ""
            parts.append(f"task {self.spec.task.name} {self.spec.task.task_id}{same}")
        elif self.messages:
            parts.append(f"no registry entry, {self.messages} message(s) in its stream")
        return "; ".join(parts)


def age_text(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: how long ago, in the largest whole unit."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def operator() -> str:
    """``user@host`` of this process, for a stop request."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "?"
    return f"{user}@{socket.gethostname()}"


# -- reading -------------------------------------------------------------------------------


async def _last(bus: Bus, run_id: str, subject: str) -> bytes | None:
    """The payload of the last message on ``subject`` in the run's stream; ``None`` if none."""
    try:
        msg = await settled(f"reading {subject}", lambda: bus.js.get_last_msg(subjects.run_stream(run_id), subject))
    except nats.js.errors.NotFoundError:
        return None
    return msg.data or None


M = TypeVar("M", bound=pydantic.BaseModel)


def _model(cls: type[M], data: bytes | None) -> M | None:
    """``data`` as a ``cls``; ``None`` for none, or for one this version cannot read."""
    if data is None:
        return None
    try:
        return cls.model_validate_json(data)
    except pydantic.ValidationError:
        return None


async def _readers(bus: Bus, run_id: str, *, until: Callable[[tuple[str, ...]], bool], samples: int) -> tuple[str, ...]:
    """Consumers of the run's stream being read (a pull waiting or a push subscriber bound), looked
    at up to ``samples`` times until ``until`` holds of what was seen."""
    seen: set[str] = set()
    for i in range(samples):
        if i:
            await asyncio.sleep(READ_SAMPLE_S)
        try:
            infos = await settled(
                "listing the run's consumers", lambda: bus.js.consumers_info(subjects.run_stream(run_id))
            )
        except nats.js.errors.NotFoundError:
            return ()
        seen |= {c.name for c in infos if c.num_waiting or c.push_bound}
        if until(tuple(sorted(seen))):
            break
    return tuple(sorted(seen))


async def read_run(bus: Bus, run_id: str, *, samples: int = READ_SAMPLES) -> RunInfo | None:
    """What the server knows of ``run_id``; ``None`` when it knows nothing (no registry entry, no
    stream). A run with no end is looked at ``samples`` times for a controller reading it."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    raw = await _entry(kv, run_id)
    spec = _model(RunSpec, raw)
    stream = subjects.run_stream(run_id)
    try:
        info = await settled(
            f"reading stream {stream}", lambda: bus.js.stream_info(stream, subjects_filter=subjects.results(run_id))
        )
    except nats.js.errors.NotFoundError:
        info = None
    if raw is None and info is None:
        return None
    messages = None if info is None else int(info.state.messages)
    results = 0 if info is None else sum((info.state.subjects or {}).values())
    end = stop = None
    best: float | None = None
    readers: tuple[str, ...] = ()
    if messages:
        end = _model(RunEnd, await _last(bus, run_id, subjects.run_end(run_id)))
        stop = _model(RunStop, await _last(bus, run_id, subjects.run_stop(run_id)))
    if info is not None:
        # An ended run's readers are looked at once (they matter to its removal, which looks again).
        readers = await _readers(
            bus, run_id, until=lambda seen: CONTROLLER_CONSUMER in seen, samples=1 if end is not None else samples
        )
    if end is not None:
        state, best = RunState.ENDED, end.best_fitness
    else:
        if spec is not None and messages:
            statuses = [
                _model(IslandStatus, await _last(bus, run_id, subjects.island_status(run_id, island)))
                for island in spec.island_names()
            ]
            best = max((s.best_fitness for s in statuses if s is not None and s.best_fitness), default=None)
        if CONTROLLER_CONSUMER in readers:
            state = RunState.RUNNING
        elif info is None or (
            not messages and spec is not None and time.time() - spec.created_at > (info.config.max_age or float("inf"))
        ):
            state = RunState.EXPIRED  # its messages are older than the stream keeps them (a week)
        else:
            state = RunState.ABANDONED
    issued_raw = await _entry(kv, issued_key(run_id))
    issued = int(issued_raw) if issued_raw and issued_raw.isdigit() else None
    return RunInfo(run_id, spec, raw is not None, state, end, stop, messages, results, issued, best, readers)


async def _entry(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await settled(f"reading {key!r} from bucket {subjects.RUNS_BUCKET}", lambda: kv.get(key))
    except nats.js.errors.NotFoundError:  # absent, or deleted
        return None
    return entry.value or None


async def list_runs(bus: Bus) -> list[RunInfo]:
    """Every registered run, newest first (unreadable entries last)."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    try:
        keys = await settled(f"listing bucket {subjects.RUNS_BUCKET}", kv.keys)
    except nats.js.errors.NoKeysError:
        return []
    ids = sorted(k for k in keys if "." not in k)  # ``<run>.issued`` keys are the runs' counters
    gate = asyncio.Semaphore(PARALLEL_READS)

    async def one(run_id: str) -> RunInfo | None:
        async with gate:
            return await read_run(bus, run_id)

    runs = [r for r in await asyncio.gather(*(one(i) for i in ids)) if r is not None]
    return sorted(runs, key=lambda r: r.created_at or 0.0, reverse=True)


async def find_run(bus: Bus, run_id: str) -> RunInfo:
    """``run_id``'s info; ``ConfigError`` in one line when the server knows no such run."""
    try:
        subjects.run_stream(run_id)
    except ValueError as exc:  # not a run id at all: say so in one line
        raise ConfigError(str(exc)) from None
    run = await read_run(bus, run_id)
    if run is None:
        raise ConfigError(f"no run {run_id!r} on this NATS server (`kfoundry runs` lists the runs it knows)")
    return run


# -- a new run's id --------------------------------------------------------------------------


async def refuse_used_run_id(bus: Bus, spec: RunSpec) -> None:
    """``RunIdTaken`` if the server knows a run with ``spec``'s id (registered, or with messages in
    its stream); it is never overwritten. A run cannot be resumed under its id."""
    run = await read_run(bus, spec.run_id, samples=1)
    if run is not None and (run.registered or run.messages):
        raise RunIdTaken(spec.run_id, run.holder(spec.task.task_id))


async def register_new_run(bus: Bus, spec: RunSpec) -> None:
    """Create the run's stream and register its spec, if its id is free (checked again here, and
    the registration is create-only: of two runs started at once with one id, one is refused)."""
    await refuse_used_run_id(bus, spec)
    await bus.ensure_run_stream(spec.run_id)
    if not await create_run(bus, spec):
        run = await read_run(bus, spec.run_id, samples=1)
        raise RunIdTaken(spec.run_id, run.holder(spec.task.task_id) if run is not None else "registered meanwhile")


# -- stopping ---------------------------------------------------------------------------------


async def request_stop(bus: Bus, run_id: str, *, reason: str | None, timeout: float | None) -> RunEnd | None:
    """Store a ``RunStop`` for the run's controller and wait up to ``timeout`` seconds (``None``:
    not at all) for the run's ``RunEnd``; returns it, or ``None`` if it did not come in time."""
    request = RunStop(run_id=run_id, by=operator(), reason=reason)
    ended = asyncio.get_running_loop().create_future()

    async def on_end(msg: Msg) -> None:
        if not ended.done():
            ended.set_result(msg.data)

    sub = await bus.nc.subscribe(subjects.run_end(run_id), cb=on_end) if timeout is not None else None
    try:
        await bus.publish_durable(subjects.run_stop(run_id), request, msg_id=f"stop-{new_id()}")
        if sub is None or timeout is None:
            return None
        data = await _last(bus, run_id, subjects.run_end(run_id))  # ended before the subscription
        if data is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    data = await ended
        return _model(RunEnd, data)
    finally:
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


# -- removing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Removed:
    """What ``remove_run`` deleted."""

    messages: int
    dead_letters: int


async def remove_run(bus: Bus, run: RunInfo) -> Removed:
    """Delete a run that nobody reads: its stream, its keys in the runs, archives and prompts
    buckets, and its dead letters. The caller has checked its state."""
    readers = await _readers(bus, run.run_id, until=bool, samples=READ_SAMPLES)
    if readers:
        raise ConfigError(
            f"run {run.run_id}'s stream is being read by {', '.join(readers)}: stop those actors first "
            "(`kfoundry status --run` names them; `kfoundry drain ACTOR`)"
        )
    run_id = run.run_id
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await settled(
            f"deleting stream {subjects.run_stream(run_id)}", lambda: bus.js.delete_stream(subjects.run_stream(run_id))
        )
    for bucket_name in (subjects.RUNS_BUCKET, subjects.ARCHIVE_BUCKET, subjects.PROMPTS_BUCKET):
        await _purge(bus, f"KV_{bucket_name}", (f"$KV.{bucket_name}.{run_id}", f"$KV.{bucket_name}.{run_id}.>"))
    letters = await _purge(bus, subjects.DLQ_STREAM, (subjects.dead_letters(run_id),))
    return Removed(messages=run.messages or 0, dead_letters=letters)


async def _purge(bus: Bus, stream: str, filters: Iterable[str]) -> int:
    """Purge the messages of ``filters`` from ``stream`` (absent: nothing); returns how many."""
    purged = 0
    for subject in filters:
        try:
            info = await settled(
                f"reading stream {stream}", partial(bus.js.stream_info, stream, subjects_filter=subject)
            )
        except nats.js.errors.NotFoundError:
            return purged
        count = sum((info.state.subjects or {}).values())
        if count:
            await settled(f"purging {subject} from {stream}", partial(bus.js.purge_stream, stream, subject=subject))
            purged += count
    return purged
