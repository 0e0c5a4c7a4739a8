"""``kfoundry``: the command line.

    kfoundry run TASK.py            run the whole loop on a KernelBench-format task
    kfoundry eval REF.py CAND.py    one honest evaluation (gpu_runner)
    kfoundry bench KB_DIR --level N run `kfoundry run` on KernelBench problems, tabulate the results
    kfoundry actor KIND --run RUN   one actor process joining a run
    kfoundry tap [SUBJECT...]       live, decoded view of the message streams
    kfoundry dlq [--run RUN]        dead letters with their reasons and subjects
    kfoundry status                 live actors (kind, id, version, host, stats) and consumer lag
    kfoundry drain ACTOR_ID         remove one actor gracefully (with a new one: a hot swap)
    kfoundry expert set NAME ...    store or change an expert's configuration (taken up live)
    kfoundry server status|stop     the embedded NATS server
    kfoundry runs [show|stop|rm]    the runs a NATS server knows; one run's spec, stop or removal
    kfoundry --version              the installed version

With no ``--nats`` and no ``NATS_URL``, commands use the embedded server (see
``actors.runtime.nats_server``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

from actors.commands.actor import add_actor_parser
from actors.commands.run import add_run_parser
from actors.commands.runs import add_runs_parser
from actors.runtime.errors import ConfigError, KfError, TaskRefused
from actors.runtime.process import add_nats_options, exit_promptly, nats_url, run_async
from actors.runtime.process import say as _out


async def _connect(url: str, name: str, args: argparse.Namespace, stop: asyncio.Event):  # type: ignore[no-untyped-def]
    from actors.runtime.bus import Bus

    return await Bus.connect(url, name=name, actor_id=name, connect_timeout=args.connect_timeout, stop=stop)


# -- tap -----------------------------------------------------------------------------------


def cmd_tap(args: argparse.Namespace) -> int:
    from actors.runtime.errors import BusError
    from actors.runtime.observe import tap
    from schemas import subjects as subject_names

    subjects = list(args.subjects) or (
        [subject_names.run_all(args.run), subject_names.dead_letters(args.run)] if args.run else ["kf.>"]
    )
    if args.replies:
        subjects.append("_INBOX.>")
    types = set(args.type) if args.type else None

    history = args.all or args.since is not None
    if history and (not args.run or args.subjects or args.replies):
        raise ConfigError("--all and --since replay one run's stream: give --run RUN (and no subjects or --replies)")
    since = parse_since(args.since) if args.since is not None else None

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await _connect(url, "kfoundry-tap", args, stop)
            if history:
                return await _replay(bus, url, stop)
            _out(f"# tapping {', '.join(subjects)} on {url} (Ctrl-C to stop)", sys.stderr)
            lost = asyncio.ensure_future(bus.lost.wait())
            lost.add_done_callback(lambda _: stop.set())
            try:
                await tap(bus.nc, subjects, _out, types=types, stop=stop, limit=args.count)
            finally:
                lost.cancel()
                await bus.close()
            if bus.lost.is_set():
                raise BusError(f"lost the connection to NATS at {url} (gave up after {args.connect_timeout:g} s)")
        return 0

    async def _replay(bus: Any, url: str, stop: asyncio.Event) -> int:
        import nats.js.errors

        from actors.runtime.observe import replay

        what = "from its start" if since is None else time.strftime("from %Y-%m-%d %H:%M:%S", time.localtime(since))
        _out(f"# run {args.run} on {url}, {what}, until its end (Ctrl-C to stop)", sys.stderr)
        try:
            await replay(bus.nc, args.run, _out, since=since, types=types, stop=stop, limit=args.count)
        except nats.js.errors.NotFoundError:
            raise ConfigError(f"--run {args.run}: this server has no stream of that run") from None
        finally:
            await bus.close()
        return 0

    return run_async(main)


def parse_since(text: str) -> float:
    """``--since``: a duration back from now (``90s``, ``10m``, ``2h``, ``1d``) or a local time
    (``2026-11-29T14:05``, ``14:05`` today); a Unix time."""
    import datetime as dt
    import re

    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if found:
        return time.time() - float(found.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            clock = dt.time.fromisoformat(text.strip())
        except ValueError:
            raise ConfigError(
                f"--since {text!r}: give a duration back from now (90s, 10m, 2h, 1d) or a time "
                "(2026-11-29T14:05, 14:05)"
            ) from None
        when = dt.datetime.combine(dt.date.today(), clock)
    return when.timestamp()


# -- dead letters --------------------------------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    from actors.runtime.observe import dead_letters, render_dead_letter

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await _connect(url, "kfoundry-dlq", args, stop)
            try:
                letters = await dead_letters(bus.nc, run_id=args.run)
            finally:
                await bus.close()
        if args.json:
            _out(json.dumps([json.loads(letter.to_bytes()) for letter in letters], indent=2))
            return 0
        where = f"run {args.run}" if args.run else "all runs"
        _out(f"{len(letters)} dead letter(s) ({where}) on {url}")
        for letter in letters:
            _out(render_dead_letter(letter))
        return 0

    return run_async(main)


# -- status --------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from actors.runtime.gpu_usage import live_rows, usage_table
    from actors.runtime.observe import consumer_lag, discover

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await _connect(url, "kfoundry-status", args, stop)
            try:
                rows = await discover(bus.nc, wait_s=args.wait, run_id=args.run)
                lags = await consumer_lag(bus.nc, run_id=args.run, ended=args.all)
            finally:
                await bus.close()
        if args.json:
            _out(
                json.dumps(
                    {
                        "actors": [
                            {"name": r.name, "version": r.version, "metadata": r.metadata, "stats": r.stats}
                            for r in rows
                        ],
                        "consumers": [lag.__dict__ for lag in lags],
                    },
                    indent=2,
                )
            )
            return 0
        _out(f"{len(rows)} actor(s) on {url}")
        header = (
            f"{'KIND':<10} {'ACTOR':<22} {'VERSION':<8} {'HOST':<14} {'PID':>7} {'RUN':<12} {'NAME':<12} "
            f"{'RECV':>7} {'DONE':>7} {'ERR':>5} {'DLQ':>4} {'BUSY':>4}"
        )
        _out(header)
        for r in rows:
            s = r.stats
            meta = r.metadata
            extra = s.get("extra")
            expert = extra.get("expert") if isinstance(extra, dict) else None
            name = meta.get("island") or str(expert or "") or "-"  # an island's id, an expert's name
            _out(
                f"{r.kind:<10} {r.actor_id:<22} {r.version:<8} {meta.get('host', '?')[:14]:<14} "
                f"{meta.get('pid', '?'):>7} {meta.get('run_id', '') or '-':<12} {name[:12]:<12} "
                f"{s.get('received', 0):>7} {s.get('processed', 0):>7} {s.get('errors', 0):>5} "
                f"{s.get('dead_lettered', 0):>4} {s.get('in_flight', 0):>4}"
            )
        usage = live_rows((r.actor_id, r.metadata.get("host", "?"), r.stats) for r in rows if r.kind == "evaluator")
        if any(u.gpu is not None for u in usage):
            _out("")
            _out("GPUs (each evaluator since it began taking candidates):")
            for line in usage_table(usage):
                _out(line)
        if lags:
            _out("")
            _out(f"{'STREAM':<24} {'CONSUMER':<20} {'PENDING':>8} {'UNACKED':>8} {'REDELIV':>8} {'WAITING':>8}")
            for lag in lags:
                _out(
                    f"{lag.stream:<24} {lag.consumer:<20} {lag.pending:>8} {lag.ack_pending:>8} "
                    f"{lag.redelivered:>8} {lag.waiting:>8}"
                )
        return 0

    return run_async(main)


# -- drain ---------------------------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    from actors.runtime.observe import discover
    from schemas import ActorInfo, Control, ControlAction, subjects

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await _connect(url, "kfoundry-drain", args, stop)
            try:
                info = await bus.request(
                    subjects.control(args.actor_id),
                    Control(action=ControlAction.DRAIN, reason=args.reason),
                    ActorInfo,
                    timeout=args.timeout,
                )
                _out(f"draining {info.actor_id} ({info.kind} {info.version} on {info.host} pid {info.pid})")
                if args.wait:
                    async with asyncio.timeout(args.timeout):
                        # Polls remote discovery: there is no local event to wait on.
                        while any(r.actor_id == args.actor_id for r in await discover(bus.nc, wait_s=0.3)):  # noqa: ASYNC110
                            await asyncio.sleep(0.2)
                    _out(f"{args.actor_id} has left")
            finally:
                await bus.close()
        return 0

    return run_async(main)


# -- expert config -------------------------------------------------------------------------


def cmd_expert(args: argparse.Namespace) -> int:
    from actors.runtime.kv import get_expert_config, put_expert_config
    from schemas import ExpertConfig

    target_gpu = _known_gpu(getattr(args, "target_gpu", None))  # before any connection

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await _connect(url, "kfoundry-expert", args, stop)
            try:
                if args.expert_cmd == "list":
                    return await _list_experts(bus, args.json)
                if args.expert_cmd == "rm":
                    return await _remove_expert(bus, args.name, args.force)
                if args.expert_cmd == "show":
                    cfg = await get_expert_config(bus, args.name)
                    _out(cfg.model_dump_json(indent=2) if cfg else f"no configuration stored for {args.name!r}")
                    return 0 if cfg else 1
                old = await get_expert_config(bus, args.name)
                base = old.model_dump(exclude={"revision", "created_at"}) if old else {"name": args.name}
                changes = {
                    k: v
                    for k, v in {
                        "kind": args.kind,
                        "role": args.role,
                        "base_url": args.base_url,
                        "model": args.model,
                        "api_key_env": args.api_key_env,
                        "temperature": args.temperature,
                        "max_tokens": args.max_tokens,
                        "timeout_s": args.timeout,
                        "concurrency": args.concurrency,
                        "token_budget": args.token_budget,
                        "price_in_per_mtok": args.price_in,
                        "price_out_per_mtok": args.price_out,
                        "language": args.language,
                        "target_gpu": target_gpu,
                    }.items()
                    if v is not None
                }
                cfg = ExpertConfig.model_validate(base | changes | {"revision": (old.revision + 1) if old else 0})
                await put_expert_config(bus, cfg)
                _out(f"stored {cfg.name} revision {cfg.revision}: {cfg.model_dump_json(exclude={'created_at'})}")
            finally:
                await bus.close()
        return 0

    return run_async(main)


def _known_gpu(name: str | None) -> str | None:
    """``--target-gpu``: a GPU the template's hardware table knows, as given; a clear error else."""
    if name is None:
        return None
    from actors.experts.template.hardware import TABLE, lookup

    if lookup(name) is None:
        raise ConfigError(f"--target-gpu {name!r}: not a GPU the template expert knows (known: {', '.join(TABLE)})")
    return name


