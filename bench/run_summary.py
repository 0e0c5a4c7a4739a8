"""Where a run's time went, from its folder: one row per run folder, for comparing runs side by side.

    python bench/run_summary.py RUN_DIR [RUN_DIR ...]

Reads ``report.json`` (verdicts, per-GPU usage) and ``run.log`` (the evaluator's start-up phases,
its fork servers, its memory plan and its spares' preparation) and prints a table:

* ``eval``: candidates evaluated; ``cand/s`` and ``busy``: the evaluator's rate and the share of
  its window the GPU was held for candidates (``report.json``'s ``gpus``);
* ``held/c`` and ``meas/c``: seconds the GPU was held per candidate, and of that the measurement
  (trial forwards and timing); ``comp/c``: seconds of a compile stage that compiled;
* ``start``: seconds from the run's first log line to ``evaluator_started``, then the evaluator's
  own phases (``process``: its interpreter's start and imports; ``probe``: device, isolation and CUDA
  fit; ``pools``), the later of the two fork servers ready, and the first verdict;
* ``spare``: mean seconds a spare took to prepare, with its slowest phases;
* ``first ok`` and ``best``: the first correct candidate's time and the best speedup over eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any


def _events(path: Path) -> list[tuple[float, dict[str, Any]]]:
    """(seconds since the first event, the event) for every JSON line of a run's log."""
    out: list[tuple[float, dict[str, Any]]] = []
    t0: float | None = None
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
            stamp = datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError):
            continue
        t0 = stamp if t0 is None else t0
        out.append((stamp - t0, event))
    return out


def _first(events: list[tuple[float, dict[str, Any]]], name: str, **match: Any) -> tuple[float, dict[str, Any]] | None:
    for t, e in events:
        if e.get("event") == name and all(e.get(k) == v for k, v in match.items()):
            return t, e
    return None


def summarise(run_dir: Path) -> dict[str, Any]:
    """One run folder's row (missing parts are ``None``)."""
    # ``kfoundry run --run-dir X/run``: the folder above names it
    row: dict[str, Any] = {"run": run_dir.name if run_dir.name != "run" else f"{run_dir.parent.name}/run"}
    try:
        report = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError):
        report = {}
    row["evaluated"] = report.get("evaluated")
    gpus = report.get("gpus") or []
    if gpus:
        g = gpus[0]
        row.update(
            rate=g.get("candidates_per_s"),
            busy=g.get("busy_fraction"),
            held=g.get("held_s_mean"),
            measured=g.get("measured_s_mean"),
            compiled=g.get("compile_s_mean"),
        )
    best = report.get("best") or {}
    row["best"] = best.get("speedup_vs_eager")
    row["first_ok"] = report.get("first_correct_s")
    events = _events(run_dir / "run.log")
    started = _first(events, "evaluator_started")
    if started is not None:
        row["start"] = started[0]
        row["phases"] = started[1].get("phases") or {}
    ready = [t for t, e in events if e.get("event") == "fork_server_ready"]
    row["forks"] = max(ready) if ready else None
    verdict = _first(events, "evaluated")
    row["first_verdict"] = verdict[0] if verdict else None
    spares = [e for _, e in events if e.get("event") == "spare_prepared"]
    if spares:
        row["spare"] = statistics.mean(float(e.get("startup_s") or 0) + float(e.get("prepare_s") or 0) for e in spares)
        phases: dict[str, list[float]] = {}
        for e in spares:
            for k, v in (e.get("phases") or {}).items():
                phases.setdefault(k, []).append(float(v))
        means = sorted(((statistics.mean(v), k) for k, v in phases.items()), reverse=True)[:3]
        row["spare_phases"] = " ".join(f"{k.removesuffix('_s')} {m:.2f}" for m, k in means)
    return row


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| run | eval | cand/s | busy | held/c | meas/c | comp/c | start (process, probe, pools) | forks ready "
        "| first verdict | spare (slowest phases) | first ok | best |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        ph = r.get("phases") or {}
        start = (
            f"{r['start']:.1f} ({_num(ph.get('process_s'), '.1f')}, {_num(ph.get('probe_s'), '.1f')}, "
            f"{_num(ph.get('pools_s'), '.1f')})"
            if r.get("start") is not None
            else "-"
        )
        spare = f"{r['spare']:.2f} ({r.get('spare_phases', '')})" if r.get("spare") is not None else "-"
        lines.append(
            f"| {r['run']} | {_num(r.get('evaluated'), 'd')} | {_num(r.get('rate'), '.3f')} | "
            f"{_num(r.get('busy'), '.0%')} | {_num(r.get('held'), '.2f')} | {_num(r.get('measured'), '.2f')} | "
            f"{_num(r.get('compiled'), '.2f')} | "
            f"{start} | {_num(r.get('forks'), '.1f')} | {_num(r.get('first_verdict'), '.1f')} | {spare} | "
            f"{_num(r.get('first_ok'), '.1f')} | {_num(r.get('best'), '.3f')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="+", help="run folders (--run-dir, or bench runs/*)")
    args = p.parse_args(argv)
    missing = [d for d in args.run_dirs if not d.is_dir()]
    if missing:
        print(f"not a folder: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    print("\n".join(table([summarise(d) for d in args.run_dirs])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
