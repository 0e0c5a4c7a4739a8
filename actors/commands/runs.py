"""``kfoundry runs``: the runs a NATS server knows, and what an operator does to one.

    kfoundry runs [--dir DIR]       every run, newest first: state, task, device, age, evaluated, best
    kfoundry runs show RUN          one run's spec and outcome
    kfoundry runs stop RUN          ask a running run to stop (it writes its results as on Ctrl-C)
    kfoundry runs rm RUN            remove an ended run: its registry entry, stream and dead letters
    kfoundry runs report RUN        build a run's report and best_model.py again from its stream

``--dir DIR`` lists the run directories under DIR (``runs/<id>/report.json``) without a server.
The server's view comes from ``actors.commands.run_registry``. Exit status: 0 done; 1 a stop
that was not followed by the run's end in time; 2 a bad argument or a refused action (one
``kfoundry:`` line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pydantic

from actors.commands.run_registry import RunInfo, RunState, age_text, find_run, list_runs, remove_run, request_stop
from actors.runtime.bus import Bus
from actors.runtime.errors import ConfigError
from actors.runtime.process import add_nats_options, nats_url, positive_seconds, run_async
from actors.runtime.process import say as _out
from schemas import EvalResult

CPU_NOTE = "* timed on the CPU (Triton's interpreter): a correctness check, not a speedup"


def add_runs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kfoundry runs`` and its subcommands ``show``, ``stop`` and ``rm``."""
    p = sub.add_parser("runs", help="list the runs a NATS server knows; show, stop or remove one")
    p.add_argument("--dir", type=Path, help="list the run directories under DIR instead (no server needed)")
    shared = _add_shared(p)
    p.set_defaults(func=cmd_runs)
    rsub = p.add_subparsers(dest="runs_cmd", metavar="{show,stop,rm,report}")
    show = rsub.add_parser("show", help="one run's spec and outcome")
    show.add_argument("run_id", metavar="RUN")
    stop = rsub.add_parser("stop", help="ask a running run to stop; it writes its results")
    stop.add_argument("run_id", metavar="RUN")
    stop.add_argument("--reason", help="why, recorded with the request")
    stop.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="wait this long for the run to end (default 60)",
    )
    stop.add_argument("--no-wait", action="store_true", help="return once the request is stored")
    rm = rsub.add_parser("rm", help="remove an ended run: its registry entry, stream and dead letters")
    rm.add_argument("run_id", metavar="RUN")
    rm.add_argument("--force", action="store_true", help="also a run with no end recorded and no controller")
    report = rsub.add_parser(
        "report", help="build an ended run's report.json, plots and best_model.py again from its stream"
    )
    report.add_argument("run_id", metavar="RUN")
    report.add_argument("--out", type=Path, help="the folder to write (default runs/RUN; never one with a report.json)")
    for child in (show, stop, rm, report):
        _add_shared(child, inherit=shared)


def _add_shared(p: argparse.ArgumentParser, inherit: Sequence[str] = ()) -> list[str]:
    """``--json`` and the NATS options. On a subcommand (``inherit``: their destinations) they
    default to nothing, so ``kfoundry runs --nats URL show RUN`` keeps the URL given before it."""
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_nats_options(p)
    dests = ["json", "nats", "connect_timeout"]
    for action in p._actions:
        if action.dest in inherit:
            action.default = argparse.SUPPRESS
    return dests


def cmd_runs(args: argparse.Namespace) -> int:
    if args.dir is not None:
        if args.runs_cmd is not None:
            raise ConfigError(f"--dir: lists run directories; `kfoundry runs {args.runs_cmd}` asks a NATS server")
        return _list_dirs(args.dir, as_json=args.json)
    action = {None: _list, "show": _show, "stop": _stop, "rm": _rm, "report": _report}[args.runs_cmd]

    async def main(stop: asyncio.Event) -> int:
        with nats_url(args.nats) as url:
            bus = await Bus.connect(
                url, name="kfoundry-runs", actor_id="kfoundry-runs", connect_timeout=args.connect_timeout, stop=stop
            )
            work = asyncio.ensure_future(action(bus, url, args))
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if not work.done():  # Ctrl-C: a stop's wait ends (its request stays stored)
                    work.cancel()
                    await asyncio.wait([work])
                await bus.close()
            return 130 if work.cancelled() else work.result()

    return run_async(main)