async def _list_experts(bus: Any, as_json: bool) -> int:
    """``kfoundry expert list``: every stored configuration, and whether its key is set in this shell."""
    from actors.runtime.kv import list_expert_configs

    configs = await list_expert_configs(bus)
    if as_json:
        _out(json.dumps([json.loads(c.model_dump_json(exclude={"api_key"})) for c in configs], indent=2))
        return 0
    if not configs:
        _out("no expert configurations stored (the template expert needs none)")
        return 0
    _out(f"{'NAME':<16} {'KIND':<9} {'ROLE':<10} {'MODEL':<24} {'REV':>4}  ENDPOINT / KEY")
    for c in configs:
        key = ""
        if c.api_key_env:
            state = "set here" if os.environ.get(c.api_key_env) else "NOT set in this shell"
            key = f"  key ${c.api_key_env} ({state})"
        _out(
            f"{c.name:<16} {c.kind.value:<9} {(c.role or '-'):<10} {(c.model or '-')[:24]:<24} {c.revision:>4}  "
            f"{c.base_url or '-'}{key}"
        )
    return 0


async def _remove_expert(bus: Any, name: str, force: bool) -> int:
    """``kfoundry expert rm NAME``: refused while a live expert serves that configuration."""
    from actors.runtime.kv import delete_expert_config
    from actors.runtime.observe import discover

    serving = [
        r.actor_id
        for r in await discover(bus.nc, wait_s=0.5)
        if r.kind == "expert" and isinstance(r.stats.get("extra"), dict) and r.stats["extra"].get("expert") == name
    ]
    if serving and not force:
        raise ConfigError(
            f"expert {name!r} is served by {', '.join(serving)}: drain it first (kfoundry drain ID) or give --force"
        )
    if not await delete_expert_config(bus, name):
        raise ConfigError(f"no expert configuration stored under {name!r} (kfoundry expert list shows them)")
    _out(f"removed expert configuration {name!r}")
    return 0


