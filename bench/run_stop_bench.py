"""Where a run's wall time goes around its budget: ``kfoundry run --seconds S`` timed as its user
times it, from the process's start to its exit, with the steps of its end in between.

Prints, relative to the budget (the process's start plus ``--seconds``, which is also the run's
deadline since the budget counts from the process's start): when the run's clock started, when
the run noticed its end, when each kind of actor began draining and had stopped (the slowest of
its kind), when the results were written, and when the process exited. Read from the run's
``run.log`` (JSON lines with timestamps) and ``report.json``. With ``--runs N`` it repeats and ends
with one line per run: the exit against the budget, and the end's share after ``run ending``.

Run: ``python -m bench.run_stop_bench [--seconds 12] [--islands 2] [--runner noop|gpu]
[--device cpu|cuda] [--task FILE] [--runs 3]``. The default is the quickstart task with no-op
evaluators; ``--runner gpu`` times the real evaluator (its worker processes close at the end).
The machine is shared: run it twice. Results: bench/results/budget_cpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

TASK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
MILESTONES = {
    "run ending": "the run noticed its end",
    "run ended, writing results": "writing results",
    "results written": "results written",
    "actors did not stop in time: cancelled": "actors still stopping: cancelled",
}


def _at(line: dict[str, object]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def timeline(run_dir: Path, budget_at: float, exited_at: float) -> list[tuple[float, str]]:
    """(seconds after ``budget_at``, what happened), in time order."""
    report = json.loads((run_dir / "report.json").read_text())
    draining: dict[str, float] = {}
    stopped: dict[str, float] = {}
    rows: list[tuple[float, str]] = [(float(report["started_at"]) - budget_at, "the run's clock started")]
    for text in (run_dir / "run.log").read_text().splitlines():
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        event = str(line.get("event", ""))
        kind = str(line.get("actor") or "").split("-")[0]
        at = _at(line) - budget_at
        if event in MILESTONES:
            rows.append((at, MILESTONES[event]))
        elif event.startswith("actor draining") and at > -5.0:
            draining[kind] = min(draining.get(kind, at), at)
        elif event == "actor stopped" and at > -5.0:
            stopped[kind] = max(stopped.get(kind, at), at)
    rows += [(at, f"{kind} began draining") for kind, at in draining.items()]
    rows += [(at, f"{kind} stopped (slowest of its kind)") for kind, at in stopped.items()]
    rows.append((exited_at - budget_at, f"process exited ({report['evaluated']} evaluated)"))
    return sorted(rows)


def one_run(args: argparse.Namespace, tmp: Path, n: int) -> tuple[float, float | None]:
    """One timed run; prints its timeline; (exit after the budget, exit after ``run ending``)."""
    run_dir = tmp / f"run{n}"
    env = {**os.environ, "KFOUNDRY_HOME": str(tmp / "home")}
    command = [
        sys.executable, "-m", "actors.cli", "run", str(args.task), "--device", args.device,
        "--seconds", f"{args.seconds:g}", "--candidates", "1000000", "--islands", str(args.islands),
        "--runner", args.runner, "--run-dir", str(run_dir), "--quiet",
    ]  # fmt: skip
    started = time.time()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    exited = time.time()
    rows = timeline(run_dir, started + args.seconds, exited)
    out = sys.stdout
    out.write(f"\nrun {n + 1}, load {os.getloadavg()[0]:.1f}\n{'after the budget (s)':>22}  event\n")
    for at, what in rows:
        out.write(f"{at:>+22.2f}  {what}\n")
    ending = next((at for at, what in rows if what == MILESTONES["run ending"]), None)
    over = exited - started - args.seconds
    return over, None if ending is None else over - ending


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=12.0, help="the run's wall-clock budget")
    parser.add_argument("--islands", type=int, default=2)
    parser.add_argument("--runner", choices=["noop", "gpu"], default="noop", help="gpu: the real evaluator")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--task", type=Path, default=TASK)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            results.append(one_run(args, Path(tmp), n))
    out = sys.stdout
    out.write(f"\n{'run':>4}  {'exit vs budget (s)':>18}  {'run ending to exit (s)':>22}\n")
    for n, (over, end) in enumerate(results, 1):
        out.write(f"{n:>4}  {over:>+18.2f}  {'-' if end is None else f'{end:.2f}':>22}\n")
    overs = [over for over, _ in results]
    out.write(f"median exit vs budget {statistics.median(overs):+.2f} s, most {max(overs):+.2f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