# -- list --------------------------------------------------------------------------------------


async def _list(bus: Bus, url: str, args: argparse.Namespace) -> int:
    runs = await list_runs(bus)
    if args.json:
        _out(json.dumps([_as_json(r) for r in runs], indent=2))
        return 0
    _out(f"{len(runs)} run(s) on {url}")
    now = time.time()
    rows = [
        [
            r.run_id,
            r.state_text(),
            r.spec.task.name if r.spec else "?",
            r.spec.device.value if r.spec else "?",
            age_text(now - r.created_at) if r.created_at else "?",
            _evaluated(r),
            _best(r.best, r.on_cpu),
        ]
        for r in runs
    ]
    _table(["RUN", "STATE", "TASK", "DEVICE", "AGE", "EVALUATED", "BEST"], rows)
    if any(r.on_cpu and r.best for r in runs):
        _out(CPU_NOTE)
    return 0


def _evaluated(run: RunInfo) -> str:
    budget = run.spec.budget.candidates if run.spec is not None and run.end is None else None
    return f"{run.evaluated}/{budget}" if budget else str(run.evaluated)


def _best(best: float | None, on_cpu: bool) -> str:
    return "-" if best is None else f"{best:.3g}x" + ("*" if on_cpu else "")


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        _out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _as_json(run: RunInfo) -> dict[str, object]:
    return {
        "run_id": run.run_id,
        "state": run.state.value,
        "state_text": run.state_text(),
        "task": run.spec.task.name if run.spec else None,
        "task_id": run.spec.task.task_id if run.spec else None,
        "device": run.spec.device.value if run.spec else None,
        "created_at": run.created_at,
        "ended_at": run.end.at if run.end else None,
        "end_reason": run.end.reason.value if run.end else None,
        "evaluated": run.evaluated,
        "issued": run.issued,
        "cancelled": len(run.end.cancelled) if run.end else None,
        "best_fitness": run.best,
        "best_candidate_id": run.end.best_candidate_id if run.end else None,
        "stop_request": run.stop.model_dump(mode="json") if run.stop else None,
        "messages": run.messages,
        "readers": list(run.readers),
    }


# -- show --------------------------------------------------------------------------------------


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


