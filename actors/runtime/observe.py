"""Watching a live system: the decoded message tap, actor discovery and consumer lag.

``tap`` subscribes to subjects (core NATS sees JetStream traffic too) and renders each message as
one line: time, subject, type and its key fields; a message it cannot decode is shown too, marked
``UNDECODABLE`` with the reason. With replies (``_INBOX.>``) each reply is shown once: JetStream
deliveries to consumers (copies of stream messages already shown on their own subject) and
replies that are not Kernel Foundry messages (publish acks, discovery answers) are skipped.
``replay`` renders a run's history from its stream (each line stamped with when the message was
stored), then follows it to its end. ``dead_letters`` reads the dead-letter stream. ``discover``
gathers every actor's ``$SRV.STATS`` (and ``INFO``) reply; ``consumer_lag`` reads the run streams'
consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
import pydantic
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.runtime.bus.calls import server_has_all
from schemas import (
    ActorInfo,
    Candidate,
    Control,
    DeadLetter,
    Diagnosis,
    EliteAnnouncement,
    EvalResult,
    Experience,
    ExperienceHits,
    ExperienceQuery,
    Feedback,
    GenerateReply,
    GenerateRequest,
    IslandStatus,
    Message,
    Migration,
    RunEnd,
    decode_any,
)
from schemas import subjects as subjects_mod


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def key_fields(msg: Message) -> str:
    """The few fields of a message a person watching the run wants to see."""
    match msg:
        case Candidate():
            return (
                f"island={msg.island} cand={msg.candidate_id[:8]} parent={(msg.parent_id or '-')[:8]} "
                f"gen={msg.generation} expert={msg.expert} strategy={msg.proposal.strategy or '-'}"
            )
        case EvalResult():
            return (
                f"island={msg.island} cand={msg.candidate_id[:8]} status={msg.status} "
                f"speedup={_f(msg.speedup_vs_eager)}x vs_compile={_f(msg.speedup_vs_compiled)}x "
                f"sol={_f(msg.sol.fraction if msg.sol else None)} {msg.summary[:60]!r}"
            )
        case Feedback():
            return (
                f"island={msg.island} cand={msg.candidate_id[:8]} status={msg.result.status} "
                f"diagnosis={msg.diagnosis.category} suggest={msg.diagnosis.suggested_expert or '-'}"
            )
        case Diagnosis():
            return f"cand={msg.candidate_id[:8]} category={msg.category} {msg.summary[:60]!r}"
        case GenerateRequest():
            return (
                f"island={msg.island} req={msg.request_id[:8]} n={msg.n} "
                f"parent={(msg.parent.candidate_id if msg.parent else '-')[:8]} "
                f"diagnosis={msg.diagnosis.category if msg.diagnosis else '-'} experiences={len(msg.experiences)}"
            )
        case GenerateReply():
            what = f"decline={msg.decline.reason}" if msg.decline else f"proposals={len(msg.proposals)}"
            return f"req={msg.request_id[:8]} expert={msg.expert} {what} tokens={msg.tokens.total}"
        case EliteAnnouncement():
            e = msg.elite
            return (
                f"island={e.island} cand={e.candidate.candidate_id[:8]} fitness={e.fitness:.2f}x "
                f"cell={list(e.cell)} best={msg.island_best}"
            )
        case Migration():
            return f"{msg.source_island}->{msg.dest_island} reason={msg.reason} elites={len(msg.elites)}"
        case IslandStatus():
            return (
                f"island={msg.island} evaluated={msg.evaluated} in_flight={msg.in_flight} "
                f"archive={msg.archive_size} best={_f(msg.best_fitness)}x stagnating={msg.stagnating}"
                + (f" stopped={msg.stopped}" if msg.stopped else "")
            )
        case RunEnd():
            return f"reason={msg.reason} best={_f(msg.best_fitness)}x evaluated={msg.evaluated}"
        case Experience():
            return f"expert={msg.expert} diagnosis={msg.diagnosis or '-'} status={msg.status} delta={_f(msg.delta)}"
        case ExperienceQuery():
            return f"k={msg.k} diagnosis={msg.diagnosis or '-'}"
        case ExperienceHits():
            return f"hits={len(msg.hits)} library={msg.library_size} embedder={msg.embedder}"
        case Control():
            return f"action={msg.action} {msg.reason!r}"
        case ActorInfo():
            return f"actor={msg.actor_id} kind={msg.kind} state={msg.state}"
        case DeadLetter():
            error = msg.error.strip().splitlines()[0][:120] if msg.error.strip() else ""
            return f"reason={msg.reason} subject={msg.subject} actor={msg.actor_id} error={error!r}"
        case _:
            return ""


def render(subject: str, decoded: Message, *, now: float | None = None) -> str:
    """One line for a decoded message."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now or time.time()))
    kind = getattr(decoded, "type", type(decoded).__name__)
    return f"{stamp} {subject:<40} {kind:<18} {key_fields(decoded)}"