# -- server --------------------------------------------------------------------------------


def cmd_server(args: argparse.Namespace) -> int:
    from actors.runtime.nats_server import EmbeddedServer, stop_server

    server = EmbeddedServer()
    info = server._load()
    if args.server_cmd == "status":
        kept = " (kept until `kfoundry server stop`)" if info and server.kept() else ""
        _out(f"embedded NATS at {info.url} (pid {info.pid}, store {info.store_dir}){kept}" if info else "not running")
        return 0
    if args.server_cmd == "start":  # kept: the commands that use it leave it running
        url = server.keep()
        _out(f"embedded NATS at {url} (kept until `kfoundry server stop`)")
        return 0
    server.forget()
    if info is None:
        _out("not running")
        return 0
    stop_server(info.pid)
    with contextlib.suppress(FileNotFoundError):
        server.state.unlink()
    _out(f"stopped embedded NATS (pid {info.pid})")
    return 0


# -- eval ----------------------------------------------------------------------------------


def cmd_eval(argv: list[str]) -> int:
    from gpu_runner.cli import main as eval_main

    return int(eval_main(argv))


# -- parser --------------------------------------------------------------------------------

DISTRIBUTION = "kernel-foundry"
"""The package's name in ``pyproject.toml`` (``[project] name``), as installed."""