async def _show(bus: Bus, url: str, args: argparse.Namespace) -> int:
    run = await find_run(bus, args.run_id)
    if args.json:
        _out(json.dumps(_as_json(run) | {"spec": run.spec.model_dump(mode="json") if run.spec else None}, indent=2))
        return 0
    spec, end = run.spec, run.end
    _out(f"run {run.run_id}: {run.state_text()}")
    if spec is None:
        _out("  spec      " + ("unreadable by this version" if run.registered else "none registered"))
    else:
        created = f"{_when(spec.created_at)} ({age_text(time.time() - spec.created_at)} ago)"
        if end is not None:
            created += f"; ended {_when(end.at)} after {age_text(end.at - spec.created_at)}"
        budget = spec.budget
        limits = [
            f"{budget.wall_s:g} s" if budget.wall_s else "",
            f"{budget.candidates} candidates" if budget.candidates else "",
            f"{budget.tokens} tokens" if budget.tokens else "",
        ]
        _out(f"  task      {spec.task.name} ({spec.task.task_id})")
        _out(f"  created   {created}")
        _out(
            f"  setup     {spec.device.value}, {spec.islands} island(s) x {spec.inflight_per_island} in flight, "
            f"experts {', '.join(e.name for e in spec.experts)}, {spec.language.value}, precision {spec.precision}"
        )
        _out(f"  budget    {', '.join(x for x in limits if x)}; stop at {spec.target_sol_fraction:g} of speed-of-light")
        if spec.ablations.active():
            _out(f"  ablations {', '.join(spec.ablations.active())}")
    issued = f" of {run.issued} issued" if run.issued is not None else ""
    cancelled = f"; {len(end.cancelled)} cancelled in flight" if end is not None and end.cancelled else ""
    _out(f"  evaluated {run.evaluated}{issued}{cancelled}")
    if run.best is not None:
        best_id = f" ({end.best_candidate_id})" if end is not None and end.best_candidate_id else ""
        note = f"; {CPU_NOTE.removeprefix('* ')}" if run.on_cpu else ""
        _out(f"  best      {run.best:.3f}x over eager{best_id}{note}")
    if run.stop is not None:
        _out(f"  stop      {run.stop.sentence().removeprefix('stop ')} at {_when(run.stop.at)}")
    stream = "none" if run.messages is None else f"{run.messages} message(s)"
    readers = f"; read now by {', '.join(run.readers)}" if run.readers else ""
    _out(f"  stream    {stream}{readers}")
    return 0


# -- stop and rm -------------------------------------------------------------------------------


async def _stop(bus: Bus, url: str, args: argparse.Namespace) -> int:
    run = await find_run(bus, args.run_id)
    if run.state is RunState.ENDED:
        _out(f"run {run.run_id} has already ended: {run.state_text()}")
        return 0
    if run.state is RunState.EXPIRED:
        raise ConfigError(
            f"run {run.run_id} has no stream left (expired): nothing to stop; `kfoundry runs rm {run.run_id}` "
            "removes its registry entry"
        )
    running = run.state is RunState.RUNNING
    timeout = None if args.no_wait or not running else args.timeout
    end = await request_stop(bus, run.run_id, reason=args.reason, timeout=timeout)
    if not running:
        _out(
            f"kfoundry: run {run.run_id} has no end recorded and no controller reading its stream: the stop request "
            f"is stored, but nothing acts on it now; `kfoundry runs rm {run.run_id} --force` removes the run",
            sys.stderr,
        )
        return 1
    if timeout is None:
        _out(f"asked run {run.run_id} to stop")
        return 0
    if end is None:
        _out(f"kfoundry: run {run.run_id} has not ended within {timeout:g} s of the stop request", sys.stderr)
        return 1
    cancelled = f", {len(end.cancelled)} cancelled in flight" if end.cancelled else ""
    _out(
        f"run {run.run_id} ended ({end.reason}) after {end.evaluated} evaluated{cancelled}; "
        "its controller writes its results"
    )
    return 0


async def _rm(bus: Bus, url: str, args: argparse.Namespace) -> int:
    run = await find_run(bus, args.run_id)
    rid = run.run_id
    if run.state is RunState.RUNNING:
        raise ConfigError(f"run {rid} is running: stop it first (`kfoundry runs stop {rid}`)")
    if run.state is RunState.ABANDONED and not args.force:
        raise ConfigError(
            f"run {rid} has no end recorded and no controller reading its stream (its `kfoundry run` is gone?); "
            f"`kfoundry runs rm {rid} --force` removes it"
        )
    removed = await remove_run(bus, run)
    _out(
        f"removed run {rid}: its registry entry, {removed.messages} stream message(s) and {removed.dead_letters} "
        "dead letter(s) (its run directory, if any, stays)"
    )
    return 0


# -- report ------------------------------------------------------------------------------------