def render_undecodable(subject: str, data: bytes, reason: str, *, now: float | None = None) -> str:
    """One line for a message that is not a valid Kernel Foundry message, with why."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now or time.time()))
    why = " ".join(reason.split())[:200]
    return f"{stamp} {subject:<40} {'UNDECODABLE':<18} reason={why!r} payload={data[:80]!r}"


def _reason(exc: ValueError) -> str:
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{exc.error_count()} validation error(s); {where or 'message'}: {first.get('msg', '')}"
    return f"{type(exc).__name__}: {exc}"


async def tap(
    nc: NATS,
    subjects: list[str],
    emit: Callable[[str], None],
    *,
    types: set[str] | None = None,
    stop: asyncio.Event | None = None,
    limit: int | None = None,
) -> int:
    """Render every message on ``subjects`` through ``emit`` until ``stop`` or ``limit`` (see the
    module docstring for undecodable messages and replies)."""
    done = stop or asyncio.Event()
    count = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        if (msg.reply or "").startswith("$JS.ACK."):
            return  # a stream message delivered to a consumer: shown already on its own subject
        is_reply = msg.subject.startswith("_INBOX.")
        try:
            decoded = decode_any(msg.data)
        except ValueError as exc:
            if is_reply or types:
                return  # publish acks, discovery answers, fetch status: not Kernel Foundry messages
            line = render_undecodable(msg.subject, msg.data, _reason(exc))
        else:
            if types and getattr(decoded, "type", "") not in types:
                return
            line = render(msg.subject, decoded)
        emit(line)
        count += 1
        if limit is not None and count >= limit:
            done.set()

    subs = [await nc.subscribe(subject, cb=on_msg) for subject in subjects]
    await server_has_all(nc)
    try:
        await done.wait()
    finally:
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
    return count


async def replay(
    nc: NATS,
    run_id: str,
    emit: Callable[[str], None],
    *,
    since: float | None = None,
    types: set[str] | None = None,
    stop: asyncio.Event | None = None,
    limit: int | None = None,
) -> int:
    """Render a run's history from its stream (every message, or those stored from ``since``, a
    Unix time), stamped with when each was stored, then its new messages as they come, until its
    ``RunEnd`` (a finished run's history ends at once), ``stop`` or ``limit``. Raises
    ``nats.js.errors.NotFoundError`` when the server has no such run stream."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    js = nc.jetstream()
    stream = subjects_mod.run_stream(run_id)
    await js.stream_info(stream)  # NotFoundError: no such run here
    done = stop or asyncio.Event()
    count = 0
    end_subject = subjects_mod.run_end(run_id)

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        if done.is_set():
            return
        stored = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else None
        try:
            decoded = decode_any(msg.data)
        except ValueError as exc:
            line = None if types else render_undecodable(msg.subject, msg.data, _reason(exc), now=stored)
        else:
            wanted = not types or getattr(decoded, "type", "") in types
            line = render(msg.subject, decoded, now=stored) if wanted else None
        if line is not None:
            emit(line)
            count += 1
        if msg.subject == end_subject or (limit is not None and count >= limit):
            done.set()

    if since is None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    else:
        start = datetime.datetime.fromtimestamp(since, tz=datetime.UTC)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
    sub = await js.subscribe(f"kf.{run_id}.>", stream=stream, cb=on_msg, ordered_consumer=True, config=config)
    try:
        await done.wait()
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return count


async def dead_letters(nc: NATS, *, run_id: str | None = None, timeout: float = 5.0) -> list[DeadLetter]:
    """Every dead letter kept in the dead-letter stream (of one run, or of all), oldest first."""
    js = nc.jetstream()
    subject = subjects_mod.dead_letters(run_id or "*")
    try:
        info = await js.stream_info(subjects_mod.DLQ_STREAM, subjects_filter=subject)
    except nats.js.errors.NotFoundError:
        return []
    want = sum((info.state.subjects or {}).values())
    if not want:
        return []
    last = int(info.state.last_seq)
    sub = await js.subscribe(subject, stream=subjects_mod.DLQ_STREAM, ordered_consumer=True)
    out: list[DeadLetter] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout if not out else 1.0)
            except nats.errors.TimeoutError:
                break  # the filter matched nothing more
            with contextlib.suppress(pydantic.ValidationError):
                out.append(DeadLetter.model_validate_json(msg.data))
            if len(out) >= want or int(msg.metadata.sequence.stream) >= last or int(msg.metadata.num_pending) == 0:
                break
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return out


