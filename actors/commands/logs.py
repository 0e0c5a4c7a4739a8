"""``kfoundry logs RUN``: every actor's log lines of a run, from the ``KF_LOGS`` stream.

Actors started with ``kfoundry actor`` send their lines there (``actors.runtime.log_ship``) beside
their stderr: those of a run's islands, evaluators and diagnosers under the run, and those of
shared actors (experts, the curator) under ``_``, of which the lines about this run are shown. The
``kfoundry run`` process keeps its own lines (its controller's and its local actors') in the run
directory's ``run.log``.

    kfoundry logs RUN [--actor ID] [--level LEVEL] [--json] [--follow]

Exit status: 0 lines shown; 1 no line of that run; 2 a bad argument, or no log stream on the server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from typing import TYPE_CHECKING

from actors.runtime.errors import ConfigError
from actors.runtime.process import add_nats_options, nats_url, run_async
from actors.runtime.process import say as _out
from schemas import subjects

if TYPE_CHECKING:
    from actors.runtime.bus import Bus

LEVELS = ("debug", "info", "warning", "error", "critical")
_SHOWN_FIRST = ("timestamp", "level", "actor", "event")
_QUIET_FIELDS = ("run", "logger")


def add_logs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("logs", help="every actor's log lines of a run, wherever the actors run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--actor", help="only the lines of actors whose id starts with this")
    p.add_argument("--level", choices=LEVELS, help="only lines at this level or above")
    p.add_argument("--json", action="store_true", help="the lines as stored (one JSON object each)")
    p.add_argument("-f", "--follow", action="store_true", help="then the new lines as they come, until Ctrl-C")
    add_nats_options(p)
    p.set_defaults(func=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        subjects.logs(args.run)
    except ValueError as exc:  # a run id that cannot be a subject token: one line
        raise ConfigError(str(exc)) from None
    floor = LEVELS.index(args.level) if args.level else 0

    async def main(stop: asyncio.Event) -> int:
        import nats.js.errors
        from nats.js.api import ConsumerConfig, DeliverPolicy

        from actors.runtime.bus import Bus

        with nats_url(args.nats) as url:
            bus = await Bus.connect(
                url, name="kfoundry-logs", actor_id="kfoundry-logs", connect_timeout=args.connect_timeout, stop=stop
            )
            try:
                try:
                    info = await bus.js.stream_info(subjects.LOG_STREAM)
                except nats.js.errors.NotFoundError:
                    raise ConfigError(
                        f"the NATS server at {url} holds no log stream ({subjects.LOG_STREAM}): no actor started "
                        "with `kfoundry actor` has sent it lines"
                    ) from None
                last = int(info.state.last_seq)
                start = await _run_start(bus, args.run)
                if start is None:
                    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
                else:
                    when = datetime.datetime.fromtimestamp(start, tz=datetime.UTC)
                    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=when)
                shown = 0
                if last == 0 and not args.follow:
                    return _none(args.run)
                sub = await bus.js.subscribe(
                    f"{subjects.LOG_PREFIX}.>", stream=subjects.LOG_STREAM, ordered_consumer=True, config=config
                )
                try:
                    while not stop.is_set():
                        try:
                            msg = await sub.next_msg(timeout=1.0)
                        except TimeoutError:
                            if args.follow:
                                continue
                            break  # nothing more stored from the start time on
                        line = _select(msg.subject, msg.data, args.run, args.actor, floor)
                        if line is not None:
                            _out(json.dumps(line) if args.json else _render(line))
                            shown += 1
                        if not args.follow and int(msg.metadata.sequence.stream) >= last:
                            break
                finally:
                    await sub.unsubscribe()
                return 0 if shown or args.follow else _none(args.run)
            finally:
                await bus.close()

    return run_async(main)


def _none(run: str) -> int:
    _out(f"kfoundry: no log line of run {run} in the log stream (actors started with `kfoundry actor` send them)",
         sys.stderr)  # fmt: skip
    return 1


async def _run_start(bus: Bus, run: str) -> float | None:
    """When the run was registered, a minute early (its actors may start before it); None where
    the server does not know the run (its lines are looked for in the whole stream)."""
    from actors.commands.run_registry import find_run

    try:
        found = await find_run(bus, run)
    except ConfigError:
        return None
    return found.created_at - 60.0 if found.created_at is not None else None


def _select(subject: str, data: bytes, run: str, actor: str | None, floor: int) -> dict[str, object] | None:
    """The line of ``kflog.<run>.<actor>`` when it belongs to ``run`` (its subject's, or a shared
    actor's line that names the run) and passes the filters; else None."""
    parts = subject.split(".")
    if len(parts) != 3:
        return None
    _, line_run, line_actor = parts
    try:
        line = json.loads(data)
    except ValueError:
        line = {"event": data.decode(errors="replace")}
    if not isinstance(line, dict):
        line = {"event": line}
    if line_run != run and not (line_run == subjects.NO_RUN and line.get("run") == run):
        return None
    line.setdefault("actor", line_actor)
    if actor is not None and not str(line["actor"]).startswith(actor):
        return None
    level = str(line.get("level", "info")).lower()
    if floor and (LEVELS.index(level) if level in LEVELS else 1) < floor:
        return None
    return line


def _render(line: dict[str, object]) -> str:
    """``TIME LEVEL ACTOR EVENT key=value ...``."""
    head = [str(line.get(k, "-")) for k in _SHOWN_FIRST]
    rest = [f"{k}={v}" for k, v in line.items() if k not in _SHOWN_FIRST and k not in _QUIET_FIELDS]
    return " ".join([head[0], f"{head[1]:<7}", head[2], head[3], *rest])