async def _report(bus: Bus, url: str, args: argparse.Namespace) -> int:
    """The run's results as its controller writes them at its end, from what its stream holds: a
    lost or deleted run directory, or one written on another machine, comes back."""
    from actors.commands.run_stream import replay, write_results
    from actors.runtime.logs import configure_logging

    configure_logging(level="warning")  # on stderr: stdout is the command's one line
    run = await find_run(bus, args.run_id)
    rid = run.run_id
    if run.state is RunState.RUNNING:
        raise ConfigError(f"run {rid} is running: its controller writes its report when it ends")
    if run.messages is None:
        raise ConfigError(f"run {rid} has no stream left (expired): nothing to build a report from")
    if run.spec is None:
        raise ConfigError(f"run {rid} has no spec this version can read: no report can be built")
    out = args.out if args.out is not None else Path("runs") / rid
    if (out / "report.json").exists():  # results are never written over
        raise ConfigError(f"{out} holds a report.json already; choose another --out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: not a directory")
    messages = await replay(bus, rid)
    best = None
    best_id = run.end.best_candidate_id if run.end is not None else None
    if best_id is not None:
        results = [m for m in messages if isinstance(m, EvalResult) and m.candidate_id == best_id]
        best = results[-1] if results else None
        if best is None:
            raise ConfigError(f"run {rid}: its best candidate {best_id} has no result left in its stream")
    out.mkdir(parents=True, exist_ok=True)
    report = await write_results(bus, run.spec, best, out, messages)
    written = "report.json, plots" + (" and best_model.py" if best is not None else " (no best candidate)")
    state = "" if run.end is not None else " (no end recorded: the report covers what its stream holds)"
    _out(f"run {rid}: {written} written to {out}; {report.evaluated} evaluated{state}")
    return 0


# -- run directories -----------------------------------------------------------------------------


class _Best(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)

    fitness: float


class _Report(pydantic.BaseModel):
    """What the listing reads of a ``report.json`` (``actors.report.model.RunReport``)."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)

    run_id: str
    task_name: str | None = None
    started_at: float | None = None
    end_reason: str | None = None
    evaluated: int = 0
    verdict: str | None = None
    best: _Best | None = None


def _list_dirs(root: Path, *, as_json: bool) -> int:
    if not root.is_dir():
        raise ConfigError(f"--dir {root}: not a directory")
    found: list[tuple[float, list[str], dict[str, object]]] = []
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        report_path, log_path = run_dir / "report.json", run_dir / "run.log"
        if report_path.is_file():
            try:
                report = _Report.model_validate_json(report_path.read_bytes())
            except (OSError, pydantic.ValidationError) as exc:
                row = [run_dir.name, "unreadable report", "?", "?", "-", "-", str(run_dir)]
                found.append((report_path.stat().st_mtime, row, {"dir": str(run_dir), "error": str(exc)[:200]}))
                continue
            when = report.started_at or report_path.stat().st_mtime
            on_cpu = report.verdict == "not_timed_on_gpu"
            best = report.best.fitness if report.best else None
            state = f"ended ({report.end_reason})" if report.end_reason else "ended"
            row = [report.run_id, state, report.task_name or "?", age_text(time.time() - when)]
            row += [str(report.evaluated), _best(best, on_cpu), str(run_dir)]
            found.append((when, row, report.model_dump(mode="json") | {"dir": str(run_dir)}))
        elif log_path.is_file():  # running, stopped at once, or refused before its report
            when = log_path.stat().st_mtime
            row = [run_dir.name, "no report", "?", age_text(time.time() - when), "-", "-", str(run_dir)]
            found.append((when, row, {"run_id": run_dir.name, "dir": str(run_dir), "report": None}))
    found.sort(key=lambda item: item[0], reverse=True)
    if as_json:
        _out(json.dumps([item[2] for item in found], indent=2))
        return 0
    _out(f"{len(found)} run directory(ies) under {root}")
    _table(["RUN", "STATE", "TASK", "AGE", "EVALUATED", "BEST", "DIR"], [item[1] for item in found])
    if any(row[5].endswith("*") for _, row, _ in found):
        _out(CPU_NOTE)
    return 0