def render_dead_letter(letter: DeadLetter) -> str:
    """One line per dead letter: when, why, where it came from, who gave up, the error."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(letter.at))
    error = " ".join(letter.error.split())[:160]
    deliveries = f" deliveries={letter.deliveries}" if letter.deliveries is not None else ""
    return f"{stamp} {letter.reason:<15} {letter.subject:<40} actor={letter.actor_id}{deliveries} error={error!r}"


@dataclass
class ActorRow:
    """One discovered actor."""

    name: str
    service_id: str
    version: str
    metadata: dict[str, str]
    stats: dict[str, Any] = field(default_factory=dict)
    endpoints: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.metadata.get("kind", "?")

    @property
    def actor_id(self) -> str:
        return self.metadata.get("actor_id", self.service_id)


async def _gather(nc: NATS, subject: str, wait_s: float) -> list[dict[str, Any]]:
    inbox = nc.new_inbox()
    replies: list[dict[str, Any]] = []

    async def on_reply(msg: Msg) -> None:
        try:
            replies.append(json.loads(msg.data))
        except ValueError:
            return

    sub = await nc.subscribe(inbox, cb=on_reply)
    await server_has_all(nc)
    await nc.publish(subject, b"", reply=inbox)
    await nc.flush()
    await asyncio.sleep(wait_s)
    await sub.unsubscribe()
    return replies


async def discover(nc: NATS, *, wait_s: float = 0.5, run_id: str | None = None) -> list[ActorRow]:
    """Every live Kernel Foundry actor answering ``$SRV.STATS``, optionally of one run."""
    infos, stats = await asyncio.gather(_gather(nc, "$SRV.INFO", wait_s), _gather(nc, "$SRV.STATS", wait_s))
    by_id: dict[str, ActorRow] = {}
    for info in infos:
        meta = info.get("metadata") or {}
        if "actor_id" not in meta:
            continue
        by_id[info["id"]] = ActorRow(
            name=info.get("name", "?"),
            service_id=info["id"],
            version=info.get("version", "?"),
            metadata=meta,
            endpoints=[e.get("subject", "") for e in info.get("endpoints") or []],
        )
    for stat in stats:
        row = by_id.get(stat.get("id", ""))
        if row is None:
            continue
        for endpoint in stat.get("endpoints") or []:
            if endpoint.get("data"):
                row.stats = endpoint["data"]
                break
    rows = list(by_id.values())
    if run_id is not None:
        rows = [r for r in rows if r.metadata.get("run_id") in (run_id, "")]
    return sorted(rows, key=lambda r: (r.kind, r.metadata.get("island", ""), r.actor_id))


@dataclass
class Lag:
    """Backlog of one durable consumer."""

    stream: str
    consumer: str
    pending: int
    ack_pending: int
    redelivered: int
    waiting: int


async def consumer_lag(nc: NATS, *, run_id: str | None = None, ended: bool = False) -> list[Lag]:
    """Backlog of every consumer of the run streams (``KF_RUN_*``): of runs that have not ended
    (no ``RunEnd`` in their stream) unless ``ended``, or ``run_id`` is named."""
    js = nc.jetstream()
    out: list[Lag] = []
    if run_id:  # one run (a metrics scrape asks each time): its stream by name, not every stream listed
        names = [subjects_mod.run_stream(run_id)]
    else:
        try:
            names = [s.config.name or "" for s in await js.streams_info()]
        except (nats.errors.Error, nats.js.errors.Error):
            return out
    for name in names:
        if not name.startswith("KF_RUN_"):
            continue
        if not ended and not run_id and await _has_ended(js, name):
            continue  # a run that ended days ago is no backlog anyone waits on
        try:
            consumers = await js.consumers_info(name)
        except nats.js.errors.NotFoundError:
            continue  # the named run has no stream (any more)
        for consumer in consumers:
            if not consumer.config.durable_name:
                continue
            out.append(
                Lag(
                    stream=name,
                    consumer=consumer.name,
                    pending=int(consumer.num_pending or 0),
                    ack_pending=int(consumer.num_ack_pending or 0),
                    redelivered=int(consumer.num_redelivered or 0),
                    waiting=int(consumer.num_waiting or 0),
                )
            )
    return out


async def _has_ended(js: Any, stream: str) -> bool:
    """Whether the run stream ``stream`` holds its run's ``RunEnd``."""
    run = stream.removeprefix("KF_RUN_")
    try:
        await js.get_last_msg(stream, subjects_mod.run_end(run))
    except nats.js.errors.NotFoundError:
        return False
    except (nats.errors.Error, nats.js.errors.Error):
        return False  # unknown: shown
    return True