def installed_version() -> str:
    """The installed package's version, or a line saying it is not installed (run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return f"(not installed: {DISTRIBUTION} has no package metadata here)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfoundry", description="Kernel Foundry: faster GPU kernels by evolution")
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    add_run_parser(sub)
    add_runs_parser(sub)
    from actors.commands.logs import add_logs_parser

    add_logs_parser(sub)
    add_actor_parser(sub)
    from actors.kbench.bench import add_bench_parser

    add_bench_parser(sub)
    from actors.commands.export import add_export_parser

    add_export_parser(sub)

    p = sub.add_parser("eval", help="evaluate one candidate against a reference (see `kfoundry eval -h`)")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    p = sub.add_parser("tap", help="show the live messages, decoded")
    p.add_argument("subjects", nargs="*", help="NATS subjects (wildcards allowed); default kf.> or kf.<run>.>")
    p.add_argument("--run", help="only this run's subjects")
    p.add_argument("--type", action="append", help="only messages of this type (repeatable), e.g. eval_result")
    p.add_argument("--replies", action="store_true", help="also show request replies (_INBOX.>)")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--all", action="store_true", help="with --run: the run's history from its start, then live")
    p.add_argument("--since", metavar="WHEN", help="with --run: its history from WHEN (10m, 2h, 14:05), then live")
    add_nats_options(p)
    p.set_defaults(func=cmd_tap)

    p = sub.add_parser("dlq", help="list dead letters (messages given up on) with reasons and subjects")
    p.add_argument("--run", help="only this run's dead letters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_nats_options(p)
    p.set_defaults(func=cmd_dlq)

    p = sub.add_parser("status", help="list live actors and the consumer lag of runs not ended")
    p.add_argument("--run", help="only this run")
    p.add_argument("--all", action="store_true", help="the consumer lag of ended runs too")
    p.add_argument("--wait", type=float, default=0.5, help="seconds to collect replies (default 0.5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_nats_options(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("drain", help="remove one actor gracefully")
    p.add_argument("actor_id")
    p.add_argument("--reason", default="drained from the command line")
    p.add_argument("--wait", action="store_true", help="wait until the actor has left")
    p.add_argument("--timeout", type=float, default=60.0)
    add_nats_options(p)
    p.set_defaults(func=cmd_drain)

    from actors.experts.registry import EXPERT_KINDS
    from schemas import Role

    p = sub.add_parser("expert", help="show or change an expert's configuration (KV; taken up live)")
    esub = p.add_subparsers(dest="expert_cmd", required=True)
    listing = esub.add_parser("list", help="every stored configuration, and whether its key is set here")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_nats_options(listing)
    listing.set_defaults(func=cmd_expert)
    remove = esub.add_parser("rm", help="remove a stored configuration (refused while an expert serves it)")
    remove.add_argument("name")
    remove.add_argument("--force", action="store_true", help="even while a live expert serves it")
    add_nats_options(remove)
    remove.set_defaults(func=cmd_expert)
    show = esub.add_parser("show")
    show.add_argument("name")
    add_nats_options(show)
    show.set_defaults(func=cmd_expert)
    setp = esub.add_parser("set")
    setp.add_argument("name")
    setp.add_argument("--kind", choices=[k.value for k in EXPERT_KINDS])
    setp.add_argument("--role", choices=[r.value for r in Role if r is not Role.TEMPLATE])
    setp.add_argument("--base-url")
    setp.add_argument("--model")
    setp.add_argument("--api-key-env", help="name of the environment variable holding the key")
    setp.add_argument("--temperature", type=float)
    setp.add_argument("--max-tokens", type=int)
    setp.add_argument("--timeout", type=float)
    setp.add_argument("--concurrency", type=int)
    setp.add_argument("--token-budget", type=int)
    setp.add_argument("--price-in", type=float, metavar="PRICE", help="cost of a million prompt tokens")
    setp.add_argument("--price-out", type=float, metavar="PRICE", help="cost of a million completion tokens")
    setp.add_argument("--language", choices=["triton", "cuda"])
    setp.add_argument(
        "--target-gpu",
        metavar="GPU",
        help="template experts: the GPU fresh starts are sized for where the evaluators run elsewhere (e.g. H200); "
        "default: the device the run's verdicts name, until then this machine's",
    )
    add_nats_options(setp)
    setp.set_defaults(func=cmd_expert)

    p = sub.add_parser("server", help="the embedded NATS server")
    p.add_argument("server_cmd", choices=["status", "start", "stop"])
    p.set_defaults(func=cmd_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``kfoundry ARGV`` (``sys.argv`` when none is given: the command is this process, and a run
    that has written its results exits at once, ``actors.runtime.process.exit_promptly``)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv, own_process=argv is None)
    except BaseException as exc:
        if not _closed_pipe(exc):  # `kfoundry status | head`: the reader has what it wanted
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush finds no closed pipe
        return 0


def _main(argv: list[str], *, own_process: bool = False) -> int:
    if argv and argv[0] == "eval":
        return cmd_eval(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.own_process = own_process
    try:
        if args.command == "run" and args.config is not None:
            from actors.commands.run_config import apply_config

            apply_config(args.run_parser, argv[1:], args)
        if getattr(args, "confine_task", False):
            from actors.runtime.task_confine import enable

            enable()  # before anything imports the task file; a machine that cannot: one line, exit 2
        return int(args.func(args))
    except TaskRefused as exc:  # TaskInvalid (the task's own fault) included
        if not exc.said:
            _out(f"kfoundry: {exc}", sys.stderr)
        if own_process and args.command == "run":
            # Its evaluators are closed and its server released: the interpreter's teardown (torch,
            # the MiniLM model a curator was still loading) only held the exit, 1-3 s on 2 cores.
            exit_promptly(exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # the CLI's one boundary: a known error is one line, never a traceback
        lines = None if _closed_pipe(exc) else _one_line_errors(exc)
        if lines is None:
            raise
        for line in lines:
            _out(f"kfoundry: {line}", sys.stderr)
        return 2


def _closed_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to a closed pipe (alone or grouped by a ``TaskGroup``)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_closed_pipe(inner) for inner in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _one_line_errors(exc: BaseException) -> list[str] | None:
    """The lines that report ``exc`` (an error of ours or of NATS, possibly grouped by a
    ``TaskGroup``), or None for anything else (a bug: its traceback is shown)."""
    import nats.errors
    import nats.js.errors
    import pydantic

    from gpu_runner.errors import DeviceUnavailable

    if isinstance(exc, BaseExceptionGroup):
        lines: list[str] = []
        for inner in exc.exceptions:
            more = _one_line_errors(inner)
            if more is None:
                return None
            lines += [line for line in more if line not in lines]
        return lines
    if isinstance(exc, KfError | DeviceUnavailable):
        return [str(exc)]
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or exc.title
        return [f"invalid {exc.title} {where}: {first.get('msg', '')} (got {first.get('input')!r})"]
    if isinstance(exc, nats.errors.Error | nats.js.errors.Error):
        return [f"NATS: {type(exc).__name__}: {exc}".rstrip(": ")]
    return None


if __name__ == "__main__":
    raise SystemExit(main())
